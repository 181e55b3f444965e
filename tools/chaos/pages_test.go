package main

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// rulesFile is the shape of deploy/prometheus/alerts.yml the tests read.
type rulesFile struct {
	Groups []struct {
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

func readRules(t *testing.T, b []byte) rulesFile {
	t.Helper()
	var f rulesFile
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

// The harness evaluates the operators' rules file with its durations
// divided by timeScale and nothing else changed: the same alerts, labels
// and annotations, each for and each window scaled, and a file Prometheus
// itself accepts.
func TestScaledRulesAreTheRulesFileOnTheHarnessClock(t *testing.T) {
	src, err := os.ReadFile("../../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	scaled, err := scaleRules(src, timeScale)
	if err != nil {
		t.Fatal(err)
	}
	before, after := readRules(t, src), readRules(t, scaled)
	if len(before.Groups) != len(after.Groups) {
		t.Fatalf("groups: %d, scaled %d", len(before.Groups), len(after.Groups))
	}
	windows := 0
	for g := range before.Groups {
		for i, r := range before.Groups[g].Rules {
			s := after.Groups[g].Rules[i]
			if s.Alert != r.Alert || !maps.Equal(s.Labels, r.Labels) || !maps.Equal(s.Annotations, r.Annotations) {
				t.Errorf("%s: scaled rule differs beyond its durations: %+v", r.Alert, s)
			}
			if r.For != "" {
				d, err := parsePromDuration(r.For)
				if err != nil {
					t.Fatal(err)
				}
				if want := (d / timeScale).Milliseconds(); s.For != fmt.Sprintf("%dms", want) {
					t.Errorf("%s: for %s scaled to %s, want %dms", r.Alert, r.For, s.For, want)
				}
			}
			for _, m := range exprDuration.FindAllString(s.Expr, -1) {
				windows++
				if !strings.Contains(m, "ms") {
					t.Errorf("%s: %s not scaled in %q", r.Alert, m, s.Expr)
				}
			}
			if stripDurations(s.Expr) != stripDurations(r.Expr) {
				t.Errorf("%s: expression changed beyond its durations:\n%s\n%s", r.Alert, r.Expr, s.Expr)
			}
		}
	}
	if windows == 0 {
		t.Fatal("no window scaled: the expressions were not read")
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool not found on CI (.ci/run installs Debian's prometheus)")
		}
		t.Skip("promtool not found (Debian: apt-get install prometheus)")
	}
	path := filepath.Join(t.TempDir(), "alerts.scaled.yml")
	if err := os.WriteFile(path, scaled, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules on the scaled file: %v\n%s", err, out)
	}
}

// A window the scale would shrink below a few scrapes is refused, not
// evaluated with too few samples to ever fire.
func TestScaleRulesRefusesAWindowTooShortForTheScrapes(t *testing.T) {
	src := []byte("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: rate(x[1m]) > 0\n")
	_, err := scaleRules(src, timeScale)
	if err == nil || !strings.Contains(err.Error(), "too few scrapes") {
		t.Fatalf("err = %v, want the window refused", err)
	}
}

func stripDurations(expr string) string { return exprDuration.ReplaceAllString(expr, "<d>") }

// The judgement of one scenario's alerts, on hand-made records: each
// way a run can go wrong is reported in its bucket, naming the alert.
func TestJudgeAlertsFindsMissedLateFalseAndUnresolvedPages(t *testing.T) {
	start := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	fired := func(after time.Duration, resolved bool) alertSeen {
		s := alertSeen{firstFired: start.Add(after), firing: map[string]bool{}}
		if !resolved {
			s.firing["f"] = true
		}
		return s
	}
	spec := alertSpec{pages: []page{{alert: "APIProcessDown", within: 10 * time.Second}}, tolerates: []string{"HTTPServerErrors"}}
	for _, tc := range []struct {
		name string
		seen map[string]alertSeen
		// want is the one finding expected, "" for a pass.
		want string
	}{
		{"fired in time and resolved", map[string]alertSeen{"APIProcessDown": fired(3*time.Second, true)}, ""},
		{"a tolerated symptom beside it", map[string]alertSeen{"APIProcessDown": fired(3*time.Second, true), "HTTPServerErrors": fired(time.Second, true)}, ""},
		{"not fired", map[string]alertSeen{}, "missed: APIProcessDown did not fire"},
		{"fired past its bound", map[string]alertSeen{"APIProcessDown": fired(12*time.Second, true)}, "missed: APIProcessDown fired 12s after"},
		{"never resolved", map[string]alertSeen{"APIProcessDown": fired(3*time.Second, false)}, "unresolved: APIProcessDown"},
		{"another alert", map[string]alertSeen{"APIProcessDown": fired(3*time.Second, true), "OutboxLagging": fired(4*time.Second, true)}, "unexpected: OutboxLagging"},
		{"a tolerated alert before the fault", map[string]alertSeen{"APIProcessDown": fired(3*time.Second, true), "HTTPServerErrors": fired(-time.Second, true)}, "unexpected: HTTPServerErrors (fired before the fault)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := judgeAlerts(spec, tc.seen, start)
			var found []string
			for _, m := range a.missed {
				found = append(found, "missed: "+m)
			}
			for _, u := range a.unexpected {
				found = append(found, "unexpected: "+u)
			}
			for _, u := range a.unresolved {
				found = append(found, "unresolved: "+u)
			}
			if tc.want == "" {
				if len(found) != 0 || !a.passed() {
					t.Fatalf("findings %q, want none", found)
				}
				return
			}
			if len(found) != 1 || !strings.HasPrefix(found[0], tc.want) || a.passed() {
				t.Fatalf("findings %q (passed %v), want one starting %q", found, a.passed(), tc.want)
			}
		})
	}
	// The control of the alerts: nothing declared, anything fired fails.
	if a := judgeAlerts(alertSpec{}, map[string]alertSeen{"DatabasePoolSaturated": fired(time.Second, true)}, start); a.passed() || !slices.Contains(a.unexpected, "DatabasePoolSaturated") {
		t.Errorf("a no-fault run that fired DatabasePoolSaturated: %+v, want a false page", a)
	}
}

// The receiver keeps an alert firing while any instance fires, and
// resolved once the last one resolves.
func TestPageLogTracksEachAlertByItsInstances(t *testing.T) {
	var p pageLog
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	n := func(status, fingerprint string) notification {
		var x notification
		x.Alerts = append(x.Alerts, struct {
			Status      string            `json:"status"`
			Labels      map[string]string `json:"labels"`
			Fingerprint string            `json:"fingerprint"`
		}{status, map[string]string{"alertname": "APIProcessDown"}, fingerprint})
		return x
	}
	p.record(at, n("resolved", "x")) // resolved before the log began: ignored
	p.record(at.Add(time.Second), n("firing", "a"))
	p.record(at.Add(2*time.Second), n("firing", "b"))
	p.record(at.Add(3*time.Second), n("resolved", "a"))
	s := p.snapshot()["APIProcessDown"]
	if !s.firstFired.Equal(at.Add(time.Second)) || len(s.firing) != 1 {
		t.Fatalf("after one of two resolved: %+v, want fired at +1s, one instance firing", s)
	}
	p.record(at.Add(4*time.Second), n("resolved", "b"))
	if s := p.snapshot()["APIProcessDown"]; len(s.firing) != 0 || !s.resolvedAt.Equal(at.Add(4*time.Second)) {
		t.Fatalf("after both resolved: %+v, want resolved at +4s", s)
	}
}

// The alerts' negative control misspells one rule's metric and nothing
// else, and passes only when exactly that page is reported missed.
func TestBrokenRuleMisspellsOneMetricAndMustBeCaught(t *testing.T) {
	src, err := os.ReadFile("../../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	b := brokenRule{alert: "OutboxLagging", metric: "outbox_lag_seconds"}
	broken, err := breakRule(src, b)
	if err != nil {
		t.Fatal(err)
	}
	before, after := readRules(t, src), readRules(t, broken)
	changed := 0
	for g := range before.Groups {
		for i, r := range before.Groups[g].Rules {
			s := after.Groups[g].Rules[i]
			if s.Expr == r.Expr {
				continue
			}
			changed++
			if r.Alert != b.alert || s.Expr != strings.ReplaceAll(r.Expr, b.metric, b.metric+"_misspelled") {
				t.Errorf("%s: expression %q, want only %s misspelled in %s", r.Alert, s.Expr, b.metric, b.alert)
			}
		}
	}
	if changed != 1 {
		t.Errorf("%d rules changed, want 1", changed)
	}
	if _, err := breakRule(src, brokenRule{alert: "OutboxLagging", metric: "up"}); err == nil {
		t.Error("a metric the alert does not name was broken without an error")
	}

	start := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	spec := alertSpec{pages: []page{{alert: "OutboxLagging", within: 10 * time.Second}}, broken: &b}
	if a := judgeAlerts(spec, map[string]alertSeen{}, start); !a.passed() {
		t.Errorf("the broken rule's page missed: %+v, want the control passed", a)
	}
	fired := map[string]alertSeen{"OutboxLagging": {firstFired: start.Add(time.Second), firing: map[string]bool{}}}
	if a := judgeAlerts(spec, fired, start); a.passed() {
		t.Errorf("the broken rule's page fired: %+v, want the control failed", a)
	}
}

// The short mode's faults are too brief for a page whose for is as long
// as they are: such a page, marked long, is tolerated there and required
// in the long mode.
func TestLongPagesAreToleratedInTheShortMode(t *testing.T) {
	spec := alertSpec{pages: []page{{alert: "TransientFailures", within: 30 * time.Second, long: true}, {alert: "APIProcessDown", within: 10 * time.Second, long: false}}}
	short := spec.inMode(false)
	if len(short.pages) != 1 || short.pages[0].alert != "APIProcessDown" || !slices.Equal(short.tolerates, []string{"TransientFailures"}) {
		t.Errorf("short mode: %+v, want APIProcessDown required and TransientFailures tolerated", short)
	}
	if long := spec.inMode(true); len(long.pages) != 2 || len(long.tolerates) != 0 {
		t.Errorf("long mode: %+v, want both required", long)
	}
	if len(spec.tolerates) != 0 {
		t.Errorf("inMode changed the spec it was given: %+v", spec)
	}
}
