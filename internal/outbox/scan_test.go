package outbox_test

import (
	"testing"

	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/testdb"
)

// Published rows are kept for MESSAGE_RETENTION (a week by default): the
// outbox holds far more of them than rows to publish. The relay's claim,
// which runs all the time, and the reaper's delete must each find their
// rows by an index, never by reading the whole table. The outbox's primary
// key is (tenant_id, id) (migration 000023): a statement that joins on id
// alone has no index to use and scans (a soak found it, its throughput
// halving once the outbox held 23 minutes of events).
func TestRelayAndReaperDoNotScanTheOutbox(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	ctx := t.Context()
	if _, _, err := tenants.Create(ctx, pool, "scan-a"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tenants.Create(ctx, pool, "scan-b"); err != nil {
		t.Fatal(err)
	}
	// 100,000 rows published an hour ago, 50 to publish, over two tenants:
	// on a table much smaller the planner rightly prefers reading it all.
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox (id, tenant_id, subject, event_type, schema_version, payload, published_at)
		SELECT gen_random_uuid(), t.ids[1 + g % 2], 'test.scan', 'scan', 1, '{}',
		       CASE WHEN g > 50 THEN now() - interval '1 hour' END
		FROM generate_series(1, 100050) g, (SELECT array_agg(id) AS ids FROM tenants WHERE name LIKE 'scan-%') t`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE outbox`); err != nil {
		t.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	q := dbsqlc.New(tx)
	claimed, err := q.OutboxClaim(ctx, dbsqlc.OutboxClaimParams{HoldSeconds: 30, MaxRows: 100})
	if err != nil || len(claimed) != 50 {
		t.Fatalf("OutboxClaim: %d rows, %v; want the 50 unpublished", len(claimed), err)
	}

	deleted, err := q.OutboxDeletePublished(ctx, dbsqlc.OutboxDeletePublishedParams{RetentionSeconds: 60, BatchSize: 100})
	if err != nil || deleted != 100 {
		t.Fatalf("OutboxDeletePublished: %d rows, %v; want a batch of 100", deleted, err)
	}
	// pg_stat_xact_user_tables counts this transaction's own scans.
	var seqScans, idxScans int64
	if err := tx.QueryRow(ctx, `SELECT seq_scan, coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables WHERE relname = 'outbox'`).Scan(&seqScans, &idxScans); err != nil {
		t.Fatal(err)
	}
	if seqScans != 0 || idxScans == 0 {
		t.Errorf("the claim and the delete made %d sequential scans of the outbox and %d index scans; want no sequential scan", seqScans, idxScans)
	}
}
