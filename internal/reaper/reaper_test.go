package reaper_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/reaper"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// Every test asserts on the idempotency_keys rows themselves.

// key is one fixture row. The horizons and the lease are offsets from
// now(); lease nil means no lease (a one-transaction key).
type key struct {
	state         string // in_progress, completed or expired
	expiresIn     time.Duration
	retainIn      time.Duration
	lease         *time.Duration
	recoveryPoint string
}

func dur(d time.Duration) *time.Duration { return &d }

// row is what the test reads back.
type row struct {
	State      string
	Status     *int32
	HasHeaders bool
	HasBody    bool
	Location   *string
	Recovery   *string
}

func TestRunOnce(t *testing.T) {
	t.Parallel()
	const (
		day  = 24 * time.Hour
		kept = "kept" // want: the row unchanged
		tomb = "tomb" // want: pruned to a tombstone
		gone = "gone" // want: deleted
	)
	tests := []struct {
		name string
		key  key
		want string
	}{
		{"CompletedWithinTTL", key{state: "completed", expiresIn: time.Hour, retainIn: 2 * day}, kept},
		{"CompletedPastTTL", key{state: "completed", expiresIn: -time.Second, retainIn: 2 * day}, tomb},
		{"CompletedPastBothHorizons", key{state: "completed", expiresIn: -3 * day, retainIn: -time.Second}, gone},
		{"TombstoneWithinRetention", key{state: "expired", expiresIn: -day, retainIn: day}, kept},
		{"TombstonePastRetention", key{state: "expired", expiresIn: -3 * day, retainIn: -time.Second}, gone},
		// In progress: never touched, however old, with or without a lease.
		{"InProgressPastBothHorizons", key{state: "in_progress", expiresIn: -30 * day, retainIn: -20 * day}, kept},
		// A payment whose client went away at charge_sent, with a TTL of a
		// second long past: the completer still needs its recovery point.
		{"ChargeSentLeaseExpired", key{state: "in_progress", expiresIn: -time.Second, retainIn: -time.Second, lease: dur(-time.Minute), recoveryPoint: "charge_sent"}, kept},
		{"ChargeSentLeaseLive", key{state: "in_progress", expiresIn: -time.Second, retainIn: -time.Second, lease: dur(time.Minute), recoveryPoint: "charge_sent"}, kept},
		// A live lease protects a row whatever its state.
		{"CompletedPastTTLLeaseLive", key{state: "completed", expiresIn: -time.Second, retainIn: day, lease: dur(time.Minute), recoveryPoint: "finished"}, kept},
		{"TombstonePastRetentionLeaseLive", key{state: "expired", expiresIn: -day, retainIn: -time.Second, lease: dur(time.Minute), recoveryPoint: "finished"}, kept},
		{"CompletedPastTTLLeaseExpired", key{state: "completed", expiresIn: -time.Second, retainIn: day, lease: dur(-time.Second), recoveryPoint: "finished"}, tomb},
	}
	pool, _ := testdb.NewPool(t)
	tenant := newTenant(t, pool)
	for _, tt := range tests {
		insertKey(t, pool, tenant, tt.name, tt.key)
	}
	before := map[string]row{}
	for _, tt := range tests {
		before[tt.name], _ = readKey(t, pool, tenant, tt.name)
	}

	res, err := reaper.New(pool, reaper.Config{Logger: testkit.Logger(t)}).RunOnce(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var wantRes reaper.Result
	for _, tt := range tests {
		switch tt.want {
		case tomb:
			wantRes.Pruned++
		case gone:
			wantRes.Deleted++
			// Pruning runs first: a completed row past both horizons is a
			// tombstone by the time the delete reaches it.
			if tt.key.state == "completed" {
				wantRes.Pruned++
			}
		}
	}
	if res != wantRes {
		t.Errorf("RunOnce = %+v, want %+v", res, wantRes)
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, found := readKey(t, pool, tenant, tt.name)
			switch tt.want {
			case gone:
				if found {
					t.Fatalf("row still there: %+v", got)
				}
			case kept:
				if diff := cmp.Diff(before[tt.name], got); !found || diff != "" {
					t.Fatalf("row changed (found %v; -before +after):\n%s", found, diff)
				}
			case tomb:
				b := before[tt.name]
				want := row{State: "expired", Status: b.Status, Location: b.Location, Recovery: b.Recovery}
				if diff := cmp.Diff(want, got); !found || diff != "" {
					t.Fatalf("not pruned to a tombstone (found %v; -want +got):\n%s", found, diff)
				}
			}
		})
	}
}

