package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/idemref/payments/internal/tooling/testkit"
)

// X5: the alert rules ship as prometheus/alerts.yml and the dashboard as
// grafana/payments.json. These tests hold the rules to the docs' alert
// tables and the files to what Prometheus and Grafana load; cmd/api, which
// can start api serve, finds every series both query on a fresh process.

const (
	rulesFile      = "prometheus/alerts.yml"
	rulesTestsFile = "prometheus/alerts_test.yml"
	dashboardFile  = "grafana/payments.json"
)

// X2, X5: the rules file holds exactly the alerts of the docs' tables. Each
// row's PromQL is one rule's expr (whitespace aside), its "for 10m" the
// rule's for, its "(page)" or "(ticket)" the rule's severity, the rest of
// its alert cell the rule's summary, and the rule's runbook_url links to a
// heading of the row's doc of its own (checkRunbookURL); and every rule is
// a row. Neither can change without the other.
func TestTheRulesFileIsTheDocsAlertTables(t *testing.T) {
	t.Parallel()
	rules := testkit.AlertRules(t, rulesFile)
	byExpr := map[string]testkit.AlertRule{}
	names := map[string]bool{}
	for _, r := range rules {
		if r.Alert == "" || r.Record != "" {
			t.Errorf("%s: a rule that is not an alert (record %q, expr %q): the file holds the docs' alerts only", rulesFile, r.Record, r.Expr)
			continue
		}
		if names[r.Alert] {
			t.Errorf("%s: two rules named %s", rulesFile, r.Alert)
		}
		names[r.Alert] = true
		if prev, ok := byExpr[testkit.OneLine(r.Expr)]; ok {
			t.Errorf("%s: %s and %s have one expr", rulesFile, prev.Alert, r.Alert)
		}
		byExpr[testkit.OneLine(r.Expr)] = r
		if s := r.Labels["severity"]; s != "page" && s != "ticket" {
			t.Errorf("%s: %s has severity %q, want page or ticket", rulesFile, r.Alert, s)
		}
		if strings.TrimSpace(r.Annotations["description"]) == "" {
			t.Errorf("%s: %s has no description", rulesFile, r.Alert)
		}
	}

	inDocs := map[string]bool{}
	runbooks := map[string]string{} // runbook_url -> the alert it belongs to
	anchors := map[string]map[string]bool{}
	rows := 0
	for _, doc := range testkit.AlertDocs("..") {
		anchors[doc] = testkit.HeadingIDs(t, doc)
		for _, row := range testkit.AlertRows(t, doc) {
			rows++
			where := fmt.Sprintf("%s:%d: the alert %q", doc, row.Line, row.Alert)
			r, ok := byExpr[testkit.OneLine(row.Expr)]
			if !ok {
				t.Errorf("%s: no rule of %s has its PromQL as expr:\n\t%s", where, rulesFile, row.Expr)
				continue
			}
			inDocs[r.Alert] = true
			if r.For != row.ForDuration {
				t.Errorf("%s: the docs say for %q, %s in %s has for %q", where, row.ForDuration, r.Alert, rulesFile, r.For)
			}
			if row.Severity == "" {
				t.Errorf("%s: the alert cell says neither (page) nor (ticket)", where)
			} else if r.Labels["severity"] != row.Severity {
				t.Errorf("%s: the docs say %s, %s in %s has severity %q", where, row.Severity, r.Alert, rulesFile, r.Labels["severity"])
			}
			if r.Annotations["summary"] != row.Summary {
				t.Errorf("%s: %s's summary is %q, want the docs' %q", where, r.Alert, r.Annotations["summary"], row.Summary)
			}
			checkRunbookURL(t, where, r, path.Base(doc), anchors[doc], runbooks)
		}
	}
	if rows < 15 {
		t.Fatalf("found %d rows in the alert tables, want the docs' alerts (15 or more): is the table format changed?", rows)
	}
	for _, r := range rules {
		if r.Alert != "" && !inDocs[r.Alert] {
			t.Errorf("%s: %s (%s) is in no alert table of the docs: add its row, or remove the rule", rulesFile, r.Alert, testkit.OneLine(r.Expr))
		}
	}
}

// runbookBase is the one base of every runbook_url: Prometheus's external
// label runbook_base when set, else the repository's docs (make rename
// rewrites the repository's path with the module's).
const runbookBase = `{{ or $externalLabels.runbook_base "https://github.com/idemref/payments/blob/main/docs" }}`

// runbookURL is a runbook_url: the base, the doc, and the heading's id.
var runbookURL = regexp.MustCompile(`^` + regexp.QuoteMeta(runbookBase) + `/([a-z]+\.md)#([a-z0-9_-]+)$`)

