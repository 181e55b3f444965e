package main

import (
	"bytes"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	vegeta "github.com/tsenart/vegeta/v12/lib"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/idemref/payments/db/migrations"
	"github.com/idemref/payments/internal/tooling/harness"
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
		{"NoNegativeZero", series{-0.01, 0.4, 2}, 0.4, "0.4 (0.0–2.0)"},
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
	if got := harness.Percentile(l, 99); got != 99*time.Millisecond {
		t.Errorf("p99 = %v, want 99ms", got)
	}
	if got := harness.Percentile(l, 50); got != 50*time.Millisecond {
		t.Errorf("p50 = %v, want 50ms", got)
	}
	if got := harness.Percentile(l[:1], 99); got != 100*time.Millisecond {
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

// TestChildrenCPU: -pgbench reads the CPU of the postmaster's exited
// children; here, of a child of the test that burns some.
func TestChildrenCPU(t *testing.T) {
	if ppid, err := parentPid(os.Getpid()); err != nil || ppid != os.Getppid() {
		t.Fatalf("parentPid = %d, %v; want %d", ppid, err, os.Getppid())
	}
	before, err := childrenCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done").Run(); err != nil {
		t.Fatal(err)
	}
	after, err := childrenCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Errorf("children's CPU %.2f s after a busy child, %.2f s before", after, before)
	}
}

// TestPgbenchCopiesLackOnePiece: each copy of the key table gets back the
// foreign key and the trigger that LIKE leaves behind, as the migrations
// define them, except the piece its variant measures (never the trigger).
func TestPgbenchCopiesLackOnePiece(t *testing.T) {
	words := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	migration, err := fs.ReadFile(migrations.FS, "000012_guarded_transitions.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	for table, without := range map[string]string{"keys_nofk": "fk", "keys_nochecks": "checks"} {
		setup := strings.Join(pgbenchCopy(table, without), ";\n")
		has := map[string]bool{
			"fk":      strings.Contains(setup, "ALTER TABLE "+table+" ADD FOREIGN KEY (tenant_id) REFERENCES tenants (id) ON DELETE CASCADE"),
			"checks":  strings.Contains(setup, "INCLUDING ALL"),
			"trigger": strings.Contains(setup, "CREATE TRIGGER"),
		}
		for piece, ok := range has {
			if ok == (piece == without) {
				t.Errorf("%s: has %s = %t", table, piece, ok)
			}
		}
		for _, stmt := range pgbenchCopy(table, without) {
			if strings.HasPrefix(stmt, "CREATE TRIGGER") {
				orig := strings.ReplaceAll(strings.Replace(stmt, table+"_guard_state", "idempotency_keys_guard_state", 1), " ON "+table+" ", " ON idempotency_keys ")
				if !strings.Contains(words(string(migration)), words(orig)) {
					t.Errorf("the trigger on %s is not migration 000012's:\n%s", table, orig)
				}
			}
		}
	}
}

func TestStoredKeysOption(t *testing.T) {
	t.Parallel()
	none := func(string) string { return "" }
	o, err := parseOptions(nil, none)
	if err != nil || o.storedKeys != 0 {
		t.Fatalf("default: storedKeys=%d, %v; want 0 (off)", o.storedKeys, err)
	}
	o, err = parseOptions([]string{"-stored-keys", "20000000", "-short"}, none)
	if err != nil {
		t.Fatal(err)
	}
	if o.storedKeys != 20_000_000 || o.rounds != 2 || o.duration != time.Second {
		t.Errorf("-stored-keys 20000000 -short: storedKeys=%d rounds=%d duration=%s, want 20000000 2 1s", o.storedKeys, o.rounds, o.duration)
	}
	for _, args := range [][]string{
		{"-stored-keys", "-1"},
		{"-stored-keys", "1000", "-pgbench"},
	} {
		if _, err := parseOptions(args, none); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

// No tenant holds more than half the default key budget, so the
// benchmark's creates are never refused for it.
func TestStoredKeyTenants(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]int{1: 1, 200_000: 1, 500_000: 1, 500_001: 2, 20_000_000: 40} {
		if got := storedKeyTenants(n); got != want {
			t.Errorf("storedKeyTenants(%d) = %d, want %d", n, got, want)
		}
	}
	if diff := cmp.Diff([]string{"loadtest", "loadtest-2", "loadtest-3"}, tenantNames(3)); diff != "" {
		t.Error(diff)
	}
}

func TestHumanBytes(t *testing.T) {
	t.Parallel()
	for b, want := range map[int64]string{0: "0 bytes", 1000: "1000 bytes", 8192: "8 kB", 237 << 20: "237 MB", 8_700_000_000: "8.1 GB"} {
		if got := humanBytes(b); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", b, got, want)
		}
	}
}

