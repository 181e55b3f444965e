package main

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// The files the alerts and the dashboard ship as (X5).
const (
	rulesFile     = "../../deploy/prometheus/alerts.yml"
	dashboardFile = "../../deploy/grafana/payments.json"
)

// X2: every series an alert of the docs names is on a fresh process's
// /metrics before anything happened. A counter that appears only at its
// first increment makes increase() miss that increment, so the alert
// would stay silent for the first dead letter, the first refused
// compensation, the first fencing rejection.
func TestAFreshProcessExportsEverySeriesTheAlertsName(t *testing.T) {
	t.Parallel()
	var selectors []selector
	for _, doc := range testkit.AlertDocs("../..") {
		for _, row := range testkit.AlertRows(t, doc) {
			// Every code span of the row: the alert's PromQL, and a
			// metric it names for comparison.
			for _, q := range row.Queries {
				sels, err := promQLSelectors(q)
				if err != nil {
					t.Fatalf("%s:%d: the alert %q: %v", doc, row.Line, row.Alert, err)
				}
				for _, s := range sels {
					s.source, s.where = doc, fmt.Sprintf("the alert %q", row.Alert)
					selectors = append(selectors, s)
				}
			}
		}
	}
	if len(selectors) < 15 {
		t.Fatalf("found %d metric selectors in the alert tables, want the docs' alerts (15 or more): is the table format changed?", len(selectors))
	}
	scraped := scrapeFreshProcess(t)
	for _, sel := range selectors {
		if why := scraped.missingOrMadeByPrometheus(sel); why != "" {
			t.Errorf("%s: %s reads %s, %s", sel.source, sel.where, sel, why)
		}
	}
}

// madeByPrometheus are the series a rule may read that Prometheus itself
// creates for each scrape target, never on the process's /metrics, with
// the labels it gives them. The check takes their name and these labels
// instead of a scrape: a rule on up{job="api"} would find no target of the
// scrape job docs/operations.md names, and is reported.
var madeByPrometheus = map[string]map[string]string{
	"up": {"job": "payments-api", "instance": "10.0.0.5:9090"},
}

// missingOrMadeByPrometheus is exposition.missing, but a series of
// madeByPrometheus is checked against the labels Prometheus gives it.
func (e exposition) missingOrMadeByPrometheus(sel selector) string {
	labels, ok := madeByPrometheus[sel.name]
	if !ok {
		return e.missing(sel)
	}
	if slices.ContainsFunc(sel.matchers, func(m matcher) bool { return !m.matches(labels) }) {
		return fmt.Sprintf("which Prometheus makes for each target with the labels %v, which its matchers do not match", labels)
	}
	return ""
}

// scrapeFreshProcess starts api serve on a database of its own and reads
// its admin listener's /metrics before any request reaches it. It waits
// for the workers to start ("messaging running"): the admin listener
// serves before serve starts them, and the consumer's series are created
// when they start (still before any delivery could count), so a scrape in
// between would find them missing for a reason that loses no increment.
func scrapeFreshProcess(t *testing.T) exposition {
	t.Helper()
	_, dbURL := testdb.NewPool(t)
	srv := startServer(t, dbURL)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		srv.mu.Lock()
		started := strings.Contains(srv.logs.String(), `"msg":"messaging running"`)
		srv.mu.Unlock()
		if started {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(`api serve did not log "messaging running" within 30s`)
		}
	}
	res, err := http.Get(srv.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s\n%s", res.Status, body)
	}
	scraped, err := parseExposition(string(body))
	if err != nil {
		t.Fatal(err)
	}
	return scraped
}

// selector is one vector selector of a PromQL expression: the metric
// name and its label matchers, with where it was read.
type selector struct {
	source, where string // the file, and the alert or panel
	name          string
	matchers      []matcher
}

type matcher struct{ label, op, value string }

func (s selector) String() string {
	if len(s.matchers) == 0 {
		return s.name
	}
	var ms []string
	for _, m := range s.matchers {
		ms = append(ms, fmt.Sprintf("%s%s%q", m.label, m.op, m.value))
	}
	return s.name + "{" + strings.Join(ms, ",") + "}"
}

// matches reports whether a series' labels satisfy m. A value holding a
// Grafana variable ($endpoint) matches anything.
func (m matcher) matches(labels map[string]string) bool {
	if strings.Contains(m.value, "$") {
		return true
	}
	v := labels[m.label]
	switch m.op {
	case "=":
		return v == m.value
	case "!=":
		return v != m.value
	}
	ok := regexp.MustCompile("^(?:" + m.value + ")$").MatchString(v)
	return ok == (m.op == "=~")
}

// promQLToken is one token of a PromQL expression. kind is 'i' for an
// identifier, 's' for a string (text unquoted), 'n' for a number, a
// duration or a Grafana variable, 'p' for punctuation and operators.
type promQLToken struct {
	kind byte
	text string
}

