package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/idemref/payments/internal/db/dbsqlc"
)

// pgbenchTrips splits a script into its round trips, each statement named
// by what it is.
func pgbenchTrips(t *testing.T, script string) [][]string {
	t.Helper()
	kinds := []struct{ prefix, kind string }{
		{"BEGIN READ WRITE;", "BEGIN"},
		{"COMMIT;", "COMMIT"},
		{"SELECT 1;", "SELECT 1"},
		{"SELECT set_config('lock_timeout', '2000ms', true);", "lock_timeout"},
		{"SAVEPOINT sp_1;", "SAVEPOINT"},
		{"RELEASE SAVEPOINT sp_1;", "RELEASE"},
		{"SELECT pg_advisory_xact_lock(", "advisory lock"},
		{"SELECT tenant_id, endpoint, idem_key,", "pre-read"},
		{"SELECT idem_key_absent(", "absent"},
		{"INSERT INTO orders ", "order"},
		{"WITH inserted AS (INSERT INTO idempotency_keys ", "claim"},
		{"UPDATE idempotency_keys SET state = 'completed'", "complete"},
		{"INSERT INTO idempotency_keys ", "completed"},
		{"INSERT INTO keys_nofk ", "completed"},
		{"INSERT INTO keys_nochecks ", "completed"},
	}
	var trips [][]string
	var trip []string
	open := false
	for line := range strings.Lines(script) {
		line = strings.TrimSuffix(line, "\n")
		switch {
		case strings.HasPrefix(line, `\set `):
		case line == `\startpipeline`:
			if open {
				t.Fatalf("a pipeline starts inside another:\n%s", script)
			}
			open, trip = true, []string{}
		case line == `\endpipeline`:
			if !open {
				t.Fatalf("a pipeline ends that did not start:\n%s", script)
			}
			open, trips = false, append(trips, trip)
		default:
			if !open {
				t.Fatalf("a statement outside any pipeline: %q", line)
			}
			kind := "unknown: " + line
			for _, k := range kinds {
				if strings.HasPrefix(line, k.prefix) {
					kind = k.kind
					break
				}
			}
			trip = append(trip, kind)
		}
	}
	if open {
		t.Fatalf("a pipeline is not ended:\n%s", script)
	}
	return trips
}

func pgbenchScripts() map[string]string {
	scripts := map[string]string{}
	for _, v := range pgbenchVariants() {
		scripts[v.name] = v.script
	}
	return scripts
}

// TestPgbenchRoundTrips: every variant sends the statements its name says,
// in the round trips the API (or the alternative) uses.
func TestPgbenchRoundTrips(t *testing.T) {
	newShape := [][]string{
		{"pre-read", "absent", "BEGIN", "lock_timeout", "order"},
		{"completed", "COMMIT"},
	}
	want := map[string][][]string{
		"baseline":     {{"BEGIN", "order", "COMMIT"}},
		"baseline-3rt": {{"BEGIN", "SELECT 1"}, {"order"}, {"SELECT 1", "COMMIT"}},
		"limit":        {{"BEGIN", "order", "completed", "COMMIT"}},
		"create":       newShape,
		"no-lock-timeout": {
			{"pre-read", "absent", "BEGIN", "order"},
			{"completed", "COMMIT"},
		},
		"savepoint": {
			{"pre-read", "absent", "BEGIN", "lock_timeout", "SAVEPOINT", "order"},
			{"RELEASE", "completed", "COMMIT"},
		},
		"lookup-apart": {
			{"pre-read"},
			{"BEGIN", "lock_timeout", "order"},
			{"completed", "COMMIT"},
		},
		"no-lookup": {
			{"BEGIN", "lock_timeout", "order"},
			{"completed", "COMMIT"},
		},
		"no-fk":     newShape,
		"no-checks": newShape,
		"claim-first": {
			{"BEGIN", "lock_timeout", "claim"},
			{"SAVEPOINT", "order"},
			{"RELEASE", "complete", "COMMIT"},
		},
		"advisory-lock": {
			{"BEGIN", "lock_timeout", "advisory lock", "pre-read"},
			{"SAVEPOINT", "order"},
			{"RELEASE", "completed", "COMMIT"},
		},
	}
	variants := pgbenchVariants()
	var names []string
	for _, v := range variants {
		names = append(names, v.name)
		if v.what == "" {
			t.Errorf("%s says nothing of what it is", v.name)
		}
	}
	if names[0] != "baseline" {
		t.Errorf("the first variant is %s, want baseline", names[0])
	}
	if diff := cmp.Diff(slices.Sorted(slices.Values(names)), slices.Sorted(func(yield func(string) bool) {
		for name := range want {
			if !yield(name) {
				return
			}
		}
	})); diff != "" {
		t.Errorf("variants (-got +want):\n%s", diff)
	}
	for _, v := range variants {
		if diff := cmp.Diff(want[v.name], pgbenchTrips(t, v.script)); diff != "" {
			t.Errorf("%s's round trips (-want +got):\n%s", v.name, diff)
		}
	}
}