// The fill drops the table's indexes and builds them again from the
// catalog's definitions; an index a constraint owns goes with it.
func TestKeyIndexStatements(t *testing.T) {
	t.Parallel()
	pk := keyIndex{name: "idempotency_keys_pkey", def: "CREATE UNIQUE INDEX idempotency_keys_pkey ON public.idempotency_keys USING btree (tenant_id, endpoint, idem_key)",
		constraint: "idempotency_keys_pkey", constraintDef: "PRIMARY KEY (tenant_id, endpoint, idem_key)"}
	ix := keyIndex{name: "idempotency_keys_retain_until_idx", def: "CREATE INDEX idempotency_keys_retain_until_idx ON public.idempotency_keys USING btree (retain_until)"}
	for _, tt := range []struct{ got, want string }{
		{pk.dropSQL(), `ALTER TABLE idempotency_keys DROP CONSTRAINT "idempotency_keys_pkey"`},
		{pk.createSQL(), `ALTER TABLE idempotency_keys ADD CONSTRAINT "idempotency_keys_pkey" PRIMARY KEY (tenant_id, endpoint, idem_key)`},
		{ix.dropSQL(), `DROP INDEX "idempotency_keys_retain_until_idx"`},
		{ix.createSQL(), ix.def},
	} {
		if tt.got != tt.want {
			t.Errorf("got  %s\nwant %s", tt.got, tt.want)
		}
	}
}

func TestStoredKeysReport(t *testing.T) {
	t.Parallel()
	table := keyTable{rows: 20_000_000, completed: 6_666_667, tombstones: 13_333_333, heap: 8000 << 20, toast: 8192,
		indexes: []relSize{{"idempotency_keys_pkey", 2000 << 20}, {"idempotency_keys_retain_until_idx", 400 << 20}}}
	r := &storedKeysResults{
		keys: 20_000_000, tenants: 40,
		empty: &side{create: scenario{rps: series{1000, 1200, 1100}, p99: series{40, 50, 45}, requests: 9_000}, executed: 10_000, after: keyTable{rows: 10_001},
			replay: scenario{rps: series{2000, 2100, 1900}, p99: series{20, 22, 21}, requests: 6_000}, stored: storedRows{n: 100_000},
			createIO: ioCounters{keyRead: 900}},
		full: &side{create: scenario{rps: series{900, 1140, 990}, p99: series{50, 60, 55}, requests: 8_000}, executed: 9_000, before: table,
			replay: scenario{rps: series{1000, 1470, 1330}, p99: series{40, 30, 35}, requests: 4_000}, stored: storedRows{n: 20_000_000},
			createIO: ioCounters{keyRead: 8_000, dbRead: 9_000}, replayIO: ioCounters{keyRead: 8_400, keyHit: 3_600}},
		fill:     fillResult{total: 9*time.Minute + 30*time.Second},
		memLimit: 1 << 30, memPeak: 1<<30 - 4096,
	}
	var b strings.Builder
	reportStoredKeys(&b, options{concurrency: 32, rounds: 3}, r)
	out := b.String()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := "loadtest: stored_keys=20000000 tenants=40 create_full_rps=990 create_empty_rps=1100 full_over_empty=0.90 full_over_empty_min=0.90 full_over_empty_max=0.95" +
		" create_full_p99_ms=55.0 create_empty_p99_ms=45.0 rows=20000000 table_mb=8000 toast_mb=0 indexes_mb=2400 fill_s=570" +
		" replay_full_rps=1330 replay_small_rps=2000 replay_full_over_small=0.70 replay_full_p99_ms=35.0 replay_small_p99_ms=21.0" +
		" key_reads_per_create_full=1.00 key_reads_per_create_empty=0.10 key_reads_per_replay_full=2.10 pg_memory_mb=1024 pg_memory_peak_mb=1024"
	if got := lines[len(lines)-1]; got != want {
		t.Errorf("last line:\n got %s\nwant %s", got, want)
	}
	for _, s := range []string{"full / empty, per round, median (range): 0.90 (0.90–0.95)", "idempotency_keys_pkey", "2.0 GB", "7.8 GB",
		"full / small, per round, median (range): 0.70 (0.50–0.70)", "held to 1.0 GB by a memory cgroup"} {
		if !strings.Contains(out, s) {
			t.Errorf("the report lacks %q:\n%s", s, out)
		}
	}
	// The reads per request: key table, whole database, key table hit ratio.
	for _, want := range []string{"create, 20000000 stored keys 1.00 1.12 0.000", "replay, 20000000 stored keys 2.10 0.00 0.300"} {
		found := false
		for _, line := range lines {
			found = found || strings.Join(strings.Fields(line), " ") == want
		}
		if !found {
			t.Errorf("the report lacks the row %q:\n%s", want, out)
		}
	}
}

