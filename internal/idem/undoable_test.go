package idem

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestExecHandleIsNotTheTransaction: exec gets statements only. The value
// behind UndoableTx is not a pgx.Tx, so exec cannot commit, roll back or
// open anything around Execute's back, even by a type assertion.
func TestExecHandleIsNotTheTransaction(t *testing.T) {
	t.Parallel()
	h := setup(t)
	store := NewStore(h.pool, Config{})
	_, _, err := store.Execute(t.Context(), h.claim(t, "key-1", `{}`), func(ctx context.Context, tx UndoableTx) (Response, error) {
		if _, ok := tx.(pgx.Tx); ok {
			t.Error("exec's handle is a pgx.Tx: exec could commit the transaction without the key")
		}
		if _, ok := tx.(interface{ Conn() *pgx.Conn }); ok {
			t.Error("exec's handle exposes the connection")
		}
		return created(`{}`), nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
