package repocheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// requirementsDoc is the table of requirement ids: the rule, the code and
// the tests of each.
const requirementsDoc = "docs/requirements.md"

// requirementsHeader is the header row the table must have.
const requirementsHeader = "| id | rule | code | tests |"

var (
	// requirementID is the form of a requirement id: a letter of the spec's
	// sections and a number of one or two digits (L5, G10). P (performance)
	// ids are measured by benchmarks; a row may name one (P8), but a comment
	// citing one needs none, so P is not among citedRequirement's letters.
	requirementID = regexp.MustCompile(`^[DGKFLOSMNERXTHP][0-9]{1,2}$`)
	// citedRequirement finds ids in a comment, and ranges such as "M1-M4"
	// (every id between the two ends is cited).
	citedRequirement = regexp.MustCompile(`\b([DGKFLOSMNERXTH])([0-9]{1,2})\b(?:[-–]([DGKFLOSMNERXTH])([0-9]{1,2})\b)?`)
	backticked       = regexp.MustCompile("`([^`]+)`")
	testDecl         = regexp.MustCompile(`(?m)^func (Test\w*)\(`)
)

// requirementRow is one row of the table.
type requirementRow struct {
	line  int
	id    string
	rule  string
	code  []string
	tests []string
}

// TestRequirementsTable keeps docs/requirements.md true to the code: every
// requirement id cited in a Go or SQL comment has a row, every row's id is
// well formed and unique, the files it names exist, and every test it names
// is declared where the row says.
func TestRequirementsTable(t *testing.T) {
	rows := readRequirementsTable(t)
	byID := map[string]requirementRow{}
	for _, r := range rows {
		if !requirementID.MatchString(r.id) {
			t.Errorf("%s:%d: id %q is not a requirement id (a letter of D G K F L O S M N E R X T H P and one or two digits, such as L5 or G10): fix the id", requirementsDoc, r.line, r.id)
			continue
		}
		if prev, dup := byID[r.id]; dup {
			t.Errorf("%s:%d: %s already has a row at line %d: merge the two rows into one", requirementsDoc, r.line, r.id, prev.line)
			continue
		}
		byID[r.id] = r
	}

	cited, tests := scanRepository(t)
	for _, id := range slices.Sorted(maps.Keys(cited)) {
		if _, ok := byID[id]; !ok {
			where := cited[id]
			if len(where) > 3 {
				where = append(where[:3:3], fmt.Sprintf("and %d more", len(cited[id])-3))
			}
			t.Errorf("%s has no row for %s, cited in a comment at %s: add the row \"| %s | <the rule in a sentence> | <files and functions> | <package> `TestName` |\"",
				requirementsDoc, id, strings.Join(where, ", "), id)
		}
	}

	for _, r := range rows {
		if r.rule == "" {
			t.Errorf("%s:%d: %s has no rule: say in one sentence what the code guarantees", requirementsDoc, r.line, r.id)
		}
		if len(r.code) == 0 {
			t.Errorf("%s:%d: %s names no code: add the file and function in backticks, such as `internal/idem/store.go` `Store.Execute`", requirementsDoc, r.line, r.id)
		}
		for _, c := range r.code {
			if looksLikePath(c) {
				if _, err := os.Stat(filepath.FromSlash(c)); err != nil {
					t.Errorf("%s:%d: %s names `%s` in its code column, which does not exist: fix the path", requirementsDoc, r.line, r.id, c)
				}
			}
		}
		checkRowTests(t, r, tests)
	}
}

// checkRowTests checks the tests column of r: each backticked test name
// follows the package directory or test file that declares it.
func checkRowTests(t *testing.T, r requirementRow, tests map[string][]string) {
	t.Helper()
	if len(r.tests) == 0 {
		t.Errorf("%s:%d: %s names no test: add the package and a test that fails when the rule breaks, such as `internal/idem` `TestExecuteRunsOnceThenReplays`", requirementsDoc, r.line, r.id)
		return
	}
	where := "" // the package directory or test file the next names are in
	for _, tok := range r.tests {
		if !strings.HasPrefix(tok, "Test") {
			info, err := os.Stat(filepath.FromSlash(tok))
			switch {
			case err != nil:
				t.Errorf("%s:%d: %s: `%s` in the tests column is neither a test name nor an existing package directory or test file: fix it", requirementsDoc, r.line, r.id, tok)
			case !info.IsDir() && !strings.HasSuffix(tok, "_test.go"):
				t.Errorf("%s:%d: %s: `%s` in the tests column is not a package directory or a _test.go file: name the package instead", requirementsDoc, r.line, r.id, tok)
			}
			where = path.Clean(tok)
			continue
		}
		name, _, _ := strings.Cut(tok, "/") // a subtest is not checked
		files := tests[name]
		if len(files) == 0 {
			t.Errorf("%s:%d: %s names `%s`, but no _test.go file declares func %s(: fix the name or remove it from the row", requirementsDoc, r.line, r.id, tok, name)
			continue
		}
		if where == "" {
			t.Errorf("%s:%d: %s names `%s` without its package: put the package directory before it, such as `%s` `%s`", requirementsDoc, r.line, r.id, tok, path.Dir(files[0]), tok)
			continue
		}
		if !slices.ContainsFunc(files, func(f string) bool { return f == where || path.Dir(f) == where }) {
			t.Errorf("%s:%d: %s names `%s` under `%s`, but it is declared in %s: fix the package", requirementsDoc, r.line, r.id, tok, where, strings.Join(files, ", "))
		}
	}
}