// Two reapers, each with its own pool, over one backlog: every row is
// pruned exactly once and neither fails.
func TestConcurrentReapers(t *testing.T) {
	t.Parallel()
	const n = 20000
	pool, url := testdb.NewPool(t)
	tenant := newTenant(t, pool)
	fill(t, pool, tenant, "c", n, "completed", "-1 hour", "+1 day")
	before := time.Now()

	var wg sync.WaitGroup
	results := make([]reaper.Result, 2)
	errs := make([]error, 2)
	for i := range 2 {
		p, err := db.Open(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		// Small batches, so the two interleave many times.
		r := reaper.New(p, reaper.Config{Batch: 500, Logger: testkit.Logger(t)})
		wg.Go(func() { results[i], errs[i] = r.RunOnce(t.Context()) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("reaper %d: %v", i, err)
		}
	}
	if got := results[0].Pruned + results[1].Pruned; got != n {
		t.Errorf("pruned %d + %d = %d, want %d", results[0].Pruned, results[1].Pruned, got, n)
	}
	t.Logf("reaper 0 pruned %d, reaper 1 pruned %d, in %s", results[0].Pruned, results[1].Pruned, time.Since(before))
	var expired, other int
	if err := pool.QueryRow(t.Context(), `
		SELECT count(*) FILTER (WHERE state = 'expired' AND response_headers IS NULL AND response_body IS NULL),
		       count(*) FILTER (WHERE state <> 'expired')
		FROM idempotency_keys`).Scan(&expired, &other); err != nil {
		t.Fatal(err)
	}
	if expired != n || other != 0 {
		t.Fatalf("tombstones %d, other rows %d; want %d and 0", expired, other, n)
	}
}

// The prune, the delete and the completer's search walk their horizon's
// index, bounded by the horizon itself (an Index Cond, not a Filter over
// the whole index); none scans the table, which would take the whole
// table's worth of I/O every pass. The horizons are compared through the
// SQL functions of migration 000014: this also checks that the planner
// still inlines them into plain comparisons.
func TestPlansUseTheIndexes(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	tenant := newTenant(t, pool)
	// A realistic spread: a day's worth of completed keys per TTL, a small
	// share of them due, older tombstones, a few in progress.
	fill(t, pool, tenant, "live", 150000, "completed", "+12 hours", "+60 hours")
	fill(t, pool, tenant, "due", 5000, "completed", "-1 minute", "+47 hours")
	fill(t, pool, tenant, "tomb", 40000, "expired", "-30 hours", "+40 hours")
	fill(t, pool, tenant, "old", 5000, "expired", "-72 hours", "-1 minute")
	if _, err := pool.Exec(t.Context(), `ANALYZE idempotency_keys`); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		file, query string
		args        []any
		index, cond string
	}{
		{"reaper.sql", "IdemKeyPruneBatch", []any{int32(reaper.DefaultBatch)}, "idempotency_keys_expires_at_idx", "expires_at <= now()"},
		{"reaper.sql", "IdemKeyDeleteBatch", []any{int32(reaper.DefaultBatch)}, "idempotency_keys_retain_until_idx", "retain_until <= now()"},
		{"idempotency_keys.sql", "IdemKeyListExpiredLeases", []any{[]string{"POST /v1/payments"}, int32(100)}, "idempotency_keys_expired_lease_idx", "locked_until <= now()"},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			var plan []struct{ Plan planNode }
			var raw []byte
			if err := pool.QueryRow(t.Context(), "EXPLAIN (FORMAT JSON) "+queryText(t, tt.file, tt.query), tt.args...).Scan(&raw); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(raw, &plan); err != nil {
				t.Fatal(err)
			}
			var seq, bounded bool
			plan[0].Plan.walk(func(n planNode) {
				seq = seq || (n.NodeType == "Seq Scan" && n.Relation == "idempotency_keys")
				bounded = bounded || (n.Index == tt.index && strings.Contains(n.IndexCond, tt.cond))
			})
			if seq || !bounded {
				t.Fatalf("plan has a Seq Scan on idempotency_keys (%v) or does not scan %s with Index Cond %s (it does: %v):\n%s", seq, tt.index, tt.cond, bounded, raw)
			}
		})
	}
}