// promQLOperators, longest first.
var promQLOperators = []string{"!=", "=~", "!~", "==", "<=", ">=", "{", "}", "(", ")", ",", "=", "<", ">", "+", "-", "*", "/", "%", "^", "@"}

func isIdentByte(c byte, first bool) bool {
	return c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || !first && '0' <= c && c <= '9'
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// lexPromQL splits a PromQL expression (or a Grafana target, with its
// $variables) into tokens. Ranges and subqueries ([5m], [1h:1m],
// [$__rate_interval]) select nothing and are dropped, as are comments.
func lexPromQL(expr string) ([]promQLToken, error) {
	var toks []promQLToken
	i := 0
	for i < len(expr) {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'':
			var b strings.Builder
			j := i + 1
			for ; j < len(expr) && expr[j] != c; j++ {
				if expr[j] == '\\' && j+1 < len(expr) {
					j++
				}
				b.WriteByte(expr[j])
			}
			if j >= len(expr) {
				return nil, fmt.Errorf("an unterminated string at offset %d", i)
			}
			toks = append(toks, promQLToken{'s', b.String()})
			i = j + 1
		case c == '`':
			j := strings.IndexByte(expr[i+1:], '`')
			if j < 0 {
				return nil, fmt.Errorf("an unterminated raw string at offset %d", i)
			}
			toks = append(toks, promQLToken{'s', expr[i+1 : i+1+j]})
			i += j + 2
		case c == '[':
			j := strings.IndexByte(expr[i:], ']')
			if j < 0 {
				return nil, fmt.Errorf("an unterminated range at offset %d", i)
			}
			i += j + 1
		case isDigit(c) || c == '.' && i+1 < len(expr) && isDigit(expr[i+1]):
			j := i + 1
			for j < len(expr) && (isIdentByte(expr[j], false) || expr[j] == '.' ||
				(expr[j] == '+' || expr[j] == '-') && (expr[j-1] == 'e' || expr[j-1] == 'E') && j+1 < len(expr) && isDigit(expr[j+1])) {
				j++
			}
			toks = append(toks, promQLToken{'n', expr[i:j]})
			i = j
		case c == '$':
			j := i + 1
			if j < len(expr) && expr[j] == '{' {
				k := strings.IndexByte(expr[j:], '}')
				if k < 0 {
					return nil, fmt.Errorf("an unterminated ${variable} at offset %d", i)
				}
				j += k + 1
			} else {
				for j < len(expr) && isIdentByte(expr[j], false) {
					j++
				}
			}
			toks = append(toks, promQLToken{'n', expr[i:j]})
			i = j
		case isIdentByte(c, true):
			j := i + 1
			for j < len(expr) && isIdentByte(expr[j], false) {
				j++
			}
			toks = append(toks, promQLToken{'i', expr[i:j]})
			i = j
		default:
			k := slices.IndexFunc(promQLOperators, func(op string) bool { return strings.HasPrefix(expr[i:], op) })
			if k < 0 {
				return nil, fmt.Errorf("unexpected %q at offset %d", c, i)
			}
			toks = append(toks, promQLToken{'p', promQLOperators[k]})
			i += len(promQLOperators[k])
		}
	}
	return toks, nil
}

var (
	// promQLGrouping words are followed by a list of label names.
	promQLGrouping = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}
	// promQLKeywords are words that are neither metrics nor calls.
	promQLKeywords = map[string]bool{"and": true, "or": true, "unless": true, "atan2": true, "offset": true, "bool": true, "inf": true, "nan": true}
	// promQLAggregations may be followed by by or without before "(".
	promQLAggregations = map[string]bool{"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
		"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true}
)

// promQLSelectors returns the vector selectors of a PromQL expression: an
// identifier that is no function, aggregation, keyword or label name is a
// metric name, with the label matchers in the braces after it. The
// github.com/prometheus/prometheus parser would do it too, but that module
// is not a dependency and is far too large to become one for a test.
func promQLSelectors(expr string) ([]selector, error) {
	toks, err := lexPromQL(expr)
	if err != nil {
		return nil, err
	}
	is := func(i int, kind byte, text string) bool {
		return i < len(toks) && toks[i].kind == kind && (text == "" || toks[i].text == text)
	}
	var out []selector
	for i := 0; i < len(toks); i++ {
		word := strings.ToLower(toks[i].text)
		switch {
		case is(i, 'p', "{"):
			// A selector without a name before the braces: {__name__="x"}.
			ms, n, err := promQLMatchers(toks[i:])
			if err != nil {
				return nil, err
			}
			sel := selector{}
			for _, m := range ms {
				if m.label == "__name__" && m.op == "=" {
					sel.name = m.value
				} else {
					sel.matchers = append(sel.matchers, m)
				}
			}
			if sel.name == "" {
				return nil, fmt.Errorf("a selector without a metric name: {%v}", ms)
			}
			out = append(out, sel)
			i += n - 1
		case !is(i, 'i', ""), promQLKeywords[word]:
		case promQLGrouping[word]:
			if is(i+1, 'p', "(") {
				for i < len(toks) && !is(i, 'p', ")") {
					i++
				}
			}
		case is(i+1, 'p', "("):
			// A function or an aggregation: its arguments come next.
		case promQLAggregations[word] && (is(i+1, 'i', "by") || is(i+1, 'i', "without")):
		default:
			sel := selector{name: toks[i].text}
			if is(i+1, 'p', "{") {
				ms, n, err := promQLMatchers(toks[i+1:])
				if err != nil {
					return nil, fmt.Errorf("%s: %w", sel.name, err)
				}
				sel.matchers = ms
				i += n
			}
			out = append(out, sel)
		}
	}
	return out, nil
}

