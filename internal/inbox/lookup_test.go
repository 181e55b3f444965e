package inbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/dbmigrate"
	"github.com/idemref/payments/internal/inbox"
	"github.com/idemref/payments/internal/reaper"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

const (
	consumer  = "orders"
	source    = "payments.outbox"
	retention = 7 * 24 * time.Hour
)

// tenant is the tenant the tests record their messages under. The inbox
// does not reference tenants: any UUID will do.
var tenant = uuid.MustParse("0195a0b0-0000-7000-8000-000000000001")

// insertAt records id as processed at the given time, as an inbox row of
// that age would be.
func insertAt(t *testing.T, pool *pgxpool.Pool, id string, at time.Time) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), `INSERT INTO processed_messages (consumer, source, message_id, processed_at) VALUES ($1, $2, $3, $4)`,
		consumer, source, id, at); err != nil {
		t.Fatal(err)
	}
}

func prune(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	res, err := reaper.New(pool, reaper.Config{MessageRetention: retention, Duty: 1, Logger: slog.New(slog.DiscardHandler)}).RunOnce(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return res.Messages
}

// A missing id means "not applied" only for a message that cannot have
// been applied before the newest id pruned: the reaper moves the inbox's
// horizon with every id it deletes, and Lookup vouches only for what came
// after it (by ClockSkewAllowance).
func TestLookupVouchesOnlyForWhatWasNotPruned(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := testdb.NewPool(t)
	now := time.Now()
	lookup := func(id string, sentAt time.Time) (inbox.Verdict, time.Time) {
		t.Helper()
		v, pruned, err := inbox.Lookup(ctx, pool, tenant, consumer, source, id, sentAt)
		if err != nil {
			t.Fatal(err)
		}
		return v, pruned
	}

	// Nothing pruned yet: a missing id was never applied, whatever its age.
	if v, _ := lookup("never", time.Time{}); v != inbox.NotApplied {
		t.Errorf("before any prune, a missing id of unknown age = %v, want not applied", v)
	}
	if err := db.WithTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := inbox.Record(ctx, tx, tenant, consumer, source, "applied")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if v, _ := lookup("applied", now); v != inbox.Applied {
		t.Errorf("a recorded id = %v, want applied", v)
	}

	// An event applied eight days ago, its ack lost: the reaper prunes its id.
	appliedAt := now.Add(-8 * 24 * time.Hour).Truncate(time.Microsecond)
	insertAt(t, pool, "pruned", appliedAt)
	if n := prune(t, pool); n != 1 {
		t.Fatalf("pruned %d ids, want 1", n)
	}
	v, horizon := lookup("pruned", appliedAt.Add(-time.Minute))
	if v != inbox.Unknown || !horizon.Equal(appliedAt) {
		t.Errorf("a pruned id = %v, horizon %v; want unknown, horizon %v", v, horizon, appliedAt)
	}
	for _, c := range []struct {
		name   string
		sentAt time.Time
		want   inbox.Verdict
	}{
		{"sent at an unknown time", time.Time{}, inbox.Unknown},
		{"sent before the horizon", appliedAt.Add(-time.Hour), inbox.Unknown},
		{"sent after the horizon, within the clock skew allowance", appliedAt.Add(inbox.ClockSkewAllowance), inbox.Unknown},
		{"sent after the horizon and the allowance", appliedAt.Add(inbox.ClockSkewAllowance + time.Second), inbox.NotApplied},
		{"sent today", now, inbox.NotApplied},
	} {
		if v, _ := lookup("never", c.sentAt); v != c.want {
			t.Errorf("a missing id %s = %v, want %v", c.name, v, c.want)
		}
	}
	if v, _ := lookup("applied", time.Time{}); v != inbox.Applied {
		t.Errorf("a recorded id after the prune = %v, want applied", v)
	}

	// The horizon only moves forward: pruning an older id, or nothing,
	// leaves it where it is.
	insertAt(t, pool, "older", appliedAt.Add(-24*time.Hour))
	if n := prune(t, pool); n != 1 {
		t.Fatalf("pruned %d ids, want 1", n)
	}
	if n := prune(t, pool); n != 0 {
		t.Fatalf("pruned %d ids, want 0", n)
	}
	if _, horizon := lookup("never", now); !horizon.Equal(appliedAt) {
		t.Errorf("horizon after pruning an older id = %v, want %v", horizon, appliedAt)
	}
}

// Lookups racing two reapers never take a pruned id for one never applied:
// a prune deletes ids and moves the horizon past them in one statement, and
// a lookup reads the id and the horizon in one snapshot. Each id is looked
// up as sent as late as the allowance permits (ClockSkewAllowance after it
// was processed).
func TestLookupDuringPrunesNeverSaysNotApplied(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := testdb.NewPool(t)
	const n = 2000
	base := time.Now().Add(-9 * 24 * time.Hour).Truncate(time.Microsecond)
	at := func(i int) time.Time { return base.Add(time.Duration(i) * time.Second) }
	if _, err := pool.Exec(ctx, `INSERT INTO processed_messages (consumer, source, message_id, processed_at)
		SELECT $1, $2, 'm' || i, $3::timestamptz + i * interval '1 second' FROM generate_series(0, $4 - 1) AS i`,
		consumer, source, base, n); err != nil {
		t.Fatal(err)
	}

	var reapers, lookups sync.WaitGroup
	var done atomic.Bool
	var pruned atomic.Int64
	for range 2 {
		reapers.Go(func() {
			r := reaper.New(pool, reaper.Config{MessageRetention: retention, Batch: 100, Duty: 1, Logger: slog.New(slog.DiscardHandler)})
			res, err := r.RunOnce(ctx)
			if err != nil {
				t.Error(err)
			}
			pruned.Add(res.Messages)
		})
	}
	var looked atomic.Int64
	for w := range 2 {
		lookups.Go(func() {
			for i := w; !done.Load(); i = (i + 2) % n {
				id := fmt.Sprintf("m%d", i)
				v, horizon, err := inbox.Lookup(ctx, pool, tenant, consumer, source, id, at(i).Add(inbox.ClockSkewAllowance))
				if err != nil {
					t.Error(err)
					return
				}
				if v == inbox.NotApplied {
					t.Errorf("%s, processed at %v, looked up during the prunes = not applied (horizon %v)", id, at(i), horizon)
					return
				}
				looked.Add(1)
			}
		})
	}
	reapers.Wait()
	done.Store(true)
	lookups.Wait()
	if got := pruned.Load(); got != n {
		t.Errorf("the reapers pruned %d ids, want %d", got, n)
	}
	if looked.Load() == 0 {
		t.Error("no lookup ran during the prunes")
	}
}

// The migration that brings the horizon cannot know how far an inbox
// already in use was pruned before it: it says up to the moment it ran, so
// that nothing older is vouched for. A new database has pruned nothing.
func TestHorizonOfADatabaseAlreadyInUse(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := testdb.CreateEmptyDatabase(t)
	if err := dbmigrate.Up(ctx, url); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	horizon := func() *time.Time {
		t.Helper()
		var at *time.Time
		if err := pool.QueryRow(ctx, `SELECT pruned_through FROM processed_messages_horizon`).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	if at := horizon(); at != nil {
		t.Errorf("horizon of a new database = %v, want none", at)
	}

	if _, _, err := tenants.Create(ctx, pool, "in-use"); err != nil {
		t.Fatal(err)
	}
	// Back to just before the migration that made the horizon (000015),
	// whatever came after it, then up again.
	const horizonMigration = 15
	version, _, err := dbmigrate.Version(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if err := dbmigrate.DownSteps(ctx, url, int(version)-horizonMigration+1); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	if err := dbmigrate.Up(ctx, url); err != nil {
		t.Fatal(err)
	}
	at := horizon()
	if at == nil || at.Before(before.Add(-time.Minute)) || at.After(time.Now().Add(time.Minute)) {
		t.Fatalf("horizon of a database in use, after the migration = %v, want about %v", at, before)
	}
	if v, _, err := inbox.Lookup(ctx, pool, tenant, consumer, source, "from-before", before.Add(-time.Hour)); err != nil || v != inbox.Unknown {
		t.Errorf("a missing id of an event from before the migration = %v (%v), want unknown", v, err)
	}
}

// During a rolling upgrade the previous version's reaper prunes the inbox
// with a plain DELETE that knows nothing of the horizon, and an operator
// may delete ids by hand: the horizon still moves past whatever is
// deleted, so a lookup never answers "not applied" for a pruned id.
func TestAnyDeleteMovesTheHorizon(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := testdb.NewPool(t)
	old := time.Now().Add(-10 * 24 * time.Hour).Truncate(time.Microsecond)
	if _, err := pool.Exec(ctx, `INSERT INTO processed_messages (consumer, source, message_id, processed_at)
		VALUES ($1, $2, 'old-1', $3), ($1, $2, 'old-2', $3 + interval '1 hour')`, consumer, source, old); err != nil {
		t.Fatal(err)
	}
	// The previous version's prune, as it was written before the horizon.
	if _, err := pool.Exec(ctx, `DELETE FROM processed_messages WHERE processed_at < now() - interval '7 days'`); err != nil {
		t.Fatal(err)
	}
	v, pruned, err := inbox.Lookup(ctx, pool, tenant, consumer, source, "old-2", old)
	if err != nil {
		t.Fatal(err)
	}
	if v != inbox.Unknown || !pruned.Equal(old.Add(time.Hour)) {
		t.Errorf("after a plain DELETE of two ids, the later one = %v (horizon %v), want unknown (horizon %v)", v, pruned, old.Add(time.Hour))
	}
}

// D8, M1: an id recorded before the inbox named tenants (under
// inbox.NoTenant, as migration 000023 left every earlier row and a
// previous release still writes them) drops its redelivery under the
// message's tenant, and Lookup finds it there; an id recorded under the
// tenant is recorded once.
func TestAnIDRecordedWithoutItsTenantStillDropsItsRedelivery(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := testdb.NewPool(t)
	insertAt(t, pool, "before", time.Now())
	record := func(id string) bool {
		t.Helper()
		var fresh bool
		if err := db.WithTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) (err error) {
			fresh, err = inbox.Record(ctx, tx, tenant, consumer, source, id)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return fresh
	}
	if record("before") {
		t.Error("an id recorded without its tenant was recorded again under it")
	}
	if !record("after") || record("after") {
		t.Error("an id recorded under its tenant: want fresh once, then a duplicate")
	}
	for _, id := range []string{"before", "after"} {
		if v, _, err := inbox.Lookup(ctx, pool, tenant, consumer, source, id, time.Now()); err != nil || v != inbox.Applied {
			t.Errorf("Lookup(%s) = %v, %v; want applied", id, v, err)
		}
	}
	var rows []string
	r, err := pool.Query(ctx, `SELECT tenant_id::text || ' ' || message_id FROM processed_messages ORDER BY message_id DESC`)
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var s string
		if err := r.Scan(&s); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, s)
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{inbox.NoTenant.String() + " before", tenant.String() + " after"}
	if len(rows) != 2 || rows[0] != want[0] || rows[1] != want[1] {
		t.Errorf("inbox rows = %q, want %q", rows, want)
	}
}
