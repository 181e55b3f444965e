package testkit

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// KeyRow is what tests look at in an idempotency_keys row; each package's
// tests compare the part of it they own.
type KeyRow struct {
	State          string
	ResponseStatus int    // 0 while in progress
	RecoveryPoint  string // "" for NULL
	Generation     int64  // lease_generation
	ResourceID     uuid.UUID
	// Lock is "none" (locked_until is NULL), "live" (in the future) or
	// "expired" (at or before now()), by the database's clock.
	Lock string
}

// Querier reads one row: a pool, or a transaction that must see its own
// uncommitted writes.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ReadKeyRow reads the (tenantID, endpoint, key) row through q; ok is false
// when there is none. Any other error fails the test.
func ReadKeyRow(t testing.TB, q Querier, tenantID uuid.UUID, endpoint, key string) (row KeyRow, ok bool) {
	t.Helper()
	var resource *uuid.UUID
	err := q.QueryRow(context.Background(), `
		SELECT state, coalesce(response_status, 0), coalesce(recovery_point, ''), lease_generation, resource_id,
		       CASE WHEN locked_until IS NULL THEN 'none'
		            WHEN locked_until > now() THEN 'live'
		            ELSE 'expired' END
		FROM idempotency_keys WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3`,
		tenantID, endpoint, key,
	).Scan(&row.State, &row.ResponseStatus, &row.RecoveryPoint, &row.Generation, &resource, &row.Lock)
	if errors.Is(err, pgx.ErrNoRows) {
		return KeyRow{}, false
	}
	if err != nil {
		t.Fatalf("read the idempotency key row of %q on %s: %v", key, endpoint, err)
	}
	if resource != nil {
		row.ResourceID = *resource
	}
	return row, true
}

// KeyRowJSON returns the whole (tenantID, endpoint, key) row as JSON, to
// check that something changed nothing at all in it.
func KeyRowJSON(t testing.TB, q Querier, tenantID uuid.UUID, endpoint, key string) string {
	t.Helper()
	var s string
	err := q.QueryRow(context.Background(), `
		SELECT row_to_json(k)::text FROM idempotency_keys k
		WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3`, tenantID, endpoint, key).Scan(&s)
	if err != nil {
		t.Fatalf("snapshot the idempotency key row of %q on %s: %v", key, endpoint, err)
	}
	return s
}
