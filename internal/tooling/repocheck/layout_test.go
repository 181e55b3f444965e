package repocheck

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// layoutDoc holds the Layout block, a line per package directory, in
// groups.
const layoutDoc = "docs/layout.md"

// makeTargetsDoc holds the table of make targets.
const makeTargetsDoc = "docs/development.md"

// The groups of the Layout block that the import rules name, each by the
// words its heading starts with. Which package is in which group is the
// doc's to say: the test reads it from there.
const (
	groupPattern = "# The pattern"
	groupShared  = "# Shared by the domain and the edge"
	groupDomain  = "# The example domain"
	groupEdge    = "# The HTTP edge"
	groupTools   = "# Developer tools"
	groupTooling = "# Tooling"
)

// groupNames are the groups as the failures name them.
var groupNames = map[string]string{
	groupPattern: "the pattern",
	groupShared:  "the shared packages",
	groupDomain:  "the domain",
	groupEdge:    "the edge",
	groupTools:   "the developer tools",
	groupTooling: "the tooling",
}

// layered are the groups whose imports point one way: a package may import
// a package of its own group or of a group before it in this list, never
// of one after it. The pattern imports nothing of the domain, and the
// domain nothing of the edge.
var layered = []string{groupPattern, groupShared, groupDomain, groupEdge}

// toolingExceptions are the files outside the tooling and the developer
// tools allowed to import a package of the tooling, each with the packages
// it may import. Only api dev (make run) does, through devmode: it starts
// a private PostgreSQL, an embedded NATS server and the processor
// simulator, so the api binary links them, unless built with -tags nodev
// as the image is (cmd/api TestProductionBuildLeavesOutDevelopmentMode).
var toolingExceptions = map[string][]string{
	"cmd/api/dev.go": {"internal/tooling/devmode"},
}

// layoutGroup is a group of the Layout block: its heading and the package
// directories listed under it.
type layoutGroup struct {
	heading string
	dirs    []string
}

// readLayout returns the groups of the Layout block of layoutDoc, in order.
func readLayout(t *testing.T) []layoutGroup {
	t.Helper()
	doc, err := os.ReadFile(layoutDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "## Layout\n\n```\n")
	if !ok {
		t.Fatalf("%s has no Layout block (\"## Layout\" and a fenced block)", layoutDoc)
	}
	block, _, _ := strings.Cut(after, "```")
	dirLine := regexp.MustCompile(`^([a-z][a-z0-9/]*)/ `)
	var groups []layoutGroup
	for line := range strings.Lines(block) {
		if strings.HasPrefix(line, "# ") {
			groups = append(groups, layoutGroup{heading: strings.TrimSpace(line)})
			continue
		}
		m := dirLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if len(groups) == 0 {
			t.Fatalf("%s: %s/ is listed before the first group's heading (a line starting with \"# \")", layoutDoc, m[1])
		}
		g := &groups[len(groups)-1]
		g.dirs = append(g.dirs, m[1])
	}
	return groups
}

// groupOf returns, for each package directory of the Layout block, the
// heading of its group.
func groupOf(groups []layoutGroup) map[string]string {
	of := map[string]string{}
	for _, g := range groups {
		for _, d := range g.dirs {
			of[d] = g.heading
		}
	}
	return of
}

// findGroup returns the heading of the one group whose heading starts with
// prefix.
func findGroup(t *testing.T, groups []layoutGroup, prefix string) string {
	t.Helper()
	var found []string
	for _, g := range groups {
		if strings.HasPrefix(g.heading, prefix) {
			found = append(found, g.heading)
		}
	}
	if len(found) != 1 {
		t.Fatalf("the Layout of %s has %d groups whose heading starts with %q, want one: the import rules of layout_test.go name it", layoutDoc, len(found), prefix)
	}
	return found[0]
}

// goFile is a non-test Go file of the module and the module's packages it
// imports, as directories relative to the root.
type goFile struct {
	path    string // slash-separated, from the root
	dir     string
	imports []string
}

// moduleFiles parses the imports of every non-test Go file of the module
// (and of every test file too when tests), in every build configuration (a
// file behind a build tag ships in some binary too), and keeps the imports
// of the module's own packages.
func moduleFiles(t *testing.T, tests bool) []goFile {
	t.Helper()
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^module\s+(\S+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod has no module line")
	}
	module := string(m[1])
	var files []goFile
	fset := token.NewFileSet()
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || (!tests && strings.HasSuffix(path, "_test.go")) {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		gf := goFile{path: filepath.ToSlash(path), dir: filepath.ToSlash(filepath.Dir(path))}
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				return err
			}
			if rel, ok := strings.CutPrefix(p, module+"/"); ok {
				gf.imports = append(gf.imports, rel)
			}
		}
		files = append(files, gf)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 100 {
		t.Fatalf("found %d Go files: is the test running at the module's root?", len(files))
	}
	return files
}

// TestLayoutNamesEveryPackage: the Layout block of docs/layout.md has a
// line for every directory holding Go code, and names no directory that is
// gone, so a reader can find each package from it.
func TestLayoutNamesEveryPackage(t *testing.T) {
	listed := groupOf(readLayout(t))
	packages := map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && filepath.Dir(path) != "." {
			packages[filepath.ToSlash(filepath.Dir(path))] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir := range packages {
		if _, ok := listed[dir]; !ok {
			t.Errorf("the Layout of %s has no line for %s/", layoutDoc, dir)
		}
	}
	for dir := range listed {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("the Layout of %s names %s/, which does not exist", layoutDoc, dir)
		}
	}
}