// readRequirementsTable parses the one table of requirementsDoc.
func readRequirementsTable(t *testing.T) []requirementRow {
	t.Helper()
	data, err := os.ReadFile(requirementsDoc)
	if err != nil {
		t.Fatalf("%v: the requirements table is missing", err)
	}
	lines := strings.Split(string(data), "\n")
	start := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "|") })
	if start < 0 {
		t.Fatalf("%s has no table: add one with the header %q", requirementsDoc, requirementsHeader)
	}
	if got := strings.Join(strings.Fields(lines[start]), " "); got != requirementsHeader {
		t.Fatalf("%s:%d: the table's header is %q, want %q", requirementsDoc, start+1, lines[start], requirementsHeader)
	}
	var rows []requirementRow
	i := start + 2 // past the header and the separator
	for ; i < len(lines) && strings.HasPrefix(lines[i], "|"); i++ {
		cells := strings.Split(strings.Trim(strings.TrimSpace(lines[i]), "|"), "|")
		if len(cells) != 4 {
			t.Errorf("%s:%d: %d cells, want 4 (id, rule, code, tests; a cell must not contain |)", requirementsDoc, i+1, len(cells))
			continue
		}
		rows = append(rows, requirementRow{
			line:  i + 1,
			id:    strings.Trim(strings.TrimSpace(cells[0]), "*"),
			rule:  strings.TrimSpace(cells[1]),
			code:  backtickedIn(cells[2]),
			tests: backtickedIn(cells[3]),
		})
	}
	for ; i < len(lines); i++ {
		if strings.HasPrefix(lines[i], "|") {
			t.Errorf("%s:%d: a second table: keep every requirement in the one table", requirementsDoc, i+1)
			break
		}
	}
	if len(rows) == 0 {
		t.Fatalf("%s: the table has no rows", requirementsDoc)
	}
	return rows
}

// scanRepository walks the repository's Go and SQL files, generated Go
// files left out. It returns the requirement ids cited in their comments,
// each with the places citing it, and the files declaring each test
// function.
func scanRepository(t *testing.T) (cited map[string][]string, tests map[string][]string) {
	t.Helper()
	cited, tests = map[string][]string{}, map[string][]string{}
	cite := func(file string, line int, comment string) {
		for _, m := range citedRequirement.FindAllStringSubmatch(comment, -1) {
			from, _ := strconv.Atoi(m[2]) // one or two digits: cannot fail
			to := from
			if end, _ := strconv.Atoi(m[4]); m[3] == m[1] && end > from {
				to = end // a range: M1-M4
			} else if m[3] != "" {
				id := m[3] + m[4]
				cited[id] = append(cited[id], fmt.Sprintf("%s:%d", file, line))
			}
			for d := from; d <= to; d++ {
				id := m[1] + strconv.Itoa(d)
				cited[id] = append(cited[id], fmt.Sprintf("%s:%d", file, line))
			}
		}
	}
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != "." && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		slashed := filepath.ToSlash(p)
		switch {
		case strings.HasSuffix(name, ".sql"):
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for n, line := range strings.Split(string(data), "\n") {
				if _, comment, ok := strings.Cut(line, "--"); ok {
					cite(slashed, n+1, comment)
				}
			}
		case strings.HasSuffix(name, ".go"):
			f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
			if err != nil {
				return err
			}
			if ast.IsGenerated(f) {
				return nil
			}
			if strings.HasSuffix(name, "_test.go") {
				data, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				for _, m := range testDecl.FindAllStringSubmatch(string(data), -1) {
					tests[m[1]] = append(tests[m[1]], slashed)
				}
			}
			if slashed == "internal/tooling/repocheck/requirements_test.go" {
				return nil // its comments explain the format; they cite nothing
			}
			for _, g := range f.Comments {
				for _, c := range g.List {
					cite(slashed, fset.Position(c.Pos()).Line, c.Text)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(cited) == 0 || len(tests) == 0 {
		t.Fatalf("found %d cited ids and %d tests: is the test running at the repository's root?", len(cited), len(tests))
	}
	return cited, tests
}

func backtickedIn(cell string) []string {
	var out []string
	for _, m := range backticked.FindAllStringSubmatch(cell, -1) {
		out = append(out, strings.TrimSpace(m[1]))
	}
	return out
}

// looksLikePath tells a file or directory of the repository from a function
// or constraint name in the code column.
func looksLikePath(s string) bool {
	if strings.ContainsAny(s, " ()") || strings.HasPrefix(s, "/") {
		return false
	}
	return strings.Contains(s, "/") || slices.Contains([]string{".go", ".sql", ".yaml", ".md"}, path.Ext(s))
}
