package db_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/tooling/pgtmp"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// The rules of primary.go, on real servers: a commit waiting for a
// synchronous standby is not cancelled when its request's context ends,
// and a server in recovery refuses every transaction.

// TestACommitWaitingForTheStandbyIsNeverCancelled runs transactions on a
// primary whose synchronous standby never confirms (it names one that does
// not exist), so every commit waits, as it does on a leader cut off from
// its standby. The request's context ends during the wait. Cancelling the
// wait would commit the row on the primary alone, visible there; instead
// the commit must go on waiting, invisible, and end as a failure when the
// server terminates it (as a demotion does), never as a success.
func TestACommitWaitingForTheStandbyIsNeverCancelled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	server := testkit.Postgres(ctx, t, pgtmp.Options{Settings: map[string]string{
		"synchronous_commit":        "on",
		"synchronous_standby_names": "nobody",
	}})
	admin := server.URL("postgres") + "&options=-c%20synchronous_commit%3Dlocal"
	execSQL(ctx, t, admin, "CREATE TABLE acked (id int PRIMARY KEY)")
	pool, err := db.Open(ctx, server.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	for id, run := range map[int]func(ctx context.Context, fn func(context.Context, pgx.Tx) error) error{
		1: func(ctx context.Context, fn func(context.Context, pgx.Tx) error) error {
			return db.WithTx(ctx, pool, fn)
		},
		2: func(ctx context.Context, fn func(context.Context, pgx.Tx) error) error {
			return db.WithPipelinedTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
				db.CommitAfterNext(tx) // COMMIT travels with the insert
				return fn(ctx, tx)
			})
		},
	} {
		name := map[int]string{1: "WithTx", 2: "WithPipelinedTx"}[id]
		t.Run(name, func(t *testing.T) {
			reqCtx, reqCancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer reqCancel()
			done := make(chan error, 1)
			go func() {
				done <- run(reqCtx, func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "INSERT INTO acked (id) VALUES ($1)", id)
					return err
				})
			}()
			<-reqCtx.Done()
			time.Sleep(time.Second) // a cancel request would have landed by now
			select {
			case err := <-done:
				t.Fatalf("the transaction returned (%v) while its commit could only wait for the standby", err)
			default:
			}
			if n := countRows(ctx, t, admin, id); n != 0 {
				t.Fatalf("the row is visible on the primary alone after the request's context ended: its commit's wait was cancelled")
			}
			var terminated int
			queryRow(ctx, t, admin, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE wait_event = 'SyncRep'", &terminated)
			if terminated != 1 {
				t.Fatalf("%d backends waited for the standby, want 1", terminated)
			}
			if err := <-done; err == nil {
				t.Fatal("the commit the server terminated was reported a success")
			} else {
				t.Logf("ended with: %v", err)
			}
		})
	}
}

// TestAStandbyRefusesEveryTransaction reaches a standby through the
// service's own pool, as a pooled connection does once PgBouncer's server
// has been demoted under it. The standby has a row (a recorded response,
// say) that a transaction must not read: every transaction fails at its
// BEGIN with ErrNotPrimary, a transient error, and the connection is
// closed so that the pool's next one can find the primary.
func TestAStandbyRefusesEveryTransaction(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary := testkit.Postgres(ctx, t, pgtmp.Options{})
	execSQL(ctx, t, primary.URL("postgres"), "CREATE TABLE recorded (k text); INSERT INTO recorded VALUES ('replayed')")
	standby := testkit.Postgres(ctx, t, pgtmp.Options{Standby: &pgtmp.Standby{Primary: fmt.Sprintf("127.0.0.1:%d", primary.Port()), Name: "standby1"}})
	for deadline := time.Now().Add(30 * time.Second); countRecorded(ctx, standby.URL("postgres")) != 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the standby never received the row")
		}
	}
	pool, err := db.Open(ctx, standby.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	read := func(ctx context.Context, tx pgx.Tx) error {
		var k string
		if err := tx.QueryRow(ctx, "SELECT k FROM recorded").Scan(&k); err != nil {
			return err
		}
		return fmt.Errorf("read %q on a standby", k)
	}
	for name, run := range map[string]func() error{
		"WithTx":          func() error { return db.WithTx(ctx, pool, read) },
		"WithPipelinedTx": func() error { return db.WithPipelinedTx(ctx, pool, read) },
	} {
		t.Run(name, func(t *testing.T) {
			err := run()
			if !errors.Is(err, db.ErrNotPrimary) {
				t.Fatalf("err = %v, want ErrNotPrimary", err)
			}
			if !db.IsTransient(err) {
				t.Errorf("ErrNotPrimary is not transient: %v", err)
			}
			waitNoConns(t, pool)
		})
	}
	t.Run("WriteOutsideATransaction", func(t *testing.T) {
		_, err := pool.Exec(ctx, "INSERT INTO recorded VALUES ('new')")
		if err == nil || !db.IsTransient(err) {
			t.Fatalf("a write on a standby: err = %v, want a transient error", err)
		}
		waitNoConns(t, pool)
	})
}

// waitNoConns waits until pool holds no connection: the one that met the
// standby was closed rather than kept for the next request.
func waitNoConns(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); pool.Stat().TotalConns() != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the pool still holds %d connections to the standby", pool.Stat().TotalConns())
		}
	}
}

func execSQL(ctx context.Context, t *testing.T, url, sql string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func queryRow(ctx context.Context, t *testing.T, url, sql string, dest ...any) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, sql).Scan(dest...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func countRows(ctx context.Context, t *testing.T, url string, id int) int {
	t.Helper()
	var n int
	queryRow(ctx, t, url, fmt.Sprintf("SELECT count(*) FROM acked WHERE id = %d", id), &n)
	return n
}

// countRecorded counts the standby's rows; -1 while it cannot answer.
func countRecorded(ctx context.Context, url string) int {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return -1
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM recorded").Scan(&n); err != nil {
		return -1
	}
	return n
}