// TestPgbenchAblationsLeaveOutOnePiece: each ablation is the create
// without exactly the piece its name says.
func TestPgbenchAblationsLeaveOutOnePiece(t *testing.T) {
	scripts := pgbenchScripts()
	create := scripts["create"]
	without := func(s string, pred func(line string) bool) string {
		var b strings.Builder
		for line := range strings.Lines(s) {
			if !pred(line) {
				b.WriteString(line)
			}
		}
		return b.String()
	}
	if !strings.HasPrefix(create, "\\set k random(1, 100000000000000)\n\\startpipeline\nSELECT tenant_id,") {
		t.Fatalf("the create does not start with the pre-read:\n%s", create)
	}
	lookup := func(l string) bool {
		return strings.HasPrefix(l, "SELECT tenant_id,") || strings.HasPrefix(l, "SELECT idem_key_absent(")
	}
	want := map[string]string{
		"no-lock-timeout": without(create, func(l string) bool { return strings.Contains(l, "set_config('lock_timeout'") }),
		"no-lookup":       without(create, lookup),
		"no-fk":           strings.ReplaceAll(create, "idempotency_keys", "keys_nofk"),
		"no-checks":       strings.ReplaceAll(create, "idempotency_keys", "keys_nochecks"),
	}
	for name, w := range want {
		if w == create {
			t.Errorf("%s: the piece is not in the create", name)
		}
		if scripts[name] != w {
			t.Errorf("%s is not the create without its piece:\n%s", name, cmp.Diff(w, scripts[name]))
		}
	}
	// savepoint is the create with its one piece more.
	if got := without(scripts["savepoint"], func(l string) bool { return strings.Contains(l, "SAVEPOINT sp_1") }); got == scripts["savepoint"] || got != create {
		t.Errorf("savepoint is not the create with a savepoint:\n%s", cmp.Diff(create, got))
	}
	// The copies the two last write lack only their piece.
	for table, piece := range map[string]string{"keys_nofk": "fk", "keys_nochecks": "checks"} {
		setup := strings.Join(pgbenchCopy(table, piece), ";\n")
		if has := strings.Contains(setup, "ADD FOREIGN KEY (tenant_id) REFERENCES tenants (id)"); has != (piece != "fk") {
			t.Errorf("%s has the foreign key: %t", table, has)
		}
		if has := strings.Contains(setup, "INCLUDING ALL"); has != (piece != "checks") {
			t.Errorf("%s has the CHECKs: %t", table, has)
		}
		if !strings.Contains(strings.Join(pgbenchSetup, ";\n"), setup) || !strings.Contains(pgbenchReset[0], table) {
			t.Errorf("%s is not made by the setup or not emptied by the reset", table)
		}
	}
}

