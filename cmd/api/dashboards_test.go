package main

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/idemref/payments/internal/tooling/testkit"
)

// X5: every series the shipped alert rules and every panel of the Grafana
// dashboard query is on a fresh process's /metrics, with a series that
// matches its label matchers: a panel or a rule that reads a metric the
// service does not export (a typo, a renamed metric, a label value that
// does not exist, a counter that appears only at its first increment)
// stays empty or silent without anyone noticing.
func TestAFreshProcessExportsEverySeriesTheRulesAndTheDashboardQuery(t *testing.T) {
	t.Parallel()
	var selectors []selector
	for _, q := range append(ruleQueries(t), dashboardQueries(t)...) {
		sels, err := promQLSelectors(q.expr)
		if err != nil {
			t.Fatalf("%s: %s: %v\n\t%s", q.source, q.where, err, q.expr)
		}
		for _, s := range sels {
			s.source, s.where = q.source, q.where
			selectors = append(selectors, s)
		}
	}
	if len(selectors) < 40 {
		t.Fatalf("found %d metric selectors in %s and %s, want 40 or more: is a file's format changed?", len(selectors), rulesFile, dashboardFile)
	}
	scraped := scrapeFreshProcess(t)
	for _, sel := range selectors {
		if why := scraped.missingOrMadeByPrometheus(sel); why != "" {
			t.Errorf("%s: %s reads %s, %s", sel.source, sel.where, sel, why)
		}
	}
	// The negative control, on the same scrape: a name nobody exports.
	madeUp := selector{name: "payments_made_up_total"}
	if scraped.missing(madeUp) == "" {
		t.Errorf("the check finds %s on a fresh process: it reports nothing", madeUp)
	}
}

// query is one PromQL expression of a shipped file, with where it is.
type query struct{ source, where, expr string }

func ruleQueries(t *testing.T) []query {
	t.Helper()
	var out []query
	for _, r := range testkit.AlertRules(t, rulesFile) {
		out = append(out, query{rulesFile, "the rule " + r.Alert + r.Record, r.Expr})
	}
	return out
}

// dashboardQueries returns the expr of every target of every panel,
// those inside collapsed rows included.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
		Panels json.RawMessage `json:"panels"`
	}
	var dash struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var out []query
	var walk func([]panel)
	walk = func(panels []panel) {
		for _, p := range panels {
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("%s: the panel %q: target %s has no expr", dashboardFile, p.Title, tg.RefID)
					continue
				}
				out = append(out, query{dashboardFile, fmt.Sprintf("the panel %q (%s)", p.Title, tg.RefID), tg.Expr})
			}
			if len(p.Panels) > 0 {
				var inner []panel
				if err := json.Unmarshal(p.Panels, &inner); err != nil {
					t.Fatalf("%s: the row %q: %v", dashboardFile, p.Title, err)
				}
				walk(inner)
			}
		}
	}
	walk(dash.Panels)
	if len(out) == 0 {
		t.Fatalf("%s has no panel with a query", dashboardFile)
	}
	return out
}