// X2, X5: r's runbook_url is the one base, the doc of r's table (doc), and the
// id of a heading of that doc (anchors: GitHub's ids, lower case, spaces
// as -, punctuation dropped) that no other alert links to: each alert has
// a runbook of its own, which a link from the page reaches.
func checkRunbookURL(t *testing.T, where string, r testkit.AlertRule, doc string, anchors map[string]bool, seen map[string]string) {
	t.Helper()
	if r.Annotations["runbook"] != "" {
		t.Errorf("%s: %s has a runbook annotation; its link is runbook_url", where, r.Alert)
	}
	u := r.Annotations["runbook_url"]
	m := runbookURL.FindStringSubmatch(u)
	switch {
	case m == nil:
		t.Errorf("%s: %s's runbook_url is %q, want %s/%s#<the id of its runbook's heading>", where, r.Alert, u, runbookBase, doc)
	case m[1] != doc:
		t.Errorf("%s: %s's runbook_url links to %s, want the doc of its table, %s", where, r.Alert, m[1], doc)
	case !anchors[m[2]]:
		t.Errorf("%s: %s's runbook_url links to #%s, which no heading of docs/%s has", where, r.Alert, m[2], doc)
	case seen[u] != "" && seen[u] != r.Alert:
		t.Errorf("%s: %s's runbook_url is also %s's: each alert needs a runbook of its own", where, r.Alert, seen[u])
	}
	seen[u] = r.Alert
}

// requirePromtool finds promtool (Debian's prometheus package). Where it
// is missing the test skips, except on CI (CI set), where .ci/run
// installs it and a missing one is a failure.
func requirePromtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err == nil {
		return path
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("promtool is not installed: on CI the alert rules must be checked and unit-tested (.ci/run installs Debian's prometheus package)")
	}
	t.Skipf("promtool is not installed: apt-get install prometheus (its promtool checks and unit-tests %s)", rulesFile)
	return ""
}

// promtool check rules loads the file as Prometheus would (syntax, PromQL,
// templates); promtool test rules runs alerts_test.yml, where each alert
// fires on one set of series and stays quiet on another.
func TestPrometheusRulesPassPromtool(t *testing.T) {
	t.Parallel()
	promtool := requirePromtool(t)
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestsFile}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "SUCCESS") {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			continue
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
	}
}

type promTestGroup struct {
	Name           string            `json:"name"`
	Interval       string            `json:"interval"`
	ExternalLabels map[string]string `json:"external_labels"`
	InputSeries    []struct {
		Series string `json:"series"`
		Values string `json:"values"`
	} `json:"input_series"`
	AlertRuleTest []struct {
		EvalTime  string `json:"eval_time"`
		Alertname string `json:"alertname"`
		ExpAlerts []struct {
			ExpLabels      map[string]string `json:"exp_labels"`
			ExpAnnotations map[string]string `json:"exp_annotations"`
		} `json:"exp_alerts"`
	} `json:"alert_rule_test"`
}

