package testdb

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/db"
)

// acquireTimeout bounds how long Tx waits for a connection of the shared
// pool. Tests hold their connection for as long as they run, so a binary
// whose tests hold more transactions at once than the pool has connections
// would otherwise hang until the go test timeout; failing with a message
// that says why is kinder.
const acquireTimeout = time.Minute

// ErrCommit is what Commit returns on a transaction from Tx: its rows must
// vanish when the test ends, so it is never committed. A test that needs
// real commits uses New or NewPool.
var ErrCommit = errors.New("testdb: a Tx is rolled back when the test ends and cannot commit; use testdb.New or testdb.NewPool for real commits")

var (
	sharedOnce sync.Once
	sharedName string
	sharedPool *pgxpool.Pool
	sharedErr  error
)

// Tx returns a transaction on a database shared by every test of this test
// binary, rolled back when the test ends. This is the fast tier: the
// database is cloned from the template once per process, the first time a
// test asks for it, and each Tx costs one BEGIN, so tests using it can run
// in parallel and leave nothing behind.
//
// Inside the transaction the code under test may begin and commit nested
// transactions (pgx makes them savepoints), so a function that takes a
// db.Beginner works as is. Commit on the returned transaction itself
// fails with ErrCommit. Rows written through it are invisible to every
// other Tx, but parallel tests still share the database: each test should
// write under keys of its own (a fresh tenant) so that it never waits on a
// row lock another test holds.
func Tx(t testing.TB) pgx.Tx {
	t.Helper()
	pool, err := shared(t)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), acquireTimeout)
	defer cancel()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatalf("testdb: begin on the shared database (more transactions open at once than the %d connections of the pool?): %v",
			pool.Config().MaxConns, err)
	}
	t.Cleanup(func() {
		// t.Context is already cancelled when cleanups run; the rollback
		// must happen anyway, or the connection returns to the pool inside
		// an open transaction.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
		defer cancel()
		if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("testdb: roll back: %v", err)
		}
	})
	return rollbackOnlyTx{tx}
}

// rollbackOnlyTx is a pgx.Tx whose Commit fails, so that a test cannot
// leave rows in the database that other tests share.
type rollbackOnlyTx struct{ pgx.Tx }

func (rollbackOnlyTx) Commit(context.Context) error { return ErrCommit }

// shared returns the pool on the shared database, creating both on first
// use. The database is dropped by Main when the tests end.
func shared(t testing.TB) (*pgxpool.Pool, error) {
	t.Helper()
	admin := AdminURL(t)
	sharedOnce.Do(func() { sharedPool, sharedErr = openShared(admin) })
	return sharedPool, sharedErr
}

func openShared(admin string) (*pgxpool.Pool, error) {
	template, err := migratedTemplate(admin)
	if err != nil {
		return nil, err
	}
	name, dbURL, err := cloneDatabase(admin, template)
	if err != nil {
		return nil, err
	}
	// Recorded before anything else can fail, so Main drops it.
	sharedName = name
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("testdb: shared database: %w", err)
	}
	db.Configure(cfg)
	// Every running test holds one connection for its whole duration, and
	// a parallel parent test keeps its own while its parallel subtests
	// run, so the pool needs more connections than -parallel allows tests.
	cfg.MaxConns = db.Int32(max(16, 4*runtime.GOMAXPROCS(0)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("testdb: open pool on the shared database: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("testdb: ping the shared database: %w", err)
	}
	return pool, nil
}

// closeShared closes the pool on the shared database and drops it, if a
// test created it.
func closeShared() {
	if sharedPool != nil {
		sharedPool.Close()
	}
	if sharedName == "" {
		return
	}
	if err := dropDatabase(adminURL, sharedName); err != nil {
		log.Error("drop the shared test database", "err", err)
	}
}