// The extraction the fresh-process tests rely on: metric names with their
// matchers, and nothing else (functions, aggregations, label names in
// by/on lists, durations, strings, Grafana variables).
func TestPromQLSelectors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		expr string
		want []string
	}{
		{`max(idempotency_oldest_in_progress_seconds) > 600`, []string{"idempotency_oldest_in_progress_seconds"}},
		{`sum by (op) (rate(processor_calls_total{class="outcome_unknown"}[5m])) / sum by (op) (rate(processor_calls_total[5m])) > 0.01`,
			[]string{`processor_calls_total{class="outcome_unknown"}`, "processor_calls_total"}},
		{`sum by (endpoint) (rate(idempotency_requests_total{outcome="replayed"}[1d] offset 1d)) > 2 * 1e-3`,
			[]string{`idempotency_requests_total{outcome="replayed"}`}},
		{`histogram_quantile(0.99, sum by (endpoint, le) (rate(idempotency_lock_wait_seconds_bucket[$__rate_interval])))`,
			[]string{"idempotency_lock_wait_seconds_bucket"}},
		{`sum(rate(a_total{x=~"b|c", y!="d"}[5m])) without (instance) + on(instance) group_left(version) max by (instance, version) (b_info)`,
			[]string{`a_total{x=~"b|c",y!="d"}`, "b_info"}},
		{`label_replace(up{job="api"}, "dst", "$1", "src", "(.*)") and {__name__="payments_build_info", version!=""}`,
			[]string{`up{job="api"}`, `payments_build_info{version!=""}`}},
		{`max(pgxpool_acquired_conns / pgxpool_max_conns) > 0.9`, []string{"pgxpool_acquired_conns", "pgxpool_max_conns"}},
		{`rate(x_total{endpoint=~"$endpoint"}[1h:5m]) # a comment naming nothing_total`, []string{`x_total{endpoint=~"$endpoint"}`}},
	} {
		sels, err := promQLSelectors(c.expr)
		if err != nil {
			t.Errorf("%s: %v", c.expr, err)
			continue
		}
		var got []string
		for _, s := range sels {
			got = append(got, s.String())
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s:\n\tgot  %q\n\twant %q", c.expr, got, c.want)
		}
	}
	for _, bad := range []string{`rate(x_total{a="b"`, `x_total{a=~"("}`, `x_total{a="b}`, `{job="api"}`, `x_total{a}`} {
		if sels, err := promQLSelectors(bad); err == nil {
			t.Errorf("%s: no error, got %v", bad, sels)
		}
	}
}

// The negative control of the series check: a made-up metric, a label
// value nobody exports and a histogram queried by its family name are
// each reported; exported series, matched exactly, by a regular
// expression or through a Grafana variable, are not, nor is up of the
// scrape job the docs name (Prometheus makes it).
func TestTheSeriesCheckReportsWhatAFreshProcessLacks(t *testing.T) {
	t.Parallel()
	scraped, err := parseExposition(`# HELP idempotency_requests_total Idempotent requests.
# TYPE idempotency_requests_total counter
idempotency_requests_total{endpoint="POST /v1/payments/{id}/refunds",outcome="replayed"} 0
idempotency_requests_total{endpoint="POST /v1/orders",outcome="executed"} 0
# TYPE idempotency_replay_age_seconds histogram
idempotency_replay_age_seconds_bucket{le="0.1"} 0
idempotency_replay_age_seconds_bucket{le="+Inf"} 0
idempotency_replay_age_seconds_sum 0
idempotency_replay_age_seconds_count 0
# TYPE payments_build_info gauge
payments_build_info{goversion="go1.27.3",revision="unknown",version="(devel) \"x\""} 1
`)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		expr     string
		reported bool
	}{
		{`sum(rate(idempotency_requests_total[5m]))`, false},
		{`idempotency_requests_total{endpoint="POST /v1/payments/{id}/refunds",outcome="replayed"}`, false},
		{`idempotency_requests_total{outcome=~"replayed|in_progress"}`, false},
		{`idempotency_requests_total{endpoint=~"$endpoint",outcome!="replayed"}`, false},
		{`histogram_quantile(0.99, sum by (le) (rate(idempotency_replay_age_seconds_bucket[5m])))`, false},
		{`idempotency_replay_age_seconds_count`, false},
		{`payments_build_info{version="(devel) \"x\""}`, false},
		{`sum(rate(payments_made_up_total[5m]))`, true},
		{`idempotency_requests_total{outcome="made_up"}`, true},
		{`idempotency_requests_total{endpoint="POST /v1/orders",outcome="replayed"}`, true},
		{`idempotency_requests_total{outcome=~"replay"}`, true},
		{`idempotency_replay_age_seconds`, true},
		{`idempotency_lock_wait_seconds_bucket`, true},
		// up is Prometheus's, for each target of the job payments-api.
		{`absent(up{job="payments-api"})`, false},
		{`up{job="api"} == 0`, true},
	} {
		sels, err := promQLSelectors(c.expr)
		if err != nil || len(sels) != 1 {
			t.Fatalf("%s: %v %v", c.expr, sels, err)
		}
		why := scraped.missingOrMadeByPrometheus(sels[0])
		if (why != "") != c.reported {
			t.Errorf("%s: reported %v (%q), want %v", c.expr, why != "", why, c.reported)
		}
	}
}