// Every alert has a case where it fires, with its severity, summary and
// runbook_url, and a case where it stays quiet at an evaluation past its for,
// on the same metrics as the firing case (a quiet case on a misspelt
// series would prove nothing). promtool runs the cases; this test says
// none is missing.
func TestEveryAlertHasAFiringAndAQuietCase(t *testing.T) {
	t.Parallel()
	rules := testkit.AlertRules(t, rulesFile)
	var tests struct {
		RuleFiles          []string        `json:"rule_files"`
		EvaluationInterval string          `json:"evaluation_interval"`
		Tests              []promTestGroup `json:"tests"`
	}
	readYAML(t, rulesTestsFile, &tests)
	if !slices.Equal(tests.RuleFiles, []string{"alerts.yml"}) {
		t.Errorf("%s: rule_files is %v, want [alerts.yml]", rulesTestsFile, tests.RuleFiles)
	}

	byName := map[string]testkit.AlertRule{}
	for _, r := range rules {
		byName[r.Alert] = r
	}
	if len(byName) < 15 {
		t.Fatalf("%s: %d alerts, want the docs' 15 or more", rulesFile, len(byName))
	}
	firing := map[string][]string{} // alert -> metric names of its firing cases
	type quietCase struct {
		group   string
		metrics []string
	}
	quiet := map[string][]quietCase{}
	for _, g := range tests.Tests {
		metrics := seriesNames(g)
		for _, c := range g.AlertRuleTest {
			r, ok := byName[c.Alertname]
			if !ok {
				t.Errorf("%s: the case %q tests %q, which %s does not have", rulesTestsFile, g.Name, c.Alertname, rulesFile)
				continue
			}
			if len(c.ExpAlerts) == 0 {
				eval, err := promDuration(c.EvalTime)
				if err != nil {
					t.Errorf("%s: the case %q: eval_time: %v", rulesTestsFile, g.Name, err)
					continue
				}
				forDur, err := promDuration(r.For)
				if err != nil {
					t.Errorf("%s: %s: for: %v", rulesFile, r.Alert, err)
					continue
				}
				if eval > forDur {
					quiet[r.Alert] = append(quiet[r.Alert], quietCase{g.Name, metrics})
				}
				continue
			}
			for _, a := range c.ExpAlerts {
				if a.ExpLabels["severity"] != r.Labels["severity"] {
					t.Errorf("%s: the case %q expects %s with severity %q, the rule has %q", rulesTestsFile, g.Name, r.Alert, a.ExpLabels["severity"], r.Labels["severity"])
				}
				for _, k := range []string{"summary", "runbook_url", "description"} {
					if a.ExpAnnotations[k] == "" {
						t.Errorf("%s: the case %q expects %s without its %s annotation", rulesTestsFile, g.Name, r.Alert, k)
					}
				}
			}
			firing[r.Alert] = append(firing[r.Alert], metrics...)
		}
	}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for n := range byName {
			if !yield(n) {
				return
			}
		}
	}) {
		if len(firing[name]) == 0 {
			t.Errorf("%s: no case where %s fires", rulesTestsFile, name)
			continue
		}
		ok := slices.ContainsFunc(quiet[name], func(q quietCase) bool {
			return !slices.ContainsFunc(q.metrics, func(m string) bool { return !slices.Contains(firing[name], m) })
		})
		if !ok {
			t.Errorf("%s: no case where %s stays quiet past its for (%q) on the metrics of its firing case %v (quiet cases: %v)",
				rulesTestsFile, name, byName[name].For, slices.Compact(slices.Sorted(slices.Values(firing[name]))), quiet[name])
		}
	}
}

// seriesNames returns the metric names of a case's input series.
func seriesNames(g promTestGroup) []string {
	var out []string
	for _, s := range g.InputSeries {
		name, _, _ := strings.Cut(s.Series, "{")
		out = append(out, strings.TrimSpace(name))
	}
	return out
}

// promDuration parses a Prometheus duration (1d2h, 10m, 30s; "" is 0) in
// seconds.
func promDuration(s string) (int64, error) {
	units := map[byte]int64{'s': 1, 'm': 60, 'h': 3600, 'd': 86400, 'w': 7 * 86400, 'y': 365 * 86400}
	var total int64
	for rest := s; rest != ""; {
		i := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
		if i <= 0 || units[rest[i]] == 0 {
			return 0, fmt.Errorf("%q is not a duration such as 10m", s)
		}
		n, err := strconv.ParseInt(rest[:i], 10, 64)
		if err != nil {
			return 0, err
		}
		total += n * units[rest[i]]
		rest = rest[i+1:]
	}
	return total, nil
}

