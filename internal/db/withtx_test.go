package db_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db"
)

// WithTx is a plain pgx transaction: every statement is its own round trip,
// and what only a pipelined transaction does (db.Deferred queueing,
// db.CommitAfterNext) runs at once or does nothing.
func TestWithTx(t *testing.T) {
	t.Run("EachStatementInItsOwnRoundTrip", func(t *testing.T) {
		p := setup(t)
		got, err := p.wire.Measure(t.Context(), func() error {
			return db.WithTx(t.Context(), p.pool, func(ctx context.Context, tx pgx.Tx) error {
				if _, err := db.Deferred(tx).Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, "1000ms"); err != nil {
					return err
				}
				if err := insert(ctx, tx, 1, "one"); err != nil {
					return err
				}
				db.CommitAfterNext(tx)
				return insert(ctx, tx, 2, "two")
			})
		})
		must(t, err)
		if got.RoundTrips != 5 { // [BEGIN], [set_config], [INSERT], [INSERT], [COMMIT]
			t.Errorf("round trips = %d, want 5", got.RoundTrips)
		}
		if got := p.notes(t); len(got) != 2 {
			t.Errorf("rows = %q, want [one two]", got)
		}
		p.idle(t)
	})

	// The request's context is gone by the time fn returns: the rollback
	// must still reach the server.
	t.Run("ACancelledContextStillRollsBack", func(t *testing.T) {
		p := setup(t)
		ctx, cancel := context.WithCancel(t.Context())
		err := db.WithTx(ctx, p.pool, func(ctx context.Context, tx pgx.Tx) error {
			if err := insert(ctx, tx, 1, "one"); err != nil {
				return err
			}
			cancel()
			return ctx.Err()
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("WithTx = %v, want context.Canceled", err)
		}
		if got := p.notes(t); len(got) != 0 {
			t.Errorf("rows = %q, want none", got)
		}
		p.idle(t)
	})

	// A COMMIT that does not commit is an error, even when fn saw none.
	t.Run("ACommitThatRollsBackIsAnError", func(t *testing.T) {
		p := setup(t)
		err := db.WithTx(t.Context(), p.pool, func(ctx context.Context, tx pgx.Tx) error {
			if err := insert(ctx, tx, 1, "one"); err != nil {
				return err
			}
			_ = insert(ctx, tx, 1, "duplicate") // aborts the transaction; the error is dropped
			return nil
		})
		if !errors.Is(err, pgx.ErrTxCommitRollback) {
			t.Fatalf("WithTx = %v, want pgx.ErrTxCommitRollback", err)
		}
		if got := p.notes(t); len(got) != 0 {
			t.Errorf("rows = %q, want none", got)
		}
		p.idle(t)
	})
}
