package main

import (
	"strings"
	"testing"
	"time"
)

func TestSoakHorizonsScaleByOneFactor(t *testing.T) {
	t.Parallel()
	want := map[string]time.Duration{
		"IDEMPOTENCY_TTL":              200 * time.Second,
		"IDEMPOTENCY_KEY_RETENTION":    10 * time.Minute,
		"REAPER_INTERVAL":              139 * time.Millisecond,
		"MESSAGE_RETENTION":            1400 * time.Second,
		"PROCESSOR_WEBHOOK_RETRY_SPAN": 10 * time.Minute,
	}
	got := soakHorizons(soakFactor)
	if len(got) != len(want) {
		t.Fatalf("%d horizons, want %d", len(got), len(want))
	}
	for _, h := range got {
		if h.scaled != want[h.name] {
			t.Errorf("%s = %s, want %s", h.name, h.scaled, want[h.name])
		}
		if ratio := float64(h.def) / float64(h.scaled); ratio < soakFactor*0.99 || ratio > soakFactor*1.01 {
			t.Errorf("%s: %s / %s = %.1f, want %d", h.name, h.def, h.scaled, ratio, soakFactor)
		}
	}
	if _, retention, _ := soakScaled(soakFactor); retention > 10*time.Minute {
		t.Errorf("retention %s: want at most a third of a 30-minute run", retention)
	}
}

func TestSoakHorizonsPassTheAPIsRules(t *testing.T) {
	t.Parallel()
	if err := checkSoakConfig(soakFactor); err != nil {
		t.Fatal(err)
	}
	// A factor that takes MESSAGE_RETENTION under the broker's
	// redelivery horizon (15.5 min) is refused, naming the rule.
	err := checkSoakConfig(1000)
	if err == nil || !strings.Contains(err.Error(), "MESSAGE_RETENTION") {
		t.Errorf("factor 1000: err = %v, want MESSAGE_RETENTION's rule", err)
	}
}

func TestParseSoakOptions(t *testing.T) {
	t.Parallel()
	none := func(string) string { return "" }
	o, err := parseOptions([]string{"-soak", "30m"}, none)
	if err != nil {
		t.Fatal(err)
	}
	if o.soak != 30*time.Minute || o.soakInterval != time.Minute || o.concurrency != soakConcurrency {
		t.Errorf("soak %s, interval %s, c %d; want 30m, 1m, %d", o.soak, o.soakInterval, o.concurrency, soakConcurrency)
	}
	if o, err = parseOptions([]string{"-soak", "1m", "-c", "32", "-soak-interval", "10s"}, none); err != nil || o.concurrency != 32 || o.soakInterval != 10*time.Second {
		t.Errorf("explicit -c and -soak-interval: %+v, %v", o, err)
	}
	if o, err = parseOptions(nil, none); err != nil || o.concurrency != 32 || o.soak != 0 {
		t.Errorf("without -soak: c %d soak %s, %v; want the benchmark's c=32", o.concurrency, o.soak, err)
	}
	for _, args := range [][]string{
		{"-soak", "-1m"},
		{"-soak", "1m", "-soak-interval", "2m"},
		{"-soak", "1m", "-soak-interval", "0s"},
		{"-soak-plot", "x.png"},
		{"-soak", "1m", "-pgbench"},
		{"-soak", "1m", "-stored-keys", "10"},
		{"-soak-rate", "100"},
		{"-soak", "1m", "-soak-rate", "-5"},
	} {
		if _, err := parseOptions(args, none); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

// steady makes n rows a minute apart, each from f(i).
func steady(n int, f func(i int, r *soakRow)) []soakRow {
	rows := make([]soakRow, n)
	for i := range rows {
		rows[i] = soakRow{end: time.Duration(i+1) * time.Minute, interval: time.Minute, total: 1000, p99All: 20, heap: 30 << 20, indexes: 10 << 20}
		f(i, &rows[i])
	}
	return rows
}

func checkNamed(t *testing.T, j soakJudgement, name string) soakCheck {
	t.Helper()
	for _, c := range j.checks {
		if c.name == name {
			return c
		}
	}
	t.Fatalf("no check %q", name)
	return soakCheck{}
}

func TestJudgeSoak(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		rows    []soakRow
		check   string
		judged  bool
		pass    bool
		verdict string
	}{
		{"SteadyPasses", steady(30, func(int, *soakRow) {}), "throughput drift", true, true, "PASS"},
		{"DriftWithinTenPercent", steady(30, func(i int, r *soakRow) {
			if i >= 25 {
				r.total = 905
			}
		}), "throughput drift", true, true, "PASS"},
		{"DriftPastTenPercent", steady(30, func(i int, r *soakRow) {
			if i >= 25 {
				r.total = 880
			}
		}), "throughput drift", true, false, "FAIL"},
		// Growth before the retention horizon is the growth phase.
		{"GrowthThenPlateau", steady(30, func(i int, r *soakRow) {
			r.heap = int64(min(i, 10)) << 22
		}), "key table plateau", true, true, "PASS"},
		{"StillGrowing", steady(30, func(i int, r *soakRow) {
			r.heap = int64(i) << 22
		}), "key table plateau", true, false, "FAIL"},
		{"ReaperBehind", steady(30, func(i int, r *soakRow) {
			r.deleteLag = float64(i) * 10
		}), "reaper keeps up", true, false, "FAIL"},
		{"ReaperWithinLimit", steady(30, func(i int, r *soakRow) {
			r.pruneLag = 60
		}), "reaper keeps up", true, true, "PASS"},
		{"P99Step", steady(30, func(i int, r *soakRow) {
			if i >= 20 {
				r.p99All = 31
			}
		}), "no p99 step", true, false, "FAIL"},
		{"P99OneSpikeIsNoStep", steady(30, func(i int, r *soakRow) {
			if i == 29 {
				r.p99All = 500
			}
		}), "no p99 step", true, true, "PASS"},
		{"ShortRunLeavesThePlateau", steady(6, func(int, *soakRow) {}), "key table plateau", false, false, "INCOMPLETE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := judgeSoak(tt.rows, time.Minute, soakFactor, 0)
			c := checkNamed(t, j, tt.check)
			if c.judged != tt.judged || c.pass != tt.pass {
				t.Errorf("%s: judged %t pass %t, want %t %t (%s)", tt.check, c.judged, c.pass, tt.judged, tt.pass, c.detail)
			}
			if v, _ := soakVerdict(j.checks); v != tt.verdict {
				t.Errorf("verdict %s, want %s", v, tt.verdict)
			}
		})
	}
}