type planNode struct {
	NodeType  string     `json:"Node Type"`
	Relation  string     `json:"Relation Name"`
	Index     string     `json:"Index Name"`
	IndexCond string     `json:"Index Cond"`
	Plans     []planNode `json:"Plans"`
}

func (n planNode) walk(fn func(planNode)) {
	fn(n)
	for _, c := range n.Plans {
		c.walk(fn)
	}
}

// queryText returns the SQL of the named query in db/queries/file, as sqlc
// sends it: comments dropped, each @parameter numbered ($1, $2, ...) in the
// order it first appears.
func queryText(t *testing.T, file, name string) string {
	t.Helper()
	b, err := os.ReadFile("../../db/queries/" + file)
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "-- name: "+name+" ")
	if !ok {
		t.Fatalf("no query %s in %s", name, file)
	}
	body, _, _ := strings.Cut(after, "-- name: ")
	var lines []string
	for _, l := range strings.Split(body, "\n")[1:] {
		if !strings.HasPrefix(strings.TrimSpace(l), "--") {
			lines = append(lines, l)
		}
	}
	numbers := map[string]string{}
	return regexp.MustCompile(`@\w+`).ReplaceAllStringFunc(strings.Join(lines, "\n"), func(p string) string {
		if _, ok := numbers[p]; !ok {
			numbers[p] = fmt.Sprintf("$%d", len(numbers)+1)
		}
		return numbers[p]
	})
}