func readYAML(t *testing.T, file string, v any) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// The dashboard imports into any Grafana with a Prometheus data source:
// every panel and target uses the ${datasource} variable (no data source
// uid of the machine it was made on), panels have distinct ids and do not
// overlap on the 24-column grid, every target has a query and a distinct
// refId, the first row shows rate, errors and latency by route with the
// alerts' queries, and the panels cover what issue 31 asks for. cmd/api
// TestAFreshProcessExportsEverySeriesTheRulesAndTheDashboardQuery checks
// the series the queries read.
func TestGrafanaDashboardIsPortable(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var raw any
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	checkDatasources(t, "", raw)

	type variable struct {
		Name  string `json:"name"`
		Type  string `json:"type"`
		Query any    `json:"query"`
	}
	type panel struct {
		ID         int                      `json:"id"`
		Type       string                   `json:"type"`
		Title      string                   `json:"title"`
		Datasource map[string]any           `json:"datasource"`
		GridPos    struct{ H, W, X, Y int } `json:"gridPos"`
		Targets    []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var dash struct {
		UID           string  `json:"uid"`
		Title         string  `json:"title"`
		SchemaVersion int     `json:"schemaVersion"`
		Panels        []panel `json:"panels"`
		Templating    struct {
			List []variable `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if dash.SchemaVersion < 36 || dash.UID == "" || dash.Title == "" {
		t.Errorf("%s: schemaVersion %d, uid %q, title %q: want a schemaVersion of 36 or more (Grafana 9+), a uid and a title", dashboardFile, dash.SchemaVersion, dash.UID, dash.Title)
	}
	if !slices.ContainsFunc(dash.Templating.List, func(v variable) bool {
		return v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus"
	}) {
		t.Errorf("%s: no template variable datasource of type datasource querying prometheus", dashboardFile)
	}

	ids := map[int]string{}
	var cells [][24]string // the grid: which panel holds each cell
	var exprs []string
	for _, p := range dash.Panels {
		where := fmt.Sprintf("%s: the panel %q", dashboardFile, p.Title)
		if len(p.Panels) > 0 {
			t.Errorf("%s: a collapsed row; keep rows open so every panel is checked here", where)
		}
		if prev, ok := ids[p.ID]; ok || p.ID == 0 {
			t.Errorf("%s: id %d is zero or also %q's", where, p.ID, prev)
		}
		ids[p.ID] = p.Title
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("%s: gridPos %+v is off the 24-column grid", where, g)
			continue
		}
		for len(cells) < g.Y+g.H {
			cells = append(cells, [24]string{})
		}
	grid:
		for y := g.Y; y < g.Y+g.H; y++ {
			for x := g.X; x < g.X+g.W; x++ {
				if other := cells[y][x]; other != "" {
					t.Errorf("%s: overlaps %q at column %d, row %d", where, other, x, y)
					break grid
				}
				cells[y][x] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no target", where)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.RefID == "" || refs[tg.RefID] || strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%s: a target with refId %q (empty or repeated) or without an expr", where, tg.RefID)
			}
			refs[tg.RefID] = true
			exprs = append(exprs, tg.Expr)
		}
	}
	// The first row is RED by route: its three panels, at the top, read
	// what HTTPServerErrors and HTTPLatencyHigh read, their query with
	// the dashboard's interval for the rules' 5m and without the threshold.
	top := map[string]string{} // expr of each panel on the first row
	for _, p := range dash.Panels {
		if p.GridPos.Y == 1 && p.Type != "row" && len(p.Targets) > 0 {
			top[p.Title] = strings.ReplaceAll(p.Targets[0].Expr, "$__rate_interval", "5m")
		}
	}
	rules := map[string]string{}
	for _, r := range testkit.AlertRules(t, rulesFile) {
		rules[r.Alert] = testkit.OneLine(r.Expr)
	}
	for _, want := range []struct{ panel, rule string }{
		{"Requests per second by route", ""},
		{"5xx ratio by route", "HTTPServerErrors"},
		{"p99 latency by route", "HTTPLatencyHigh"},
	} {
		expr, ok := top[want.panel]
		switch {
		case !ok:
			t.Errorf("%s: the first row has no panel %q (rate, errors, latency by route come first)", dashboardFile, want.panel)
		case want.rule != "" && !strings.HasPrefix(rules[want.rule], testkit.OneLine(expr)+" > "):
			t.Errorf("%s: the panel %q reads %s, which is not %s's query (%s) with its threshold taken off", dashboardFile, want.panel, expr, want.rule, rules[want.rule])
		}
	}
	// What issue 31 asks the dashboard to show.
	for _, want := range []struct{ what, in string }{
		{"the request rate by route", "sum by (route) (rate(http_request_duration_seconds_count["},
		{"idempotency outcomes", "idempotency_requests_total"},
		{"replays", `outcome="replayed"`},
		{"lock waits", "idempotency_lock_wait_seconds_bucket"},
		{"unknown outcomes", `class="outcome_unknown"`},
		{"the completer", "payments_completer_finished_total"},
		{"the sweep", "payments_sweep_rows_total"},
		{"outbox lag", "outbox_lag_seconds"},
		{"consumer dead letters", "consumer_dead_letters_total"},
		{"the edge's refusals", "http_auth_lookups_refused_total"},
		{"the edge's refusals", `outcome="budget_exceeded"`},
	} {
		if !slices.ContainsFunc(exprs, func(e string) bool { return strings.Contains(e, want.in) }) {
			t.Errorf("%s: no panel shows %s (a query with %s)", dashboardFile, want.what, want.in)
		}
	}
}

// checkDatasources walks the dashboard: every "datasource" is the
// ${datasource} variable of type prometheus.
func checkDatasources(t *testing.T, at string, v any) {
	t.Helper()
	switch v := v.(type) {
	case map[string]any:
		for k, child := range v {
			if k == "datasource" {
				ds, _ := child.(map[string]any)
				if ds["uid"] != "${datasource}" || ds["type"] != "prometheus" {
					t.Errorf("%s: %s.datasource is %v, want {\"type\": \"prometheus\", \"uid\": \"${datasource}\"}: a uid from one Grafana breaks the import into another", dashboardFile, at, child)
				}
				continue
			}
			checkDatasources(t, at+"."+k, child)
		}
	case []any:
		for i, child := range v {
			checkDatasources(t, fmt.Sprintf("%s[%d]", at, i), child)
		}
	}
}
