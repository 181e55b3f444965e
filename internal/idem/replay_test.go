package idem

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestReplayTakesNoRowLock: a replay reads the record and writes nothing
// (P4). While another transaction holds the completed key's row locked
// FOR UPDATE, a replay must still answer at once; one that locked the row,
// or wrote to it, would wait for that transaction and, after the lock
// timeout, answer ErrKeyInUse.
func TestReplayTakesNoRowLock(t *testing.T) {
	t.Parallel()
	h := setup(t)
	store := NewStore(h.pool, Config{LockTimeout: 200 * time.Millisecond})
	c := h.claim(t, "replay-lock", `{"amount":100}`)
	want := created(`{"id":"t_1"}`)
	var calls atomic.Int32
	if _, _, err := store.Execute(t.Context(), c, insertExec(&calls, h.tenant, "first", want)); err != nil {
		t.Fatal(err)
	}

	holder, err := h.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(context.Background()) }()
	var xmin string
	if err := holder.QueryRow(t.Context(), `
		SELECT xmin::text FROM idempotency_keys WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3 FOR UPDATE`,
		c.TenantID, c.Endpoint, c.Key).Scan(&xmin); err != nil {
		t.Fatal(err)
	}

	res, replayed, err := store.Execute(t.Context(), c, notCalled(t))
	if err != nil {
		t.Fatalf("replay while the row is locked: %v, want the recorded response", err)
	}
	if !replayed || res.Status != want.Status || string(res.Body) != string(want.Body) {
		t.Errorf("replay = (%d %q, replayed %v), want the recorded %d %q", res.Status, res.Body, replayed, want.Status, want.Body)
	}
	if err := holder.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The row is the version the first request committed: the replay
	// wrote no new one.
	var after string
	if err := h.pool.QueryRow(t.Context(), `
		SELECT xmin::text FROM idempotency_keys WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3`,
		c.TenantID, c.Endpoint, c.Key).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != xmin {
		t.Errorf("key row xmin %s after the replay, was %s: the replay wrote the row", after, xmin)
	}
}
