package db_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/tooling/pgwire"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// bundle is a one-connection pool through a counting proxy, with a
// table to write to, warmed so every statement below is prepared.
type bundle struct {
	pool   *pgxpool.Pool // through the proxy
	direct *pgxpool.Pool // for assertions
	wire   *pgwire.Proxy
}

func setup(t *testing.T) *bundle {
	t.Helper()
	direct, dbURL := testdb.NewPool(t)
	if _, err := direct.Exec(t.Context(), `CREATE TABLE things (id int PRIMARY KEY, note text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	wire, cfg := testkit.WireProxy(t, dbURL)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	p := &bundle{pool: pool, direct: direct, wire: wire}
	// Warm up: prepare every statement the tests send, then forget the row.
	must(t, db.WithPipelinedTx(t.Context(), pool, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := db.Deferred(tx).Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, "1000ms"); err != nil {
			return err
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if err := insert(ctx, sp, 0, "warm"); err != nil {
			return err
		}
		return sp.Rollback(ctx)
	}))
	// Savepoint names count from 1 in each transaction, so the RELEASE of
	// the first one is prepared in a transaction of its own.
	must(t, db.WithPipelinedTx(t.Context(), pool, func(ctx context.Context, tx pgx.Tx) error {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if err := insert(ctx, sp, 0, "warm"); err != nil {
			return err
		}
		if err := sp.Commit(ctx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM things`); err != nil {
			return err
		}
		db.CommitAfterNext(tx)
		var n int
		return tx.QueryRow(ctx, `SELECT count(*) FROM things`).Scan(&n)
	}))
	return p
}