func TestExecModeOption(t *testing.T) {
	t.Parallel()
	noEnv := func(string) string { return "" }
	o, err := parseOptions([]string{"-exec-mode", "cache_describe"}, noEnv)
	if err != nil || o.execMode != "cache_describe" {
		t.Errorf("-exec-mode cache_describe = %q, %v", o.execMode, err)
	}
	if _, err := parseOptions([]string{"-exec-mode", "prepared"}, noEnv); err == nil {
		t.Error("-exec-mode prepared (not a pgx mode) was accepted")
	}
}

// The span sink counts what an OTLP/HTTP exporter sends it, the server
// spans of creates apart, and answers as a collector does.
func TestSpanSinkCounts(t *testing.T) {
	t.Parallel()
	sink, err := startSpanSink()
	if err != nil {
		t.Fatal(err)
	}
	defer sink.close()
	export := &collectortrace.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{
			{Name: "POST /v1/orders", Kind: tracepb.Span_SPAN_KIND_SERVER},
			{Name: "POST /v1/orders", Kind: tracepb.Span_SPAN_KIND_INTERNAL},
			{Name: "idempotency.execute"},
		}}},
	}}}
	b, err := proto.Marshal(export)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.Post(sink.url+"/v1/traces", "application/x-protobuf", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "application/x-protobuf" {
		t.Errorf("answer %d %s, want 200 application/x-protobuf", res.StatusCode, res.Header.Get("Content-Type"))
	}
	res, err = http.Post(sink.url+"/v1/traces", "application/x-protobuf", strings.NewReader("not protobuf\xff"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if diff := cmp.Diff(sinkCounts{spans: 3, createSpans: 1, badExports: 1}, sink.counts(), cmp.AllowUnexported(sinkCounts{})); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
}

// TestReportSummaryLine: the last line keeps its fields and has the peers'
// (P8): peers=N, payment_over_baseline, crash_dups_ours, and per peer its
// requests/s over ours and its crash test's duplicates, each a median of
// per-round ratios.
func TestReportSummaryLine(t *testing.T) {
	t.Parallel()
	sc := func(rps ...float64) scenario {
		return scenario{rps: rps, p50: series{1, 1}, p99: series{2, 2}, requests: 10}
	}
	r := &results{
		create: sc(100, 200), baseline: sc(125, 250), replay: sc(400, 800), get: sc(500, 500), payment: sc(30, 60),
		traced: sc(80, 160), paymentBaseline: sc(40, 80), claimFirst: sc(80, 180), fiber: sc(150, 300), fiberPlain: sc(200, 400),
		stormP99: series{50, 60}, storms: 2, stormExecutions: 2,
		crash: map[string]*crashResult{
			"ours":         {trials: 3, replays: 3, answers: map[string]int{"201 replayed": 3}},
			peerFiber:      {trials: 3, duplicates: 3, answers: map[string]int{"409 order_reference_exists": 3}},
			peerClaimFirst: {trials: 3, replays: 3, answers: map[string]int{"201 replayed": 3}},
		},
	}
	var out bytes.Buffer
	report(&out, options{rounds: 2, concurrency: 32, samples: 1, storm: 200}, r)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	last := lines[len(lines)-1]
	fields := map[string]string{}
	for f := range strings.FieldsSeq(strings.TrimPrefix(last, "loadtest: ")) {
		name, value, _ := strings.Cut(f, "=")
		fields[name] = value
	}
	for name, want := range map[string]string{
		"p1": "0.80", "p3": "0.30", "peers": "2", "payment_over_baseline": "0.75",
		"crash_dups_ours": "0", "crash_dups_fiber": "3", "crash_dups_claim_first": "0",
		"fiber_over_ours": "1.50", "claim_first_over_ours": "0.85", "fiber_own": "0.75",
	} {
		if got := fields[name]; got != want {
			t.Errorf("%s=%q in the last line, want %q:\n%s", name, got, want, last)
		}
	}
	if !strings.HasPrefix(last, "loadtest: p1=") {
		t.Errorf("the last line does not start as .ci/run expects: %s", last)
	}
	if !strings.Contains(out.String(), "  fiber       3       0         3 ") {
		t.Errorf("no crash test row for fiber:\n%s", out.String())
	}
}

// TestRedisMissingSaysWhatToInstall: without redis-server on PATH the
// benchmark names the Debian package to install, and starts nothing.
func TestRedisMissingSaysWhatToInstall(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	r, err := startRedis(t.Context(), t.TempDir())
	if err == nil {
		r.stop()
		t.Fatal("startRedis found a redis-server on an empty PATH")
	}
	if !strings.Contains(err.Error(), "apt-get install redis-server") {
		t.Errorf("startRedis without redis-server = %v, want it to name the package to install", err)
	}
}
