package main

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func noEnv(string) string { return "" }

func TestCapacityOptions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		args     []string
		rounds   int
		duration time.Duration
	}{
		{"Defaults", []string{"-capacity"}, 3, 20 * time.Second},
		{"Short", []string{"-capacity", "-short"}, 1, 2 * time.Second},
		{"ExplicitFlagsWin", []string{"-capacity", "-short", "-rounds", "2", "-duration", "5s"}, 2, 5 * time.Second},
		{"OtherModesKeepTheirs", []string{"-short"}, 2, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseOptions(tt.args, noEnv)
			if err != nil {
				t.Fatal(err)
			}
			if o.rounds != tt.rounds || o.duration != tt.duration {
				t.Errorf("rounds %d, duration %s; want %d, %s", o.rounds, o.duration, tt.rounds, tt.duration)
			}
		})
	}
	o, err := parseOptions([]string{"-capacity", "-sync-standby", "-capacity-json", "x.json"}, noEnv)
	if err != nil || !o.capacity || !o.syncStandby || o.capacityJSON != "x.json" {
		t.Errorf("parseOptions = %+v, %v", o, err)
	}
	for _, args := range [][]string{
		{"-sync-standby"},
		{"-capacity-json", "x.json"},
		{"-capacity", "-pgbench"},
		{"-capacity", "-stored-keys", "10"},
	} {
		if _, err := parseOptions(args, noEnv); err == nil {
			t.Errorf("parseOptions(%q) accepted it", args)
		}
	}
}

// TestCapacityPerVCPU: the window's commits and CPU, with the idle
// server's share taken off for the settle, divided by the requests and
// by the CPU.
func TestCapacityPerVCPU(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	loadEnd := t0.Add(20 * time.Second)
	r0 := pgReading{at: t0, commits: 1000, rollbacks: 5, cpu: 100}
	r1 := pgReading{at: loadEnd.Add(10 * time.Second), commits: 1000 + 50_000 + 30, rollbacks: 7, cpu: 100 + 25 + 0.5}
	out := outcome{ok: 10_000, elapsed: 20 * time.Second, latencies: []time.Duration{time.Millisecond}}
	s := newSample(scenarioPayment, 2, out, [3]int{0, 0, 10_000}, r0, r1, loadEnd, idleRates{commits: 3, cpu: 0.05})
	if s.commits != 50_000 || s.cpu != 25 || s.rollbacks != 2 || s.payments != 10_000 || s.round != 2 {
		t.Fatalf("sample = %+v; want 50000 commits, 25 s of CPU, 2 rollbacks", s)
	}
	got := s.figures()
	want := capacityFigures{rps: 500, tps: 2500, tpsPerVCPU: 2000, rpsPerVCPU: 400, commitsPerRequest: 5, busy: 1.25}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(capacityFigures{})); diff != "" {
		t.Error(diff)
	}
	if err := s.plausible(); err != nil {
		t.Error(err)
	}
	s.cpu = 0
	if err := s.plausible(); err == nil {
		t.Error("a run without PostgreSQL's CPU is plausible")
	}
}

func TestCapacityLatencyStats(t *testing.T) {
	t.Parallel()
	var l []time.Duration
	for i := 100; i >= 1; i-- {
		l = append(l, time.Duration(i)*time.Millisecond)
	}
	got := latencyStats(l)
	if got.p50 != 50 || got.p95 != 95 || got.p99 != 99 || got.avg != 50.5 {
		t.Errorf("latencyStats = %+v; want p50 50, p95 95, p99 99, avg 50.5", got)
	}
	if want := math.Sqrt((100*100 - 1) / 12.0); math.Abs(got.stddev-want) > 1e-9 {
		t.Errorf("stddev = %v, want %v", got.stddev, want)
	}
	if got := latencyStats([]time.Duration{2 * time.Millisecond}); got.stddev != 0 || got.p99 != 2 {
		t.Errorf("one latency: %+v", got)
	}
	if got := latencyStats(nil); got != (latencyFigures{}) {
		t.Errorf("no latencies: %+v", got)
	}
}

// TestCapacityMix: 60/25/15 in every block of 20, and the payments each
// scenario needs.
func TestCapacityMix(t *testing.T) {
	t.Parallel()
	var n [3]int
	for i := range int64(200) {
		n[mixKind(i)]++
	}
	if n != [3]int{120, 50, 30} {
		t.Errorf("200 requests of the mix: %v creates, replays, payments; want 120, 50, 30", n)
	}
	last := map[string]float64{scenarioCreate: 1000}
	if got := paymentsNeeded(scenarioCreate, last, 20*time.Second, 32); got != 0 {
		t.Errorf("create needs %d orders to pay", got)
	}
	if got := paymentsNeeded(scenarioPayment, last, 20*time.Second, 32); got != 30_032 {
		t.Errorf("payment, before it ran, needs %d; want 1000/s x 20 s x 1.5 + 32", got)
	}
	last[scenarioMix] = 400
	if got := paymentsNeeded(scenarioMix, last, 10*time.Second, 8); got != 908 {
		t.Errorf("mix needs %d; want 400/s x 0.15 x 10 s x 1.5 + 8", got)
	}
}