func insert(ctx context.Context, tx pgx.Tx, id int, note string) error {
	_, err := tx.Exec(ctx, `INSERT INTO things (id, note) VALUES ($1, $2)`, id, note)
	return err
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (p *bundle) notes(t *testing.T) []string {
	t.Helper()
	rows, err := p.direct.Query(t.Context(), `SELECT note FROM things ORDER BY id`)
	must(t, err)
	notes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	must(t, err)
	return notes
}

// idle checks that the pool's connection came back outside any
// transaction: the next transaction does not inherit an aborted one.
func (p *bundle) idle(t *testing.T) {
	t.Helper()
	c, err := p.pool.Acquire(t.Context())
	must(t, err)
	defer c.Release()
	if s := c.Conn().PgConn().TxStatus(); s != 'I' {
		t.Fatalf("connection back in the pool in transaction state %q, want 'I'", s)
	}
	var n int
	must(t, c.QueryRow(t.Context(), `SELECT 1`).Scan(&n))
}

func (p *bundle) roundTrips(t *testing.T, fn func(ctx context.Context, tx pgx.Tx) error) (int64, error) {
	t.Helper()
	var txErr error
	got, err := p.wire.Measure(t.Context(), func() error {
		txErr = db.WithPipelinedTx(t.Context(), p.pool, fn)
		return nil
	})
	must(t, err)
	return got.RoundTrips, txErr
}

func TestPipelinedTransaction(t *testing.T) {
	t.Run("BeginTravelsWithTheFirstStatement", func(t *testing.T) {
		p := setup(t)
		n, err := p.roundTrips(t, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := db.Deferred(tx).Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, "1000ms"); err != nil {
				return err
			}
			return insert(ctx, tx, 1, "one")
		})
		must(t, err)
		if n != 2 { // [BEGIN, set_config, INSERT], [COMMIT]
			t.Errorf("round trips = %d, want 2", n)
		}
		if got := p.notes(t); len(got) != 1 || got[0] != "one" {
			t.Errorf("rows = %q, want [one]", got)
		}
		p.idle(t)
	})

	// Statements of a savepoint (what idem.Store.Execute hands its work)
	// run in it, and a deferred statement through them (an outbox row)
	// still travels with the next one.
	t.Run("StatementsDeferLikeTheirTransaction", func(t *testing.T) {
		p := setup(t)
		n, err := p.roundTrips(t, func(ctx context.Context, tx pgx.Tx) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			st := db.StatementsOf(sp)
			if _, err := db.Deferred(st).Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, "1000ms"); err != nil {
				return err
			}
			if _, err := st.Exec(ctx, `INSERT INTO things (id, note) VALUES ($1, $2)`, 1, "one"); err != nil {
				return err
			}
			return sp.Commit(ctx)
		})
		must(t, err)
		if n != 2 { // [BEGIN, SAVEPOINT, set_config, INSERT], [RELEASE, COMMIT]
			t.Errorf("round trips = %d, want 2", n)
		}
		if got := p.notes(t); len(got) != 1 || got[0] != "one" {
			t.Errorf("rows = %q, want [one]", got)
		}
		p.idle(t)
	})

	t.Run("CommitTravelsWithTheLastStatement", func(t *testing.T) {
		p := setup(t)
		n, err := p.roundTrips(t, func(ctx context.Context, tx pgx.Tx) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if err := insert(ctx, sp, 1, "one"); err != nil {
				return err
			}
			if err := sp.Commit(ctx); err != nil {
				return err
			}
			db.CommitAfterNext(tx)
			return insert(ctx, tx, 2, "two")
		})
		must(t, err)
		if n != 2 { // [BEGIN, SAVEPOINT, INSERT], [RELEASE, INSERT, COMMIT]
			t.Errorf("round trips = %d, want 2", n)
		}
		if got := p.notes(t); len(got) != 2 {
			t.Errorf("rows = %q, want [one two]", got)
		}
		p.idle(t)
	})

	t.Run("AFailedLastStatementRollsTheCommitBack", func(t *testing.T) {
		p := setup(t)
		_, err := p.roundTrips(t, func(ctx context.Context, tx pgx.Tx) error {
			if err := insert(ctx, tx, 1, "one"); err != nil {
				return err
			}
			db.CommitAfterNext(tx)
			return insert(ctx, tx, 1, "duplicate") // unique violation
		})
		if err == nil {
			t.Fatal("WithPipelinedTx: nil error, want the unique violation")
		}
		if got := p.notes(t); len(got) != 0 {
			t.Errorf("rows = %q, want none: the COMMIT behind a failed statement must roll back", got)
		}
		p.idle(t)
	})

	// The server skips a COMMIT queued behind a failed statement, leaving
	// the transaction open and aborted: the Tx rolls it back, so a
	// connection the caller holds (BeginPipelinedOn, as idem.Store.Execute does)
	// is usable at once, in the same session.
	t.Run("AHeldConnectionIsIdleAfterAFailedCommit", func(t *testing.T) {
		p := setup(t)
		conn, err := p.pool.Acquire(t.Context())
		must(t, err)
		defer conn.Release()
		var before, after int
		must(t, conn.QueryRow(t.Context(), `SELECT pg_backend_pid()`).Scan(&before))
		err = db.WithPipelinedTxOn(t.Context(), conn, func(ctx context.Context, tx pgx.Tx) error {
			if err := insert(ctx, tx, 1, "one"); err != nil {
				return err
			}
			db.CommitAfterNext(tx)
			return insert(ctx, tx, 1, "duplicate") // unique violation
		})
		if err == nil {
			t.Fatal("WithPipelinedTx: nil error, want the unique violation")
		}
		if s := conn.Conn().PgConn().TxStatus(); s != 'I' {
			t.Fatalf("held connection in transaction state %q after the failed COMMIT, want 'I'", s)
		}
		must(t, conn.QueryRow(t.Context(), `SELECT pg_backend_pid()`).Scan(&after))
		if after != before {
			t.Errorf("backend %d after the transaction, was %d: the held connection was replaced", after, before)
		}
		if got := p.notes(t); len(got) != 0 {
			t.Errorf("rows = %q, want none", got)
		}
	})

	t.Run("AFailedQueuedStatementStopsWhatFollows", func(t *testing.T) {
		p := setup(t)
		_, err := p.roundTrips(t, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := db.Deferred(tx).Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, "not a duration"); err != nil {
				return err
			}
			return insert(ctx, tx, 1, "one")
		})
		if err == nil {
			t.Fatal("WithPipelinedTx: nil error, want the queued statement's failure")
		}
		if got := p.notes(t); len(got) != 0 {
			t.Errorf("rows = %q, want none", got)
		}
		p.idle(t)
	})

	t.Run("ASavepointRolledBackAfterAFailure", func(t *testing.T) {
		p := setup(t)
		_, err := p.roundTrips(t, func(ctx context.Context, tx pgx.Tx) error {
			if err := insert(ctx, tx, 1, "kept"); err != nil {
				return err
			}
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if err := insert(ctx, sp, 2, "undone"); err != nil {
				return err
			}
			if err := insert(ctx, sp, 1, "duplicate"); err == nil {
				return errors.New("the duplicate insert succeeded")
			}
			// The transaction is aborted; rolling back to the savepoint
			// clears that, and the next statements run.
			if err := sp.Rollback(ctx); err != nil {
				return err
			}
			db.CommitAfterNext(tx)
			return insert(ctx, tx, 3, "after")
		})
		must(t, err)
		if got := p.notes(t); len(got) != 2 || got[0] != "kept" || got[1] != "after" {
			t.Errorf("rows = %q, want [kept after]", got)
		}
		p.idle(t)
	})

	t.Run("AnErrorRollsBack", func(t *testing.T) {
		p := setup(t)
		boom := errors.New("boom")
		_, err := p.roundTrips(t, func(ctx context.Context, tx pgx.Tx) error {
			if err := insert(ctx, tx, 1, "one"); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("WithPipelinedTx = %v, want boom", err)
		}
		if got := p.notes(t); len(got) != 0 {
			t.Errorf("rows = %q, want none", got)
		}
		p.idle(t)
	})

	t.Run("APanicRollsBack", func(t *testing.T) {
		p := setup(t)
		func() {
			defer func() { _ = recover() }()
			_ = db.WithPipelinedTx(t.Context(), p.pool, func(ctx context.Context, tx pgx.Tx) error {
				if err := insert(ctx, tx, 1, "one"); err != nil {
					return err
				}
				panic("boom")
			})
		}()
		if got := p.notes(t); len(got) != 0 {
			t.Errorf("rows = %q, want none", got)
		}
		p.idle(t)
	})

	t.Run("NothingSentNothingToEnd", func(t *testing.T) {
		p := setup(t)
		n, err := p.roundTrips(t, func(ctx context.Context, tx pgx.Tx) error { return nil })
		must(t, err)
		if n != 0 {
			t.Errorf("round trips = %d, want 0 for a transaction that ran nothing", n)
		}
		p.idle(t)
	})

	t.Run("RowsCarryTheCommit", func(t *testing.T) {
		p := setup(t)
		var got []string
		_, err := p.roundTrips(t, func(ctx context.Context, tx pgx.Tx) error {
			if err := insert(ctx, tx, 1, "one"); err != nil {
				return err
			}
			if err := insert(ctx, tx, 2, "two"); err != nil {
				return err
			}
			db.CommitAfterNext(tx)
			rows, err := tx.Query(ctx, `SELECT note FROM things ORDER BY id`)
			if err != nil {
				return err
			}
			got, err = pgx.CollectRows(rows, pgx.RowTo[string])
			return err
		})
		must(t, err)
		if len(got) != 2 || len(p.notes(t)) != 2 {
			t.Errorf("read %q, committed %q; want two rows each", got, p.notes(t))
		}
		p.idle(t)
	})
}