// At an offered rate, keeping pace with it is part of the drift rule: a
// run as steady from start to end, but answering less than is offered,
// fails.
func TestSoakDriftAtAnOfferedRate(t *testing.T) {
	t.Parallel()
	rows := steady(30, func(int, *soakRow) {}) // 1,000 requests/s throughout
	for _, tt := range []struct {
		offered float64
		pass    bool
	}{{1000, true}, {1100, true}, {1120, false}} {
		if c := checkNamed(t, judgeSoak(rows, time.Minute, soakFactor, tt.offered), "throughput drift"); c.pass != tt.pass {
			t.Errorf("1,000/s answered of %.0f/s offered: pass %t, want %t (%s)", tt.offered, c.pass, tt.pass, c.detail)
		}
	}
}

func TestSoakLagLimit(t *testing.T) {
	t.Parallel()
	// Two scaled reaper intervals (139 ms each) and a sampling interval.
	rows := steady(30, func(i int, r *soakRow) { r.pruneLag = 60.3 })
	if c := checkNamed(t, judgeSoak(rows, time.Minute, soakFactor, 0), "reaper keeps up"); c.pass {
		t.Errorf("lag 60.3 s passed: %s", c.detail)
	}
	rows = steady(30, func(i int, r *soakRow) { r.pruneLag = 60.2 })
	if c := checkNamed(t, judgeSoak(rows, time.Minute, soakFactor, 0), "reaper keeps up"); !c.pass {
		t.Errorf("lag 60.2 s failed: %s", c.detail)
	}
}

func TestSoakPlateauSize(t *testing.T) {
	t.Parallel()
	rows := steady(30, func(i int, r *soakRow) { r.heap, r.indexes = 30<<20, 10<<20 })
	if got := judgeSoak(rows, time.Minute, soakFactor, 0).plateau; got != 40<<20 {
		t.Errorf("plateau %d bytes, want 40 MB", got)
	}
	if got := judgeSoak(rows[:6], time.Minute, soakFactor, 0).plateau; got != 0 {
		t.Errorf("plateau of a 6-minute run %d, want 0 (not judged)", got)
	}
}

func TestSoakCSVPath(t *testing.T) {
	t.Parallel()
	if got := csvPath("docs/soak/soak-2026-01-02.png"); got != "docs/soak/soak-2026-01-02.csv" {
		t.Errorf("csvPath = %q", got)
	}
	if len(soakColumns) != len(soakRow{}.cells()) || len(soakHeads) != len(soakColumns) || len(soakWidths) != len(soakColumns) {
		t.Error("the table's columns, headings, widths and cells differ in number")
	}
}
