package idem

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/dbmigrate"
	"github.com/idemref/payments/internal/tooling/pgtmp"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// D1, D6: a key's record is read on the primary only. A pooled connection
// can reach a standby (PgBouncer keeps its clients' connections while the
// server behind it is demoted), and a standby that was a cut-off leader
// holds commits no client was told of and pg_rewind will remove. Every
// transaction begins READ WRITE, which a standby refuses, but the key's
// lookup runs ahead of BEGIN: the key's row must not be replayed from
// there, nor reported by the key-status endpoint, nor by the lookup that
// goes alone when exec fails before its first statement. Each answer is
// the transient "not the primary" (503 with Retry-After upstream), so
// the client retries and reaches the primary, and the connection that
// met the standby is closed.
func TestAStandbyNeverAnswersForAKey(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	primary := testkit.Postgres(ctx, t, pgtmp.Options{})
	if err := dbmigrate.Up(ctx, primary.URL("postgres")); err != nil {
		t.Fatal(err)
	}
	h := &bundle{pool: openPool(ctx, t, primary.URL("postgres"))}
	if _, err := h.pool.Exec(ctx, `CREATE TABLE scratch (tenant_id uuid NOT NULL, v text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	h.tenant = h.newTenant(t)
	c := h.claim(t, "key-1", `{"amount":100}`)
	var calls atomic.Int32
	if _, _, err := NewStore(h.pool, Config{}).Execute(ctx, c, insertExec(&calls, h.tenant, "first", created(`{"id":"t_1"}`))); err != nil {
		t.Fatal(err)
	}
	multi := h.claim(t, "key-2", `{"amount":200}`)
	multi.Endpoint = otherEndpoint
	if _, err := NewStore(h.pool, Config{}).Begin(ctx, multi, firstStep(t, h)); err != nil {
		t.Fatal(err)
	}

	standby := testkit.Postgres(ctx, t, pgtmp.Options{Standby: &pgtmp.Standby{Primary: fmt.Sprintf("127.0.0.1:%d", primary.Port()), Name: "standby1"}})
	onStandby := openPool(ctx, t, standby.URL("postgres"))
	waitForKeys(ctx, t, standby.URL("postgres"), 2)
	store := NewStore(onStandby, Config{})

	for name, run := range map[string]func() (replayed bool, err error){
		"Replay": func() (bool, error) {
			_, replayed, err := store.Execute(ctx, c, notCalled(t))
			return replayed, err
		},
		"ReplayOfAFailureBeforeTheFirstStatement": func() (bool, error) {
			rejected := func(context.Context, UndoableTx) (Response, error) { return problem(422, "validation_failed"), nil }
			_, replayed, err := store.Execute(ctx, c, rejected)
			return replayed, err
		},
		"StatusOfACompletedKey": func() (bool, error) {
			_, err := store.Status(ctx, c.TenantID, c.Endpoint, c.Key)
			return false, err
		},
		"StatusOfAnUnknownKey": func() (bool, error) {
			_, err := store.Status(ctx, c.TenantID, c.Endpoint, "never-used")
			return false, err
		},
		"MultiStepReplay": func() (bool, error) {
			begun, err := store.Begin(ctx, multi, func(context.Context, pgx.Tx, Lease) (Step, error) {
				t.Error("the first step ran on a standby")
				return Step{}, nil
			})
			return begun.Replayed, err
		},
	} {
		t.Run(name, func(t *testing.T) {
			replayed, err := run()
			if replayed || !errors.Is(err, ErrUnavailable) {
				t.Fatalf("on a standby: replayed %v, err %v; want ErrUnavailable and no replay", replayed, err)
			}
			waitNoConns(t, onStandby)
		})
	}
	// exec's own error, before its first statement, is returned as it is:
	// the lookup that then goes alone finds nothing to replay.
	t.Run("LookupAfterAFailureBeforeTheFirstStatement", func(t *testing.T) {
		boom := errors.New("exec failed before its first statement")
		_, replayed, err := store.Execute(ctx, c, func(context.Context, UndoableTx) (Response, error) { return Response{}, boom })
		if replayed || !errors.Is(err, boom) {
			t.Fatalf("on a standby: replayed %v, err %v; want exec's error and no replay", replayed, err)
		}
		waitNoConns(t, onStandby)
	})
	if n := calls.Load(); n != 1 {
		t.Errorf("exec committed %d times, want 1 (on the primary)", n)
	}
}

// firstStep is a multi-step request's first step that completes the key
// at once with a 201.
func firstStep(t *testing.T, h *bundle) func(context.Context, pgx.Tx, Lease) (Step, error) {
	return func(ctx context.Context, tx pgx.Tx, _ Lease) (Step, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO scratch (tenant_id, v) VALUES ($1, 'step')`, h.tenant); err != nil {
			return Step{}, err
		}
		res := created(`{"id":"t_2"}`)
		return Step{Response: &res}, nil
	}
}

func openPool(ctx context.Context, t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := db.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// waitForKeys waits until the standby has replayed n key rows.
func waitForKeys(ctx context.Context, t *testing.T, url string, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if got, err := countKeys(ctx, url); err == nil && got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the standby never received the %d key rows", n)
		}
	}
}

func countKeys(ctx context.Context, url string) (int, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&n)
	return n, err
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
