// Package db owns the connection pool, the transaction helpers (WithTx, a
// plain pgx transaction, and WithPipelinedTx, which the idempotency paths
// choose for its fewer round trips) and the translation of PostgreSQL
// errors into the few facts the rest of the code branches on (unique
// violation by constraint name, lock timeout, transient).
// The generated sqlc code lives in the dbsqlc subpackage; only domain
// packages import it.
package db

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Open creates a pool for databaseURL (postgres://...). Pool settings such
// as pool_max_conns may be given as URL parameters. Open does not fail when
// the database is down: the pool connects lazily, so the service starts and
// answers 503 until the database is back, and /readyz reports it. Every
// connection it opens encodes uuid.UUID natively (Configure), and its
// statements are traced under the span of their request (tracing.go), and
// it ends when its server goes silent (deadpeer.go: tcp_user_timeout).
// Options override what the URL says.
func Open(ctx context.Context, databaseURL string, opts ...Option) (*pgxpool.Pool, error) {
	cfg, err := ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse the database URL: %w", err)
	}
	if err := detectDeadPeers(&cfg.ConnConfig.Config); err != nil {
		return nil, fmt.Errorf("parse the database URL: %w", err)
	}
	Configure(cfg)
	for _, opt := range opts {
		opt(cfg)
	}
	withTracer(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("create pool: %w", err)
	}
	return pool, nil
}

// Option changes a pool's configuration.
type Option func(*pgxpool.Config)

// MaxConns bounds the pool to n connections.
func MaxConns(n int32) Option {
	return func(c *pgxpool.Config) { c.MaxConns = n }
}

// ParseConfig is pgxpool.ParseConfig with an error that never quotes
// databaseURL (R8): pgx's error quotes it with a password masked on a best
// effort only, and the errors it wraps may quote a part of it.
func ParseConfig(databaseURL string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err == nil {
		return cfg, nil
	}
	var fileErr *fs.PathError
	if errors.As(err, &fileErr) {
		return nil, fmt.Errorf("a file it names cannot be read: %w", fileErr)
	}
	// pgx's own parser says little more than that it failed: net/url
	// failing too (which pgx does not ask first) points at the syntax.
	_, urlErr := url.Parse(databaseURL)
	switch {
	case !strings.HasPrefix(databaseURL, "postgres://") && !strings.HasPrefix(databaseURL, "postgresql://"):
		return nil, errors.New("want a URL such as postgres://user:password@host:5432/db?sslmode=require")
	case urlErr != nil:
		return nil, errors.New("it does not parse as a URL: a user or password holding @ : / ? # % or white space is percent-encoded (%40 for @), and a port is a number")
	}
	return nil, errors.New("pgx refuses a parameter or its value, such as sslmode (disable, require, verify-full...) or pool_max_conns (a number)")
}

// Beginner is what WithTx needs: a pool, a connection or a transaction
// (which yields a savepoint).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// WithTx runs fn inside a plain pgx transaction: BEGIN, fn's statements,
// COMMIT, each in its own round trip. It commits when fn returns nil; a
// panic in fn rolls the transaction back and goes on panicking. This is
// the transaction for everything that is not the idempotency pattern's own
// path; that path uses the pipelined one (WithPipelinedTx, in
// pipeline.go), which spends fewer round trips and asks more of its
// caller.
//
// The rollback runs under context.WithoutCancel: a request whose context was
// cancelled must still roll back, or the connection goes back to the pool
// in an aborted transaction. So does the COMMIT, for a reason of its own:
// a cancelled COMMIT can be a success the standby never saw (primary.go).
// The transaction begins READ WRITE, so that a standby refuses it
// (ErrNotPrimary). Commit errors are returned, never swallowed: a failed
// COMMIT means the work did not happen (or, on a lost connection, that
// nobody knows, which is exactly the case idempotency keys exist for).
//
// WithTx does not retry. Serialization failures and deadlocks surface to the
// caller as transient errors (see IsTransient); the one-transaction
// idempotency path answers 503 and the client's retry runs it again.
func WithTx(ctx context.Context, db Beginner, fn func(ctx context.Context, tx pgx.Tx) error) error {
	tx, err := beginPrimary(ctx, db)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	return runTx(ctx, tx, fn)
}

// runTx runs fn in tx, which has begun, and commits when fn returns nil.
// WithTx and WithPipelinedTx share it: they differ only in how the
// transaction travels.
func runTx(ctx context.Context, tx pgx.Tx, fn func(ctx context.Context, tx pgx.Tx) error) error {
	// Always roll back, on every way out: after a commit it is a no-op, and
	// after an error or a panic it ends the transaction, so the connection
	// goes back to the pool clean and every row lock it held (an
	// idempotency key's claim) is released at once. A rollback only on a
	// returned error would leave a panicking request's connection checked
	// out, idle in transaction, holding the key until restart.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(ctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(commitContext(ctx)); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// SQLSTATE codes the code branches on. See
// https://www.postgresql.org/docs/current/errcodes-appendix.html.
const (
	codeUniqueViolation      = "23505"
	codeSerializationFailure = "40001"
	codeDeadlockDetected     = "40P01"
	codeLockNotAvailable     = "55P03" // raised when lock_timeout expires
	codeQueryCanceled        = "57014" // statement_timeout or a cancel request
	codeAdminShutdown        = "57P01"
	codeCrashShutdown        = "57P02"
	codeCannotConnectNow     = "57P03"
	codeTooManyConnections   = "53300"
)

// IsUniqueViolation reports whether err is a unique violation of the named
// constraint. Matching on the constraint name (not the message text) keeps
// the check exact and stable across PostgreSQL versions and locales.
func IsUniqueViolation(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == codeUniqueViolation && pgErr.ConstraintName == constraint
}

// IsLockTimeout reports whether a statement gave up waiting for a lock
// because lock_timeout expired.
func IsLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == codeLockNotAvailable
}

// IsTransient reports whether err is a failure that says nothing about the
// request itself: running the same request again may well succeed. These
// are never recorded as an idempotent outcome (O2).
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrNotPrimary) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case codeSerializationFailure, codeDeadlockDetected, codeLockNotAvailable, codeQueryCanceled,
			codeAdminShutdown, codeCrashShutdown, codeCannotConnectNow, codeTooManyConnections,
			codeReadOnlyTransaction:
			return true
		}
		// Class 08: connection exceptions.
		return len(pgErr.Code) == 5 && pgErr.Code[:2] == "08"
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.As(err, &connectErr),
		errors.As(err, &netErr),
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, context.Canceled),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE),
		errors.Is(err, pgconn.ErrConnClosed),
		pgconn.Timeout(err),
		pgconn.SafeToRetry(err):
		return true
	}
	return false
}
