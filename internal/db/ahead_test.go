package db_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/db"
)

// Statements queued ahead of BEGIN (db.Ahead) are what the one-transaction
// idempotency path's lookup rides on (idem.Store.Execute): these tests pin
// the server's behaviour it relies on, on a real PostgreSQL.
func TestStatementsAheadOfBegin(t *testing.T) {
	readAhead := func(tx pgx.Tx, id int, note *string) error {
		return db.Ahead(tx, func(q db.DBTX) error {
			err := q.QueryRow(context.Background(), `SELECT note FROM things WHERE id = $1`, id).Scan(note)
			if errors.Is(err, pgx.ErrNoRows) {
				*note = "(none)"
				return nil
			}
			return err
		})
	}
	// failAhead queues a statement that fails when it runs: the server
	// must skip everything behind it.
	failAhead := func(tx pgx.Tx) error {
		return db.Ahead(tx, func(q db.DBTX) error {
			_, err := q.Exec(context.Background(), `SELECT 1 / $1::int`, 0)
			return err
		})
	}
	warm := func(p *bundle) {
		// Run every statement below once in a round trip with statements
		// ahead, where they are prepared by name, so the counts below are
		// the hot path's.
		must(t, db.WithPipelinedTx(t.Context(), p.pool, func(ctx context.Context, tx pgx.Tx) error {
			var note string
			if err := readAhead(tx, 0, &note); err != nil {
				return err
			}
			if err := db.Ahead(tx, func(q db.DBTX) error {
				_, err := q.Exec(ctx, `SELECT 1 / $1::int`, 1)
				return err
			}); err != nil {
				return err
			}
			db.CommitAfterNext(tx)
			return insert(ctx, tx, 99, "warm")
		}))
		if _, err := p.direct.Exec(t.Context(), `DELETE FROM things`); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("TheyTravelWithBeginAndTheFirstStatement", func(t *testing.T) {
		p := setup(t)
		warm(p)
		_, err := p.direct.Exec(t.Context(), `INSERT INTO things (id, note) VALUES (7, 'there before')`)
		must(t, err)
		var seen string
		n, err := p.roundTrips(t, func(ctx context.Context, tx pgx.Tx) error {
			if err := readAhead(tx, 7, &seen); err != nil {
				return err
			}
			if seen != "" {
				t.Errorf("the read ahead ran when queued: %q", seen)
			}
			db.CommitAfterNext(tx)
			return insert(ctx, tx, 8, "one")
		})
		must(t, err)
		if n != 1 { // [read, BEGIN, INSERT, COMMIT]
			t.Errorf("round trips = %d, want 1", n)
		}
		if seen != "there before" {
			t.Errorf("read ahead %q, want %q", seen, "there before")
		}
		if got := p.notes(t); len(got) != 2 || got[1] != "one" {
			t.Errorf("rows = %q, want [there before, one]", got)
		}
		p.idle(t)
	})

	t.Run("AFailureAheadRunsNothingBehindIt", func(t *testing.T) {
		p := setup(t)
		warm(p)
		var seen string
		var insertErr, laterErr error
		n, err := p.roundTrips(t, func(ctx context.Context, tx pgx.Tx) error {
			if err := readAhead(tx, 7, &seen); err != nil {
				return err
			}
			if err := failAhead(tx); err != nil {
				return err
			}
			db.CommitAfterNext(tx) // must not commit either
			insertErr = insert(ctx, tx, 1, "one")
			// Work that ignores the error cannot write or commit.
			laterErr = insert(ctx, tx, 2, "two")
			return nil
		})
		var pgErr *pgconn.PgError
		if !errors.As(insertErr, &pgErr) || pgErr.Code != "22012" {
			t.Errorf("the statement behind a failure ahead returned %v, want the failure (22012)", insertErr)
		}
		if !errors.Is(laterErr, pgx.ErrTxClosed) {
			t.Errorf("a statement after it returned %v, want pgx.ErrTxClosed", laterErr)
		}
		if err == nil {
			t.Error("the transaction committed after a failure ahead of BEGIN")
		}
		if n != 1 { // [read, failure, BEGIN, INSERT, COMMIT]: no ROLLBACK needed
			t.Errorf("round trips = %d, want 1", n)
		}
		if seen != "(none)" {
			t.Errorf("the read ahead of the failure gave %q, want its answer, (none)", seen)
		}
		if got := p.notes(t); len(got) != 0 {
			t.Errorf("rows = %q, want none", got)
		}
		p.idle(t)
	})

	// pgx forgets the prepared statements of a batch that failed; those of
	// a round trip with statements ahead of BEGIN are prepared apart, so a
	// failure ahead (every replay's) costs the next request nothing.
	t.Run("AFailureAheadLeavesTheStatementsPrepared", func(t *testing.T) {
		p := setup(t)
		warm(p)
		var seen string
		stopped := func(ctx context.Context, tx pgx.Tx) error {
			if err := readAhead(tx, 7, &seen); err != nil {
				return err
			}
			if err := failAhead(tx); err != nil {
				return err
			}
			return insert(ctx, tx, 1, "one")
		}
		succeeded := func(ctx context.Context, tx pgx.Tx) error {
			if err := readAhead(tx, 7, &seen); err != nil {
				return err
			}
			db.CommitAfterNext(tx)
			return insert(ctx, tx, 1, "one")
		}
		// Once per connection: the statements are prepared by name, and
		// what the statement cache held of them before is dropped.
		for range 2 {
			must(t, db.WithPipelinedTx(t.Context(), p.pool, succeeded))
			if _, err := p.direct.Exec(t.Context(), `DELETE FROM things`); err != nil {
				t.Fatal(err)
			}
			if _, err := p.roundTrips(t, stopped); err == nil {
				t.Fatal("the round trip was not stopped")
			}
		}
		n, err := p.roundTrips(t, stopped)
		if err == nil || n != 1 {
			t.Errorf("the same stopped round trip again: %d round trips (%v), want 1 and the failure", n, err)
		}
		n, err = p.roundTrips(t, succeeded)
		must(t, err)
		if n != 1 {
			t.Errorf("round trips after a failure ahead = %d, want 1: its statements were prepared again", n)
		}
	})

	// Behind PgBouncer's transaction pooling the service runs in pgx's exec
	// mode, where no statement may be prepared by name: the next server
	// connection would not have it.
	t.Run("NothingPreparedByNameInExecMode", func(t *testing.T) {
		p := setup(t)
		cfg, err := pgxpool.ParseConfig(p.direct.Config().ConnConfig.ConnString())
		must(t, err)
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		cfg.MaxConns = 1
		pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
		must(t, err)
		defer pool.Close()
		var seen string
		for range 2 {
			err := db.WithPipelinedTx(t.Context(), pool, func(ctx context.Context, tx pgx.Tx) error {
				if err := readAhead(tx, 7, &seen); err != nil {
					return err
				}
				if err := failAhead(tx); err != nil {
					return err
				}
				return insert(ctx, tx, 1, "one")
			})
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "22012" {
				t.Fatalf("a failure ahead in exec mode: %v, want the failure (22012)", err)
			}
		}
		var prepared int
		must(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_prepared_statements`).Scan(&prepared))
		if prepared != 0 {
			t.Errorf("%d statements prepared by name on an exec-mode connection, want none", prepared)
		}
		if got := p.notes(t); len(got) != 0 {
			t.Errorf("rows = %q, want none", got)
		}
	})

	// The server makes what ran ahead of BEGIN part of the transaction
	// BEGIN opens: a rollback takes it back too.
	t.Run("TheyArePartOfTheTransaction", func(t *testing.T) {
		p := setup(t)
		rolledBack := errors.New("rolled back on purpose")
		_, err := p.roundTrips(t, func(ctx context.Context, tx pgx.Tx) error {
			if err := db.Ahead(tx, func(q db.DBTX) error {
				_, err := q.Exec(ctx, `INSERT INTO things (id, note) VALUES ($1, $2)`, 2, "ahead")
				return err
			}); err != nil {
				return err
			}
			if err := insert(ctx, tx, 1, "one"); err != nil {
				return err
			}
			return rolledBack
		})
		if !errors.Is(err, rolledBack) {
			t.Fatalf("err = %v, want %v", err, rolledBack)
		}
		if got := p.notes(t); len(got) != 0 {
			t.Errorf("rows = %q after the rollback, want none: what ran ahead of BEGIN was not in the transaction", got)
		}
		p.idle(t)
	})

	t.Run("OnlyBeforeTheFirstRoundTrip", func(t *testing.T) {
		p := setup(t)
		_, err := p.roundTrips(t, func(ctx context.Context, tx pgx.Tx) error {
			if err := db.Ahead(tx, func(q db.DBTX) error { return nil }); err == nil {
				t.Error("a statement ahead that runs no statement was accepted")
			}
			if err := insert(ctx, tx, 1, "one"); err != nil {
				return err
			}
			var note string
			if err := readAhead(tx, 1, &note); err == nil {
				t.Error("a statement was queued ahead of a BEGIN already sent")
			}
			return nil
		})
		must(t, err)
	})
}