// TestImportsFollowLayout holds the groups of docs/layout.md against the
// imports of every non-test Go file: the pattern imports nothing of the
// shared packages, the domain or the edge; the shared packages nothing of
// the domain or the edge; the domain nothing of the edge; and nothing
// outside the tooling and the developer tools imports the tooling, except
// api dev (toolingExceptions). The tooling group is exactly the packages
// under internal/tooling/, so where a package lives says whether a
// deployment runs it.
func TestImportsFollowLayout(t *testing.T) {
	groups := readLayout(t)
	of := groupOf(groups)
	name := map[string]string{} // heading -> the group's name in failures
	for prefix, n := range groupNames {
		name[findGroup(t, groups, prefix)] = n
	}
	rank := map[string]int{}
	for i, prefix := range layered {
		rank[findGroup(t, groups, prefix)] = i + 1
	}
	tooling := findGroup(t, groups, groupTooling)
	tools := findGroup(t, groups, groupTools)

	for dir, g := range of {
		if under := strings.HasPrefix(dir, "internal/tooling/"); under != (g == tooling) {
			t.Errorf("%s lists %s/ under %q: the tooling's group lists exactly the packages under internal/tooling/", layoutDoc, dir, g)
		}
	}

	excepted := map[string]bool{} // file + " " + import, used
	for _, f := range moduleFiles(t, false) {
		from, ok := of[f.dir]
		if !ok {
			continue // TestLayoutNamesEveryPackage reports it
		}
		for _, imp := range f.imports {
			to := of[imp]
			if rank[from] > 0 && rank[to] > rank[from] {
				t.Errorf("%s imports %s: %s may not import %s, a block below it in %s; move the code, or the package to another block", f.path, imp, name[from], name[to], layoutDoc)
			}
			if to == tooling && from != tooling && from != tools {
				if slices.Contains(toolingExceptions[f.path], imp) {
					excepted[f.path+" "+imp] = true
					continue
				}
				t.Errorf("%s imports %s: nothing a deployment runs may import the tooling; only the tooling, the developer tools and api dev (toolingExceptions) do", f.path, imp)
			}
		}
	}
	for file, imps := range toolingExceptions {
		for _, imp := range imps {
			if !excepted[file+" "+imp] {
				t.Errorf("toolingExceptions lets %s import %s, which it no longer does: remove the exception", file, imp)
			}
		}
	}
}

// processorDir holds the Processor interface; each directory below it is
// one adapter of it (as simproc, stripeproc).
const processorDir = "internal/processor"

// adapterOf returns the processor adapter a package directory belongs to,
// its first directory below processorDir, or "" for none.
func adapterOf(dir string) string {
	rest, ok := strings.CutPrefix(dir, processorDir+"/")
	if !ok {
		return ""
	}
	adapter, _, _ := strings.Cut(rest, "/")
	return adapter
}

// TestProcessorAdaptersStandAlone: a processor adapter imports no other
// adapter, in its code or its tests, and the interface package imports
// none, as river's driver adapters import only the driver interface. What
// two adapters share belongs in internal/processor, so one adapter can be
// changed, replaced or dropped without touching another.
func TestProcessorAdaptersStandAlone(t *testing.T) {
	adapters := map[string]bool{}
	for _, f := range moduleFiles(t, true) {
		from := adapterOf(f.dir)
		if from == "" && f.dir != processorDir {
			continue
		}
		adapters[from] = true
		for _, imp := range f.imports {
			if to := adapterOf(imp); to != "" && to != from {
				t.Errorf("%s imports %s: a processor adapter imports no other adapter, nor does %s any; move what both need into %s", f.path, imp, processorDir, processorDir)
			}
		}
	}
	delete(adapters, "") // the interface package
	if len(adapters) < 2 {
		t.Fatalf("found the processor adapters %v below %s, want at least two: is the test running at the module's root?", adapters, processorDir)
	}
}

// TestOnlyTestsImportTestkit: internal/tooling/testkit is for tests; a
// production file that imported it would ship test helpers in the binary,
// and a tool's would link them into a developer's command.
func TestOnlyTestsImportTestkit(t *testing.T) {
	const testkit = "internal/tooling/testkit"
	for _, f := range moduleFiles(t, false) {
		if f.dir != testkit && slices.Contains(f.imports, testkit) {
			t.Errorf("%s imports %s; only tests may", f.path, testkit)
		}
	}
}

// TestDocsNameEveryMakeTarget: the table of make targets in
// docs/development.md has a row for each target the Makefile documents (a
// "## " comment).
func TestDocsNameEveryMakeTarget(t *testing.T) {
	makefile, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(makeTargetsDoc)
	if err != nil {
		t.Fatal(err)
	}
	targets := regexp.MustCompile(`(?m)^([a-z][a-z-]*):.*## `).FindAllStringSubmatch(string(makefile), -1)
	if len(targets) == 0 {
		t.Fatal("no documented targets in the Makefile")
	}
	for _, m := range targets {
		if m[1] == "help" {
			continue
		}
		if !regexp.MustCompile("(?m)^\\| `make " + regexp.QuoteMeta(m[1]) + "[ `]").Match(doc) {
			t.Errorf("the table of make targets in %s has no row for make %s", makeTargetsDoc, m[1])
		}
	}
}
