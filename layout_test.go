package apispec

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// layoutDoc holds the Layout block, a line per package directory.
const layoutDoc = "docs/layout.md"

// makeTargetsDoc holds the table of make targets.
const makeTargetsDoc = "docs/development.md"

// TestLayoutNamesEveryPackage: the Layout block of docs/layout.md has a
// line for every directory holding Go code, and names no directory that is
// gone, so a reader can find each package from it.
func TestLayoutNamesEveryPackage(t *testing.T) {
	doc, err := os.ReadFile(layoutDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "## Layout\n\n```\n")
	if !ok {
		t.Fatalf("%s has no Layout block (\"## Layout\" and a fenced block)", layoutDoc)
	}
	block, _, _ := strings.Cut(after, "```")
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-z][a-z0-9/]*)/ `).FindAllStringSubmatch(block, -1) {
		listed[m[1]] = true
	}

	packages := map[string]bool{}
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
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
		if !listed[dir] {
			t.Errorf("the Layout of %s has no line for %s/", layoutDoc, dir)
		}
	}
	for dir := range listed {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("the Layout of %s names %s/, which does not exist", layoutDoc, dir)
		}
	}
}

// TestOnlyTestsImportTestkit: internal/tooling/testkit is for tests; a production
// file that imported it would ship test helpers in the binary.
func TestOnlyTestsImportTestkit(t *testing.T) {
	const testkit = `"github.com/idemref/payments/internal/tooling/testkit"`
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != "." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") ||
			strings.HasPrefix(filepath.ToSlash(path), "internal/tooling/testkit/") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			if imp.Path.Value == testkit {
				t.Errorf("%s imports internal/tooling/testkit; only tests may", path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
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