func newTenant(t testing.TB, pool *pgxpool.Pool) uuid.UUID {
	t.Helper()
	id, _, err := tenants.Create(context.Background(), pool, "tenant "+uuid.NewString())
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// insertKey inserts one fixture row; a finished key carries a recorded
// response (completed) or what a tombstone keeps (expired).
func insertKey(t *testing.T, pool *pgxpool.Pool, tenant uuid.UUID, name string, k key) {
	t.Helper()
	var lease *string
	if k.lease != nil {
		s := k.lease.String()
		lease = &s
	}
	var rp *string
	if k.recoveryPoint != "" {
		rp = &k.recoveryPoint
	}
	_, err := pool.Exec(t.Context(), `
		INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, state,
		    response_status, response_headers, response_body, resource_location,
		    created_at, completed_at, expires_at, retain_until, recovery_point, locked_until, lease_generation)
		SELECT $1, 'POST /v1/payments', $2, sha256(convert_to($2, 'UTF8')), 1, $3,
		    CASE WHEN $3 <> 'in_progress' THEN 201 END,
		    CASE WHEN $3 = 'completed' THEN '{"Location":["/v1/payments/p"]}'::jsonb END,
		    CASE WHEN $3 = 'completed' THEN '{"id":"p"}'::bytea END,
		    CASE WHEN $3 <> 'in_progress' THEN '/v1/payments/p' END,
		    now() - interval '100 days',
		    CASE WHEN $3 <> 'in_progress' THEN now() - interval '99 days' END,
		    now() + $4::interval, now() + $5::interval, $6, now() + $7::interval, CASE WHEN $7 IS NULL THEN 0 ELSE 1 END`,
		tenant, name, k.state, k.expiresIn.String(), k.retainIn.String(), rp, lease)
	if err != nil {
		t.Fatalf("insert %s: %v", name, err)
	}
}

// fill inserts n finished one-transaction keys named prefix-i, with
// expires_at and retain_until now() plus the given intervals, spread over
// a minute so the index order is not trivial.
func fill(t testing.TB, pool *pgxpool.Pool, tenant uuid.UUID, prefix string, n int, state, expiresIn, retainIn string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, state,
		    response_status, response_headers, response_body, resource_location,
		    created_at, completed_at, expires_at, retain_until)
		SELECT $1, 'POST /v1/orders', $2 || '-' || i, sha256(convert_to($2 || '-' || i, 'UTF8')), 1, $4,
		    201,
		    CASE WHEN $4 = 'completed' THEN '{"Location":["/v1/orders/o"]}'::jsonb END,
		    CASE WHEN $4 = 'completed' THEN '{"id":"o","amount":1}'::bytea END,
		    '/v1/orders/o', now() - interval '100 days', now() - interval '100 days',
		    now() + $5::interval - (i % 60) * interval '1 second',
		    now() + $6::interval - (i % 60) * interval '1 second'
		FROM generate_series(1, $3::int) AS i`,
		tenant, prefix, n, state, expiresIn, retainIn)
	if err != nil {
		t.Fatalf("fill %s: %v", prefix, err)
	}
}

func readKey(t *testing.T, pool *pgxpool.Pool, tenant uuid.UUID, name string) (row, bool) {
	t.Helper()
	var r row
	rows, err := pool.Query(t.Context(), `
		SELECT state, response_status, response_headers IS NOT NULL, response_body IS NOT NULL, resource_location, recovery_point
		FROM idempotency_keys WHERE tenant_id = $1 AND idem_key = $2`, tenant, name)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	found := false
	for rows.Next() {
		found = true
		if err := rows.Scan(&r.State, &r.Status, &r.HasHeaders, &r.HasBody, &r.Location, &r.Recovery); err != nil {
			t.Fatal(err)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return r, found
}

// A backlog that fills batch after batch raises the reaper's duty (the
// share of its time in batches) above REAPER_DUTY, so that keys arriving
// faster than the base duty reaps are still worked off; the duty falls
// back to REAPER_DUTY once a batch comes back short. Read from the
// idempotency_reaper_duty gauge while a pass runs. Not parallel: the gauge
// is the process's, and the parallel tests' reapers would set it too.
func TestDutyRisesWhileBatchesAreFull(t *testing.T) {
	const (
		n     = 3000
		batch = 100
		base  = 0.05
	)
	pool, _ := testdb.NewPool(t)
	tenant := newTenant(t, pool)
	fill(t, pool, tenant, "d", n, "completed", "-1 hour", "+1 day")
	r := reaper.New(pool, reaper.Config{Batch: batch, Duty: base, Logger: testkit.Logger(t)})

	done := make(chan error, 1)
	go func() {
		res, err := r.RunOnce(t.Context())
		if err == nil && res.Pruned != n {
			err = fmt.Errorf("pruned %d, want %d", res.Pruned, n)
		}
		done <- err
	}()
	highest := testkit.Gauge(t, "idempotency_reaper_duty")
	for running := true; running; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			running = false
		case <-time.After(time.Millisecond):
			highest = max(highest, testkit.Gauge(t, "idempotency_reaper_duty"))
		}
	}
	// 30 full batches: the duty doubles after every 4, so it reaches the cap.
	if highest < 2*base {
		t.Errorf("the duty stayed at %v through %d full batches; want it raised above REAPER_DUTY %v", highest, n/batch, base)
	}
	if after := testkit.Gauge(t, "idempotency_reaper_duty"); after != base {
		t.Errorf("after the pass the duty is %v, want REAPER_DUTY %v again", after, base)
	}
	t.Logf("the duty rose to %v during a pass of %d full batches", highest, n/batch)
}