// TestPgbenchMirrorsTheQueries: the new shape's statements are those of
// db/queries with the parameters written as literals, the key row written
// is the limit's, and the old shape's claim applies the horizon through its
// function.
func TestPgbenchMirrorsTheQueries(t *testing.T) {
	scripts := pgbenchScripts()
	statement := func(script, prefix string) string {
		t.Helper()
		for line := range strings.Lines(script) {
			if strings.HasPrefix(line, prefix) {
				return strings.TrimSuffix(line, "\n")
			}
		}
		t.Fatalf("no statement starting %q in:\n%s", prefix, script)
		return ""
	}

	// The pre-read lists the key table's columns in their order, as
	// sqlc's embed does (the model's fields are in the table's order).
	var columns []string
	model := reflect.TypeFor[dbsqlc.IdempotencyKey]()
	snake := regexp.MustCompile(`([a-z])([A-Z])`)
	for i := range model.NumField() {
		columns = append(columns, strings.ToLower(snake.ReplaceAllString(model.Field(i).Name, "${1}_${2}")))
	}
	if diff := cmp.Diff(columns, pgbenchKeyColumns); diff != "" {
		t.Errorf("the pre-read's columns are not the key table's (-table +pre-read):\n%s", diff)
	}
	preRead := statement(scripts["create"], "SELECT tenant_id,")
	if !strings.HasPrefix(preRead, "SELECT "+strings.Join(columns, ", ")+", ") {
		t.Errorf("the pre-read does not list the columns in order: %s", preRead)
	}

	queries, err := os.ReadFile(filepath.Join("..", "..", "db", "queries", "idempotency_keys.sql"))
	if err != nil {
		t.Fatal(err)
	}
	query := func(name string) string {
		t.Helper()
		_, rest, ok := strings.Cut(string(queries), "-- name: "+name+" ")
		if !ok {
			t.Fatalf("no query %s in db/queries/idempotency_keys.sql", name)
		}
		rest, _, _ = strings.Cut(rest, "-- name: ")
		return strings.Join(strings.Fields(rest), " ")
	}
	// What IdemKeyGet computes besides the row, the pre-read computes too.
	computed := regexp.MustCompile(`idem_\w+\([^)]*\)::boolean AS \w+`).FindAllString(query("IdemKeyGet"), -1)
	if len(computed) == 0 {
		t.Error("IdemKeyGet computes no idem_ function any more")
	}
	for _, c := range computed {
		if !strings.Contains(preRead, c) {
			t.Errorf("the pre-read lacks IdemKeyGet's %q", c)
		}
	}
	// It refuses a standby as IdemKeyGet does.
	if strings.Contains(query("IdemKeyGet"), "on_primary()") != strings.Contains(preRead, "on_primary()") {
		t.Error("the pre-read and IdemKeyGet differ on on_primary()")
	}
	// The statement that stops a replay's round trip is IdemKeyAbsent's.
	if absent := statement(scripts["create"], "SELECT idem_key_absent("); !strings.Contains(query("IdemKeyAbsent"), "SELECT idem_key_absent(") {
		t.Errorf("IdemKeyAbsent no longer calls idem_key_absent, which the create sends: %s", absent)
	}
	// The key row is inserted with IdemKeyClaimCompleted's columns.
	columnList := regexp.MustCompile(`INSERT INTO idempotency_keys \(([^)]*)\)`)
	want := columnList.FindStringSubmatch(query("IdemKeyClaimCompleted"))
	completed := statement(scripts["create"], "INSERT INTO idempotency_keys ")
	got := columnList.FindStringSubmatch(completed)
	if want == nil || got == nil || got[1] != want[1] {
		t.Errorf("the create's key row names (%v), IdemKeyClaimCompleted (%v)", got, want)
	}
	// It is the limit's row, but for the lease columns the limit sets to
	// their defaults.
	limit := statement(scripts["limit"], "INSERT INTO idempotency_keys ")
	trimmed := strings.Replace(strings.Replace(limit, ", recovery_point, locked_until, lease_generation)", ")", 1), ", NULL, NULL, 0)", ")", 1)
	if trimmed == limit || trimmed != completed {
		t.Errorf("the create's key row is not the limit's without the lease columns:\n%s", cmp.Diff(trimmed, completed))
	}
	if body := "'\\x" + strings.Repeat("7b", 420) + "'"; !strings.Contains(completed, body) || !strings.Contains(limit, body) {
		t.Error("the create and the limit do not record the same body")
	}
	for _, name := range []string{"create", "advisory-lock"} {
		for _, gone := range []string{"UPDATE", "ON CONFLICT (tenant_id, endpoint, idem_key)", "recovery_point, locked_until, lease_generation)"} {
			if strings.Contains(scripts[name], gone) {
				t.Errorf("%s has %q", name, gone)
			}
		}
	}
	// The advisory lock is taken on the tenant, endpoint and key.
	if lock := statement(scripts["advisory-lock"], "SELECT pg_advisory_xact_lock("); !strings.Contains(lock,
		"hashtextextended("+pgbenchTenant+"::text || ' ' || 'POST /v1/orders' || ' ' || "+pgbenchKey+", 0)") {
		t.Errorf("the advisory lock is not on the key: %s", lock)
	}

	// The old shape reclaims a forgotten key through idem_forgotten, and
	// no script compares a horizon by hand (the rule of
	// internal/idem/horizons_test.go).
	if claim := statement(scripts["claim-first"], "WITH inserted AS"); !strings.Contains(claim, "AND idem_forgotten(state, retain_until) AND NOT EXISTS") {
		t.Errorf("claim-first's reclaim does not use idem_forgotten: %s", claim)
	}
	byHand := regexp.MustCompile(`(?i)(expires_at|retain_until|locked_until)\s*[<>]=?\s*(now\(\)|current_timestamp|clock_timestamp\(\))|(now\(\)|current_timestamp|clock_timestamp\(\))\s*[<>]=?\s*\w*\.?(expires_at|retain_until|locked_until)`)
	for name, s := range scripts {
		if m := byHand.FindString(s); m != "" {
			t.Errorf("%s compares a horizon by hand: %s", name, m)
		}
	}
}

