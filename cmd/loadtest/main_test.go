package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	vegeta "github.com/tsenart/vegeta/v12/lib"
)

func TestSeries(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		s      series
		median float64
		format string
	}{
		{"OddCount", series{3, 1, 2}, 2, "2.0 (1.0–3.0)"},
		{"EvenCount", series{4, 1, 3, 2}, 2.5, "2.5 (1.0–4.0)"},
		{"OneRound", series{7}, 7, "7.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.s.median(); got != tt.median {
				t.Errorf("median = %v, want %v", got, tt.median)
			}
			if got := tt.s.format(1); got != tt.format {
				t.Errorf("format = %q, want %q", got, tt.format)
			}
		})
	}
}

func TestRatioIsPerRound(t *testing.T) {
	t.Parallel()
	if diff := cmp.Diff(series{0.5, 2}, ratio(series{1, 4}, series{2, 2})); diff != "" {
		t.Error(diff)
	}
}

func TestPercentileNearestRank(t *testing.T) {
	t.Parallel()
	var l []time.Duration
	for i := 100; i >= 1; i-- {
		l = append(l, time.Duration(i)*time.Millisecond)
	}
	if got := percentile(l, 99); got != 99*time.Millisecond {
		t.Errorf("p99 = %v, want 99ms", got)
	}
	if got := percentile(l, 50); got != 50*time.Millisecond {
		t.Errorf("p50 = %v, want 50ms", got)
	}
	if got := percentile(l[:1], 99); got != 100*time.Millisecond {
		t.Errorf("p99 of one = %v, want 100ms", got)
	}
}

func TestShortModeKeepsExplicitFlags(t *testing.T) {
	t.Parallel()
	env := func(v string) func(string) string {
		return func(name string) string {
			if name == "LOADTEST_SHORT" {
				return v
			}
			return ""
		}
	}
	o, err := parseOptions([]string{"-rounds", "3"}, env("1"))
	if err != nil {
		t.Fatal(err)
	}
	if !o.short || o.rounds != 3 || o.duration != time.Second {
		t.Errorf("LOADTEST_SHORT=1 -rounds 3: short=%t rounds=%d duration=%s, want true 3 1s", o.short, o.rounds, o.duration)
	}
	o, err = parseOptions(nil, env(""))
	if err != nil {
		t.Fatal(err)
	}
	if o.short || o.rounds != 5 || o.concurrency != 32 || o.pool != 4 || o.storm != 200 {
		t.Errorf("defaults: %+v", o)
	}
}

// The benchmark's checks tell an execution from a replay by the header.
func TestStatusTellsExecutionsFromReplays(t *testing.T) {
	t.Parallel()
	executed := &vegeta.Result{Code: 201, Headers: http.Header{}}
	replayed := &vegeta.Result{Code: 201, Headers: http.Header{"Idempotent-Replayed": {"true"}}}
	conflict := &vegeta.Result{Code: 409, Headers: http.Header{}}
	tests := []struct {
		name   string
		expect expectation
		res    *vegeta.Result
		ok     bool
	}{
		{"ExecutionWhereAnExecutionIsDue", status(201, false), executed, true},
		{"ReplayWhereAnExecutionIsDue", status(201, false), replayed, false},
		{"ReplayWhereAReplayIsDue", status(201, true), replayed, true},
		{"ExecutionWhereAReplayIsDue", status(201, true), executed, false},
		{"OtherStatus", status(201, false), conflict, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.expect(tt.res) == ""; got != tt.ok {
				t.Errorf("accepted = %t, want %t", got, tt.ok)
			}
		})
	}
}
