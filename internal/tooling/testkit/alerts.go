package testkit

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"sigs.k8s.io/yaml"
)

// AlertDocs returns the docs with an alert table, under root (the
// repository's root, relative to the test's package).
func AlertDocs(root string) []string {
	return []string{filepath.Join(root, "docs", "operations.md"), filepath.Join(root, "docs", "messages.md")}
}

// AlertRule is one rule of the Prometheus rules file.
type AlertRule struct {
	Alert       string            `json:"alert"`
	Record      string            `json:"record"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// AlertRules reads the rules file strictly: a misspelt field fails.
func AlertRules(t testing.TB, file string) []AlertRule {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Name  string      `json:"name"`
			Rules []AlertRule `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var out []AlertRule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	if len(out) == 0 {
		t.Fatalf("%s has no rules", file)
	}
	return out
}

// OneLine collapses every run of white space to one space.
func OneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// AlertRow is one row of a doc's "| alert | PromQL |" table.
type AlertRow struct {
	Line        int
	Alert       string   // the alert cell as written
	Summary     string   // the alert cell without its (page) or (ticket)
	Severity    string   // page or ticket
	Expr        string   // the PromQL cell's first code span
	Queries     []string // every code span of the PromQL cell
	ForDuration string   // "10m" from "for 10m", or ""
	Section     string   // the id of the heading the table is under
}

var (
	codeSpan     = regexp.MustCompile("`([^`]+)`")
	forClause    = regexp.MustCompile(`\bfor ([0-9]+[smhdw])\b`)
	severityNote = regexp.MustCompile(`\s*\((page|ticket)\b[^)]*\)`)
)

// AlertRows reads the "| alert | PromQL |" tables of a doc.
func AlertRows(t testing.TB, doc string) []AlertRow {
	t.Helper()
	f, err := os.Open(doc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []AlertRow
	in, fenced := false, false
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "```"):
			fenced = !fenced
		case !fenced && strings.HasPrefix(line, "#"):
			section = headingID(strings.TrimLeft(line, "#"))
		case strings.HasPrefix(line, "| alert | PromQL |"):
			in = true
			continue
		case in && !strings.HasPrefix(line, "|"):
			in = false
		}
		if !in || strings.HasPrefix(line, "|---") {
			continue
		}
		cells := tableCells(line)
		if len(cells) != 2 {
			t.Fatalf("%s:%d: an alert row has %d cells, want 2 (alert, PromQL)", doc, n, len(cells))
		}
		row := AlertRow{Line: n, Alert: cells[0], Section: section}
		if m := severityNote.FindStringSubmatch(cells[0]); m != nil {
			row.Severity = m[1]
		}
		row.Summary = OneLine(severityNote.ReplaceAllString(cells[0], ""))
		for _, m := range codeSpan.FindAllStringSubmatch(cells[1], -1) {
			row.Queries = append(row.Queries, m[1])
		}
		if len(row.Queries) == 0 {
			t.Fatalf("%s:%d: the alert %q has no PromQL in backquotes", doc, n, row.Alert)
		}
		row.Expr = row.Queries[0]
		if m := forClause.FindStringSubmatch(codeSpan.ReplaceAllString(cells[1], "")); m != nil {
			row.ForDuration = m[1]
		}
		out = append(out, row)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// HeadingIDs returns the ids GitHub gives the headings of doc (outside
// fenced code), the anchors a link to doc#id may name.
func HeadingIDs(t testing.TB, doc string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	fenced := false
	for line := range strings.Lines(string(data)) {
		switch {
		case strings.HasPrefix(line, "```"):
			fenced = !fenced
		case !fenced && strings.HasPrefix(line, "#"):
			ids[headingID(strings.TrimLeft(line, "#"))] = true
		}
	}
	return ids
}

// tableCells splits a markdown table row on the pipes outside code spans.
// An escaped pipe (\|) is a pipe in the cell, in a code span too: GitHub
// needs it so even there (a PromQL regular expression such as "a\|b").
func tableCells(line string) []string {
	var cells []string
	var b strings.Builder
	code := false
	line = strings.TrimSpace(line)
	for i, r := range line {
		switch {
		case r == '\\' && strings.HasPrefix(line[i+1:], "|"):
			continue // the pipe after it is written as it is
		case r == '|' && i > 0 && line[i-1] == '\\':
		case r == '`':
			code = !code
		case r == '|' && !code:
			cells = append(cells, strings.TrimSpace(b.String()))
			b.Reset()
			continue
		}
		b.WriteRune(r)
	}
	// The pipes at both ends leave an empty first and last cell.
	if len(cells) > 0 && cells[0] == "" {
		cells = cells[1:]
	}
	return cells
}

// headingID is the id GitHub gives a heading (repocheck's slug).
func headingID(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
