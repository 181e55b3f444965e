package main

import (
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	vegeta "github.com/tsenart/vegeta/v12/lib"

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

// TestPgbenchVariantsDifferByOnePiece: each variant of the create leaves
// out exactly what its name says, and keeps the create's round trips; the
// limit writes the order and the key row once, as the record leaves it.
func TestPgbenchVariantsDifferByOnePiece(t *testing.T) {
	scripts := map[string]string{}
	for _, v := range pgbenchVariants() {
		scripts[v.name] = v.script
	}
	create := scripts["create"]
	for _, want := range []string{"set_config('lock_timeout'", "reclaimed AS", "SAVEPOINT sp_1", "RELEASE SAVEPOINT sp_1", "INSERT INTO orders", "UPDATE idempotency_keys SET state = 'completed'"} {
		if !strings.Contains(create, want) {
			t.Errorf("the create script lacks %q", want)
		}
	}
	for name, gone := range map[string]string{"no-lock-timeout": "set_config", "no-savepoint": "SAVEPOINT", "no-reclaim": "reclaimed AS"} {
		if strings.Contains(scripts[name], gone) {
			t.Errorf("%s still has %q", name, gone)
		}
	}
	for name, table := range map[string]string{"no-fk": "keys_nofk", "no-checks": "keys_nochecks", "no-guard-trigger": "keys_notrigger"} {
		if want := strings.ReplaceAll(create, "idempotency_keys", table); scripts[name] != want {
			t.Errorf("%s is not the create on %s", name, table)
		}
	}

	limit := scripts["limit"]
	for _, want := range []string{"INSERT INTO orders", "INSERT INTO idempotency_keys", "'completed', 201", `'{"Content-Type": ["application/json"]}'::jsonb`, "'/v1/orders/x', now()", "RETURNING expires_at"} {
		if !strings.Contains(limit, want) {
			t.Errorf("the limit script lacks %q", want)
		}
	}
	// The same response as the create records, and nothing the floor does
	// not need: no second write of the key row, no conflict handling.
	body := "'\\x" + strings.Repeat("7b", 420) + "'"
	if !strings.Contains(limit, body) || !strings.Contains(create, body) {
		t.Error("the limit and the create do not record the same body")
	}
	for _, gone := range []string{"UPDATE", "ON CONFLICT (tenant_id, endpoint, idem_key)", "SAVEPOINT", "set_config"} {
		if strings.Contains(limit, gone) {
			t.Errorf("the limit has %q", gone)
		}
	}

	for name, s := range scripts {
		if n, want := strings.Count(s, `\startpipeline`), map[bool]int{true: 1, false: 3}[name == "baseline" || name == "limit"]; n != want {
			t.Errorf("%s has %d round trips, want %d", name, n, want)
		}
	}
}

// TestPgbenchCopiesLackOnePiece: each copy of the key table gets back the
// foreign key and the trigger that LIKE leaves behind, as the migrations
// define them, except the one its variant measures.
func TestPgbenchCopiesLackOnePiece(t *testing.T) {
	words := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	migration, err := fs.ReadFile(migrations.FS, "000012_guarded_transitions.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	for table, without := range map[string]string{"keys_nofk": "fk", "keys_nochecks": "checks", "keys_notrigger": "trigger"} {
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