func TestPgbenchParseChildren(t *testing.T) {
	tests := []struct {
		in   string
		want []int
		ok   bool
	}{
		{"", nil, true},
		{"\n", nil, true},
		{"4242 ", []int{4242}, true},
		{"17236 17237 9 ", []int{17236, 17237, 9}, true},
		{"12 x3 ", nil, false},
		{"-1", nil, false},
		{"0", nil, false},
	}
	for _, tt := range tests {
		got, err := parseChildren(tt.in)
		if (err == nil) != tt.ok || !slices.Equal(got, tt.want) {
			t.Errorf("parseChildren(%q) = %v, %v; want %v, ok %t", tt.in, got, err, tt.want, tt.ok)
		}
	}
	extra, missing := pidsDiff([]int{1, 3, 5, 7}, []int{1, 2, 3})
	if !slices.Equal(extra, []int{5, 7}) || !slices.Equal(missing, []int{2}) {
		t.Errorf("pidsDiff = %v, %v; want [5 7], [2]", extra, missing)
	}
}

// TestPgbenchChildrenUntilReaped: a child that has exited is still listed
// until its parent waits for it, which is when its CPU joins the parent's
// children's times.
func TestPgbenchChildrenUntilReaped(t *testing.T) {
	self := os.Getpid()
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	awaitZombie(t, pid)
	if pids, err := childPids(self); err != nil || !slices.Contains(pids, pid) {
		t.Errorf("childPids = %v, %v; want the exited child %d among them", pids, err, pid)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if pids, err := childPids(self); err != nil || slices.Contains(pids, pid) {
		t.Errorf("childPids = %v, %v; want the reaped child %d gone", pids, err, pid)
	}
}

// awaitZombie waits until pid has exited and is not yet reaped.
func awaitZombie(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		if _, rest, _ := strings.Cut(string(stat), ") "); strings.HasPrefix(rest, "Z") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("child %d did not exit", pid)
		}
	}
}