// promQLMatchers parses the label matchers of toks, which start at "{",
// and returns them with the number of tokens through "}".
func promQLMatchers(toks []promQLToken) ([]matcher, int, error) {
	var ms []matcher
	for i := 1; i < len(toks); {
		switch {
		case toks[i].kind == 'p' && toks[i].text == "}":
			return ms, i + 1, nil
		case toks[i].kind == 'p' && toks[i].text == ",":
			i++
			continue
		}
		if i+2 >= len(toks) || toks[i].kind != 'i' || toks[i+1].kind != 'p' || toks[i+2].kind != 's' ||
			!slices.Contains([]string{"=", "!=", "=~", "!~"}, toks[i+1].text) {
			return nil, 0, fmt.Errorf("a malformed label matcher at %q", toks[i].text)
		}
		m := matcher{label: toks[i].text, op: toks[i+1].text, value: toks[i+2].text}
		if strings.HasSuffix(m.op, "~") && !strings.Contains(m.value, "$") {
			if _, err := regexp.Compile("^(?:" + m.value + ")$"); err != nil {
				return nil, 0, fmt.Errorf("label %s: %w", m.label, err)
			}
		}
		ms = append(ms, m)
		i += 3
	}
	return nil, 0, fmt.Errorf("unterminated label matchers")
}

// exposition is a scrape: each sample name's label sets, and each
// family's type (counter, gauge, histogram, ...).
type exposition struct {
	samples map[string][]map[string]string
	types   map[string]string
}

// parseExposition reads the Prometheus text format.
func parseExposition(text string) (exposition, error) {
	e := exposition{samples: map[string][]map[string]string{}, types: map[string]string{}}
	for line := range strings.SplitSeq(text, "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			e.types[f[2]] = f[3]
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, labels, err := parseSample(line)
		if err != nil {
			return e, fmt.Errorf("/metrics: %w: %q", err, line)
		}
		e.samples[name] = append(e.samples[name], labels)
	}
	return e, nil
}

// parseSample reads name{label="value",...} of a sample line; a label
// value may hold spaces, braces and escaped quotes.
func parseSample(line string) (string, map[string]string, error) {
	i := strings.IndexAny(line, "{ ")
	if i <= 0 {
		return "", nil, fmt.Errorf("no metric name")
	}
	name, labels := line[:i], map[string]string{}
	if line[i] != '{' {
		return name, labels, nil
	}
	rest := line[i+1:]
	for {
		rest = strings.TrimLeft(rest, " ,")
		if strings.HasPrefix(rest, "}") {
			return name, labels, nil
		}
		eq := strings.IndexByte(rest, '=')
		if eq <= 0 || eq+1 >= len(rest) || rest[eq+1] != '"' {
			return "", nil, fmt.Errorf("a malformed label")
		}
		label := strings.TrimSpace(rest[:eq])
		rest = rest[eq+2:]
		var b strings.Builder
		j := 0
		for ; j < len(rest) && rest[j] != '"'; j++ {
			if rest[j] == '\\' && j+1 < len(rest) {
				j++
				if rest[j] == 'n' {
					b.WriteByte('\n')
					continue
				}
			}
			b.WriteByte(rest[j])
		}
		if j >= len(rest) {
			return "", nil, fmt.Errorf("an unterminated label value")
		}
		labels[label] = b.String()
		rest = rest[j+1:]
	}
}

// missing says why no series of the scrape matches sel, or "" when one
// does. A histogram's series are its _bucket, _sum and _count samples.
func (e exposition) missing(sel selector) string {
	series, ok := e.samples[sel.name]
	if !ok {
		if typ := e.types[sel.name]; typ == "histogram" || typ == "summary" {
			return fmt.Sprintf("the name of a %s family, which has no series of its own (query %s_bucket, _sum or _count)", typ, sel.name)
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if family, ok := strings.CutSuffix(sel.name, suffix); ok && e.types[family] != "" {
				return fmt.Sprintf("which a fresh process does not export (%s is a %s)", family, e.types[family])
			}
		}
		return "which a fresh process does not export"
	}
	for _, labels := range series {
		if !slices.ContainsFunc(sel.matchers, func(m matcher) bool { return !m.matches(labels) }) {
			return ""
		}
	}
	return fmt.Sprintf("but no series of the %d a fresh process exports under that name matches its labels", len(series))
}
