package idem

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestExecuteLockWaitInExecIsNotKeyInUse: two requests under two different
// keys write the same business row (an order's reference, here a row of
// scratch_unique). The second one's exec waits on the first one's
// uncommitted row and, past the lock timeout, gives up. Its own key was
// never taken by anyone, so the answer is ErrConflictingWrite, not
// ErrKeyInUse, and nothing of it is left: no key row, no business row. Once
// the first transaction ends, the same key runs. A lock wait at the claim
// of the key itself is still ErrKeyInUse.
func TestExecuteLockWaitInExecIsNotKeyInUse(t *testing.T) {
	t.Parallel()

	t.Run("OtherKeysRow", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		ctx := deadline(t)
		store := NewStore(h.pool, Config{LockTimeout: 200 * time.Millisecond})
		// The first request, under another key, inside its transaction: its
		// business row written, nothing committed yet.
		first, err := h.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = first.Rollback(context.WithoutCancel(ctx)) })
		if _, err := first.Exec(ctx, `INSERT INTO scratch_unique (v) VALUES ('contended')`); err != nil {
			t.Fatal(err)
		}

		c := h.claim(t, "key-2", `{}`)
		var calls atomic.Int32
		exec := func(ctx context.Context, tx UndoableTx) (Response, error) {
			calls.Add(1)
			if _, err := tx.Exec(ctx, `INSERT INTO scratch_unique (v) VALUES ('contended')`); err != nil {
				return Response{}, err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO scratch (tenant_id, v) VALUES ($1, 'second')`, h.tenant); err != nil {
				return Response{}, err
			}
			return created(`{"id":"second"}`), nil
		}
		res, replayed, err := store.Execute(ctx, c, exec)
		if errors.Is(err, ErrKeyInUse) {
			t.Errorf("Execute behind another key's uncommitted row = %v: told its key is in use, which no request holds", err)
		}
		if !errors.Is(err, ErrConflictingWrite) {
			t.Fatalf("Execute behind another key's uncommitted row = %+v, %v, %v; want ErrConflictingWrite", res, replayed, err)
		}
		if rows := h.keyRows(t); len(rows) != 0 {
			t.Errorf("key rows after the lock wait = %+v, want none", rows)
		}
		if diff := cmp.Diff([]scratchRow{}, h.scratch(t)); diff != "" {
			t.Errorf("business rows after the lock wait (-want +got):\n%s", diff)
		}

		// The first request rolls back; the retry under the same key runs.
		if err := first.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		res, replayed, err = store.Execute(ctx, c, exec)
		if err != nil || replayed {
			t.Fatalf("retry after the first request ended: replayed %v, err %v; want a fresh execution", replayed, err)
		}
		if calls.Load() != 2 {
			t.Errorf("exec ran %d times, want 2", calls.Load())
		}
		checkCompleted(t, h.onlyKeyRow(t), c, res)
	})

	t.Run("SameKeyClaimed", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		ctx := deadline(t)
		store := NewStore(h.pool, Config{LockTimeout: 200 * time.Millisecond})
		c := h.claim(t, "key-1", `{}`)
		first := created(`{"id":"first"}`)
		holdKey(t, ctx, h, c, &first)
		var calls atomic.Int32
		_, _, err := store.Execute(ctx, c, insertExec(&calls, h.tenant, "duplicate", created(`{}`)))
		if !errors.Is(err, ErrKeyInUse) || errors.Is(err, ErrConflictingWrite) {
			t.Fatalf("Execute behind its own key's uncommitted claim = %v; want ErrKeyInUse only", err)
		}
		if diff := cmp.Diff([]scratchRow{}, h.scratch(t)); diff != "" {
			t.Errorf("business rows (-want +got):\n%s", diff)
		}
	})
}