// TestPgbenchSettle: the wait returns once the children are the resident
// ones again, only after the extra one has been reaped, and fails, naming
// it, when that takes longer than the deadline.
func TestPgbenchSettle(t *testing.T) {
	self := os.Getpid()
	ctx := context.Background()
	resident, err := childPids(self)
	if err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	awaitZombie(t, cmd.Process.Pid)
	// The child is reaped only once Wait is called.
	var waiting atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(200 * time.Millisecond)
		waiting.Store(true)
		_ = cmd.Wait()
	}()
	if err := settleChildren(ctx, self, resident, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if !waiting.Load() {
		t.Error("settleChildren returned before the exited child was reaped")
	}
	<-done

	slow := exec.Command("sleep", "30")
	if err := slow.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = slow.Process.Kill(); _ = slow.Wait() }()
	err = settleChildren(ctx, self, resident, 100*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), strconv.Itoa(slow.Process.Pid)+" (sleep 30)") {
		t.Errorf("settleChildren with a child still running = %v, want an error naming it", err)
	}
	gone := append(slices.Clone(resident), slow.Process.Pid)
	slices.Sort(gone)
	_ = slow.Process.Kill()
	_ = slow.Wait()
	if err := settleChildren(ctx, self, gone, 100*time.Millisecond); err == nil || !strings.Contains(err.Error(), "lost children") {
		t.Errorf("settleChildren with a resident child gone = %v, want an error", err)
	}
}

// TestPgbenchPlausible: a round where a figure is not positive or below a
// quarter of the round's median fails, naming it.
func TestPgbenchPlausible(t *testing.T) {
	round := func(changes map[string]float64) map[string]float64 {
		figures := map[string]float64{
			"baseline": 80, "baseline-3rt": 95, "limit": 118, "create": 150, "no-lock-timeout": 145, "savepoint": 140,
			"no-pre-read": 125, "no-fk": 140, "no-checks": 145, "claim-first": 250, "advisory-lock": 170,
		}
		for name, us := range changes {
			figures[name] = us
		}
		return figures
	}
	tests := []struct {
		name    string
		figures map[string]float64
		bad     string // the variant named, or "" when the round is kept
	}{
		{"Typical", round(nil), ""},
		{"CheapBaseline", round(map[string]float64{"baseline": 36}), ""}, // the median is 140: the bound is 35
		{"BaselineTooLow", round(map[string]float64{"baseline": 34}), "baseline 34.0"},
		{"HalfMissed", round(map[string]float64{"limit": 2}), "limit 2.0"},
		{"TwoMissed", round(map[string]float64{"limit": 2, "create": 0.02}), "create 0.0"},
		{"Zero", round(map[string]float64{"no-fk": 0}), "no-fk 0.0"},
		{"AllZero", round(map[string]float64{"baseline": 0, "baseline-3rt": 0, "limit": 0, "create": 0, "no-lock-timeout": 0,
			"savepoint": 0, "no-pre-read": 0, "no-fk": 0, "no-checks": 0, "claim-first": 0, "advisory-lock": 0}), "baseline 0.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := pgbenchPlausible(tt.figures)
			switch {
			case tt.bad == "" && err != nil:
				t.Errorf("a plausible round fails: %v", err)
			case tt.bad != "" && (err == nil || !strings.Contains(err.Error(), tt.bad)):
				t.Errorf("pgbenchPlausible = %v, want an error naming %q", err, tt.bad)
			}
		})
	}
}
