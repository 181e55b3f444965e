package main

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/idemref/payments/internal/tooling/testdb"
)

// X2: every series an alert of the docs names is on a fresh process's
// /metrics before anything happened. A counter that appears only at its
// first increment makes increase() miss that increment, so the alert
// would stay silent for the first dead letter, the first refused
// compensation, the first fencing rejection.
func TestAFreshProcessExportsEverySeriesTheAlertsName(t *testing.T) {
	t.Parallel()
	_, dbURL := testdb.NewPool(t)
	srv := startServer(t, dbURL)
	res, err := http.Get(srv.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	scraped := parseExposition(string(body))

	var selectors []selector
	for _, doc := range []string{"../../docs/operations.md", "../../docs/messages.md"} {
		selectors = append(selectors, alertSelectors(t, doc)...)
	}
	if len(selectors) < 15 {
		t.Fatalf("found %d metric selectors in the alert tables, want the docs' alerts (15 or more): is the table format changed?", len(selectors))
	}
	for _, sel := range selectors {
		if !scraped.has(sel) {
			t.Errorf("%s: the alert %q names %s, which a fresh process does not export", sel.doc, sel.alert, sel)
		}
	}
}

// selector is one metric an alert's PromQL reads, with its label matchers.
type selector struct {
	doc, alert string
	name       string
	labels     map[string]string
}

func (s selector) String() string {
	var b strings.Builder
	b.WriteString(s.name)
	for k, v := range s.labels {
		b.WriteString("{" + k + "=" + v + "}")
	}
	return b.String()
}

var (
	promQLMetric  = regexp.MustCompile(`\b([a-z][a-z0-9_]*_(?:total|seconds|connected|conns|leases|size))\b(\{[^}]*\})?`)
	promQLMatcher = regexp.MustCompile(`([a-z_]+)="([^"]*)"`)
)

// alertSelectors reads the "| alert | PromQL |" table of a doc.
func alertSelectors(t *testing.T, doc string) []selector {
	t.Helper()
	f, err := os.Open(doc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []selector
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "| alert | PromQL |"):
			in = true
			continue
		case in && !strings.HasPrefix(line, "|"):
			in = false
		}
		if !in || strings.HasPrefix(line, "|---") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 3 {
			continue
		}
		alert := strings.TrimSpace(cells[1])
		for _, m := range promQLMetric.FindAllStringSubmatch(strings.Join(cells[2:], "|"), -1) {
			sel := selector{doc: doc, alert: alert, name: m[1], labels: map[string]string{}}
			for _, lm := range promQLMatcher.FindAllStringSubmatch(m[2], -1) {
				sel.labels[lm[1]] = lm[2]
			}
			out = append(out, sel)
		}
	}
	return out
}

// exposition is a scrape: each metric name's label sets.
type exposition map[string][]map[string]string

// parseExposition reads the text format, the sample lines only.
func parseExposition(text string) exposition {
	out := exposition{}
	for line := range strings.SplitSeq(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		// name{label="value",...} value: label values may hold spaces.
		name, _, _ := strings.Cut(line, " ")
		labels := map[string]string{}
		if i := strings.IndexByte(line, '{'); i >= 0 && i < len(name) {
			end := strings.LastIndexByte(line, '}')
			for _, lm := range promQLMatcher.FindAllStringSubmatch(line[i:end+1], -1) {
				labels[lm[1]] = lm[2]
			}
			name = line[:i]
		}
		out[name] = append(out[name], labels)
	}
	return out
}

// has reports whether a series matches sel's name and label matchers.
func (e exposition) has(sel selector) bool {
	for _, labels := range e[sel.name] {
		ok := true
		for k, v := range sel.labels {
			if labels[k] != v {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}
