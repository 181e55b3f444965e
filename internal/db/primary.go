package db

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Two rules keep what the service acknowledges on the primary, and so
// through a failover (D1, D6). Both come from what the chaos harness's
// split brain did to the service behind PgBouncer (docs/deployment.md,
// "The orchestrator").
//
// Every transaction is the primary's. A pooled connection outlives the
// role of the server behind it: PgBouncer keeps its clients' connections
// while the server it points at is demoted and restarted as a standby,
// and a standby that was a cut-off leader holds commits no client was
// told of (they waited for a standby that never confirmed them, and
// pg_rewind will remove them). Reading an idempotency key there would
// replay a response that the new primary knows nothing of. So every
// transaction begins READ WRITE, which a server in recovery refuses at
// once, the error is transient (503 with Retry-After: the retry lands on
// the primary), and the connection is closed, so that the pool's next one
// goes through target_session_attrs=read-write again.
// A read that travels ahead of BEGIN (the idempotency key's lookup, P7)
// refuses a standby itself: the key's queries start with on_primary()
// (migration 000020), which fails with codeReadOnlyTransaction there.
//
// A COMMIT is never cancelled. With synchronous replication a COMMIT waits
// until the standby has the transaction; a cancel request ends that wait
// with the transaction committed on the primary alone, visible there, and
// reported to the client as a success (PostgreSQL's WARNING "canceling
// wait for synchronous replication ... might not have been replicated").
// pgx sends a cancel request whenever a query's context ends, so a request
// whose deadline passed during that wait would turn an unknown outcome
// into an acknowledged write a failover then loses. COMMIT therefore runs
// under context.WithoutCancel: it waits for the server's own answer, which
// the standby's confirmation, the orchestrator's demotion of a cut-off
// primary (the backend is terminated, and terminating reports no success)
// or the connection's loss brings; a server gone silent loses it within
// tcp_user_timeout (deadpeer.go).

// beginReadWrite begins every transaction the service runs on a pooled
// connection: a server in recovery refuses it ("cannot set transaction
// read-write mode during recovery").
const beginReadWrite = "BEGIN READ WRITE"

// readWrite is beginReadWrite for pgx's own transactions.
var readWrite = pgx.TxOptions{AccessMode: pgx.ReadWrite}

// ErrNotPrimary reports that the server refused a transaction because it
// is not the primary (in recovery, or read-only). It is transient: the
// connection has been closed, and a new one finds the primary.
var ErrNotPrimary = errors.New("the database server is not the primary")

// SQLSTATEs a server that is not the primary answers with.
const (
	// codeReadOnlyTransaction: a write on a standby or in a read-only
	// transaction.
	codeReadOnlyTransaction = "25006"
	// codeFeatureNotSupported: how a server in recovery refuses BEGIN READ
	// WRITE (the setting's check hook fails).
	codeFeatureNotSupported = "0A000"
)

// notPrimary marks err, the failure of BEGIN READ WRITE, as ErrNotPrimary
// when the server refused the mode; any other failure is returned as is.
func notPrimary(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == codeFeatureNotSupported || pgErr.Code == codeReadOnlyTransaction) {
		return fmt.Errorf("%w: %w", ErrNotPrimary, err)
	}
	return err
}

// txBeginner is a Beginner that can begin a transaction with options: a
// pool or a connection, not a transaction (whose Begin is a savepoint,
// read-write when its transaction is).
type txBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// beginPrimary begins a transaction on b, READ WRITE where b can begin one.
func beginPrimary(ctx context.Context, b Beginner) (pgx.Tx, error) {
	if tb, ok := b.(txBeginner); ok {
		tx, err := tb.BeginTx(ctx, readWrite)
		return tx, notPrimary(err)
	}
	return b.Begin(ctx)
}

// commitContext is the context a COMMIT runs under: ctx's values (the
// trace), never its cancellation or deadline.
func commitContext(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

// closeWhenNotPrimary makes every connection of cfg close itself when the
// server answers as a standby would, so that the pool replaces it with one
// that target_session_attrs sends to the primary. The previous handler
// (pgx's closes on FATAL) still runs for every other error.
func closeWhenNotPrimary(cfg *pgxpool.Config) {
	next := cfg.ConnConfig.OnPgError
	cfg.ConnConfig.OnPgError = func(conn *pgconn.PgConn, pgErr *pgconn.PgError) bool {
		if pgErr.Code == codeReadOnlyTransaction || pgErr.Code == codeFeatureNotSupported {
			return false
		}
		if next != nil {
			return next(conn, pgErr)
		}
		return true
	}
}