func TestCapacityCheckEffects(t *testing.T) {
	t.Parallel()
	before := effects{orders: 10, payments: 3, charges: 3}
	s := capacitySample{scenario: scenarioMix, creates: 12, replays: 5, payments: 3}
	if err := checkEffects(s, before, effects{orders: 22, payments: 6, charges: 6}); err != nil {
		t.Error(err)
	}
	for _, after := range []effects{
		{orders: 23, payments: 6, charges: 6}, // a replay executed
		{orders: 22, payments: 5, charges: 6},
		{orders: 22, payments: 6, charges: 7}, // a charge twice
	} {
		if err := checkEffects(s, before, after); err == nil {
			t.Errorf("%+v after %+v passed", after, before)
		}
	}
}

// TestCapacityJSONShape: the results file keeps the top-level fields of
// PostgresBench's results files, and each run its figures.
func TestCapacityJSONShape(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	var samples []capacitySample
	for round := 1; round <= 3; round++ {
		for _, name := range capacityScenarios {
			out := outcome{ok: 100, elapsed: time.Second, latencies: []time.Duration{time.Millisecond, 3 * time.Millisecond}}
			samples = append(samples, newSample(name, round, out, [3]int{100, 0, 0}, pgReading{at: t0}, pgReading{at: t0, commits: 150, cpu: 0.1}, t0, idleRates{}))
		}
	}
	c := &capacityRun{o: options{concurrency: 32, pool: 4, rounds: 3, duration: 20 * time.Second, syncStandby: true},
		settings: map[string]string{"server_version": "15.20", "fsync": "on", "synchronous_commit": "on"}, storage: "ext4"}
	b, err := json.Marshal(c.result(samples))
	if err != nil {
		t.Fatal(err)
	}
	var file map[string]any
	if err := json.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	postgresBench := []string{"system", "date", "instance", "machine", "cluster_size", "tuned", "comment", "postgres_version", "benchmark", "load", "results"}
	for _, k := range postgresBench {
		if _, ok := file[k]; !ok {
			t.Errorf("no %q", k)
		}
	}
	for _, k := range []string{"type", "vcpus", "ram_gb", "instance_storage", "primary_storage"} {
		if _, ok := file["instance"].(map[string]any)[k]; !ok {
			t.Errorf("no instance.%s", k)
		}
	}
	for _, k := range []string{"tool", "workload", "clients", "threads", "duration", "query_mode", "sync_standby"} {
		if _, ok := file["benchmark"].(map[string]any)[k]; !ok {
			t.Errorf("no benchmark.%s", k)
		}
	}
	results := file["results"].([]any)
	if len(results) != 9 {
		t.Fatalf("%d results; want 3 scenarios x 3 runs", len(results))
	}
	run := results[0].(map[string]any)
	var keys []string
	for k := range run {
		keys = append(keys, k)
	}
	for _, k := range []string{"run", "tps", "transactions", "failed_transactions", "latency_avg_ms", "latency_stddev_ms", "latency_p95_ms", "latency_p99_ms",
		"scenario", "tps_per_vcpu", "rps_per_vcpu", "commits_per_request", "postgres_cpu_seconds"} {
		if !slices.Contains(keys, k) {
			t.Errorf("a run has no %q (it has %s)", k, strings.Join(keys, ", "))
		}
	}
	if run["tps_per_vcpu"] != 1500.0 || run["commits_per_request"] != 1.5 || run["tps"] != 150.0 || run["latency_avg_ms"] != 2.0 {
		t.Errorf("a run's figures: %v", run)
	}
	if file["cluster_size"] != 2.0 || file["benchmark"].(map[string]any)["sync_standby"] != "yes" {
		t.Errorf("with the standby: cluster_size %v, sync_standby %v", file["cluster_size"], file["benchmark"].(map[string]any)["sync_standby"])
	}
	if n := len(file["summary"].([]any)); n != 3 {
		t.Errorf("%d summaries; want one per scenario", n)
	}
}

// TestCapacityPostgresCPU: the CPU of a process's live children, then of
// the same children once reaped, both counted, and never backwards.
func TestCapacityPostgresCPU(t *testing.T) {
	before, err := postgresCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; read x; exit 0")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var live float64
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if live, err = postgresCPU(os.Getpid()); err != nil {
			t.Fatal(err)
		}
		if live-before >= 0.1 {
			break
		}
	}
	if live-before < 0.1 {
		t.Fatalf("a live busy child: %.2f s, before it %.2f s", live, before)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	reaped, err := postgresCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if reaped < live {
		t.Errorf("after the child was reaped %.2f s, while it lived %.2f s", reaped, live)
	}
}
