package db

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
)

// Tx is a transaction that spends as few round trips as the work allows
// (P2). The statements whose results nothing waits on (BEGIN, SET LOCAL,
// SAVEPOINT, RELEASE, ROLLBACK TO) are queued and travel to the server in
// one pipeline with the next statement whose result the caller reads, and
// the caller may ask for COMMIT to travel behind its last statement. The
// server runs them in order exactly as if each had been sent alone: when a
// queued statement fails, the transaction is aborted and the error comes
// back from the statement that carried it, so nothing after it takes
// effect.
//
// This is a transport detail: the code running in a Tx reads as a plain
// sequence of statements. The one visible choice is CommitAfterNext, and
// its rule: only call it when no result of the statement that follows can
// change the decision to commit.
//
// A Tx is never the default: WithTx is a plain pgx transaction, and code
// asks for this one by name (WithPipelinedTx, WithPipelinedTxOn) where its
// round trips are the point, as on the idempotency paths (idem.Store's
// Execute, Begin and Phase), whose cost per request is measured on the
// wire (TestRoundTripsPerRequest in internal/http).
//
// A Tx implements pgx.Tx and is not safe for concurrent use, like any
// transaction.
type Tx struct {
	conn    *pgxpool.Conn
	pending []queued
	// begun: BEGIN has been sent, so ending the transaction needs a
	// statement on the wire.
	begun bool
	// commitNext: the next statement sent carries COMMIT behind it.
	commitNext bool
	// done: committed (with commitErr as the outcome) or rolled back; the
	// connection has gone back to the pool.
	done       bool
	committed  bool
	commitErr  error
	savepoints int
	// ahead: how many statements at the front of pending go ahead of
	// BEGIN (Ahead).
	ahead int
	// kept: the connection belongs to the caller (BeginPipelinedOn), who releases
	// it; ending the transaction leaves it checked out.
	kept bool
}

type queued struct {
	sql  string
	args []any
	// read reads the statement's result when the round trip is back (a
	// statement queued by Ahead); nil: only its error is looked at.
	read func(q DBTX) error
}

// BeginPipelined starts a pipelined transaction on a connection from pool.
// It costs no round trip: BEGIN goes out with the first statement.
func BeginPipelined(ctx context.Context, pool *pgxpool.Pool) (*Tx, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &Tx{conn: conn, pending: []queued{{sql: beginReadWrite}}}, nil
}

// BeginPipelinedOn starts a pipelined transaction on conn, a connection the
// caller has acquired and will release: a request that reads before its
// transaction and may read again after it (idem.Store.Execute) holds one
// connection throughout, instead of queueing for the pool three times.
func BeginPipelinedOn(conn *pgxpool.Conn) *Tx {
	return &Tx{conn: conn, kept: true, pending: []queued{{sql: beginReadWrite}}}
}

// WithPipelinedTx is WithTx on a Tx: fn runs in a pipelined transaction
// on a connection from pool, which goes back to the pool when it ends. In
// fn, db.Deferred queues statements whose results nothing reads and
// db.CommitAfterNext sends COMMIT with the last statement; the rollback
// and commit rules are WithTx's.
func WithPipelinedTx(ctx context.Context, pool *pgxpool.Pool, fn func(ctx context.Context, tx pgx.Tx) error) error {
	tx, err := BeginPipelined(ctx, pool)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	return runTx(ctx, tx, fn)
}

// WithPipelinedTxOn is WithPipelinedTx on conn, a connection the caller
// holds and keeps: it is still checked out when the transaction ends.
func WithPipelinedTxOn(ctx context.Context, conn *pgxpool.Conn, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return runTx(ctx, BeginPipelinedOn(conn), fn)
}

// release gives the connection back to the pool, unless the caller keeps it.
func (t *Tx) release() {
	if !t.kept {
		t.conn.Release()
	}
}

// Queue adds a statement whose result nothing waits on; it is sent with the
// next statement that is.
func (t *Tx) Queue(sql string, args ...any) {
	t.pending = append(t.pending, queued{sql: sql, args: args})
}

// CommitAfterNext makes the next statement carry COMMIT behind it in the
// same round trip; Commit then only reports that COMMIT's outcome. Use it
// only when nothing the next statement returns could make the caller roll
// back instead: an error from the statement itself still aborts the
// transaction, and COMMIT then rolls it back.
func (t *Tx) CommitAfterNext() { t.commitNext = true }

// CommitAfterNext is Tx.CommitAfterNext for a transaction that may or may
// not be pipelined (a test's transaction, a savepoint); for any other
// transaction it does nothing and the commit costs its own round trip.
func CommitAfterNext(tx pgx.Tx) {
	switch t := tx.(type) {
	case *Tx:
		t.CommitAfterNext()
	case *savepoint:
		// A savepoint is released, never committed, by its own owner.
	}
}

// send starts one round trip: the queued statements, then q, then COMMIT
// if asked. It reads the queued statements' results and returns the batch
// positioned at q's result, and whether COMMIT follows it.
func (t *Tx) send(ctx context.Context, q queued) (pgx.BatchResults, bool, error) {
	if t.done {
		return nil, false, pgx.ErrTxClosed
	}
	if t.conn.Conn().PgConn().TxStatus() == 'E' {
		// An aborted transaction refuses to prepare statements, and a batch
		// prepares the ones it has not seen before; the queue (which holds
		// the ROLLBACK TO that ends the abort) goes ahead on its own, in
		// the simple protocol. Only a failure path pays this round trip.
		pending := t.pending
		t.pending = nil
		for _, p := range pending {
			if _, err := t.conn.Exec(ctx, p.sql, p.args...); err != nil {
				return nil, false, err
			}
		}
	}
	b := &pgx.Batch{}
	for _, p := range t.pending {
		b.Queue(p.sql, p.args...)
	}
	b.Queue(q.sql, q.args...)
	commit := t.commitNext
	if commit {
		b.Queue("COMMIT")
	}
	pending, ahead := t.pending, t.ahead
	beginning := !t.begun
	t.pending, t.commitNext, t.begun, t.ahead = nil, false, true, 0
	if commit {
		// A COMMIT is never cancelled (primary.go): the round trip that
		// carries one waits for the server's answer. Its statements wait
		// too; the transactions that send COMMIT behind a statement (the
		// idempotency paths') bound their lock waits with lock_timeout.
		ctx = commitContext(ctx)
	}
	if ahead > 0 {
		if err := t.prepare(ctx, b); err != nil {
			return nil, false, err
		}
	}
	br := t.conn.SendBatch(ctx, b)
	for i, p := range pending {
		var err error
		if p.read != nil {
			err = p.read(batchResult{br})
		} else {
			_, err = br.Exec()
		}
		if err == nil {
			continue
		}
		if beginning && i == ahead {
			err = notPrimary(err) // BEGIN READ WRITE, refused by a standby
		}
		closeErr := br.Close()
		switch {
		case beginning && i < ahead:
			// A statement ahead of BEGIN failed: the server skipped the
			// rest of the round trip, BEGIN and any COMMIT included, and
			// rolled back what ran ahead of it when the round trip ended.
			// The transaction never began; nothing of it can commit.
			t.abandon()
		case commit:
			t.finish(errors.Join(err, closeErr))
		}
		return nil, false, err
	}
	return br, commit, nil
}

// Ahead queues stmt to run ahead of the transaction's BEGIN, in its first
// round trip: it travels with BEGIN and the first statement whose result
// the caller reads, and the transaction costs no round trip more for it.
// stmt reads its result when the round trip is back, before the carrying
// statement's result is looked at. An error from a statement ahead of
// BEGIN (one made to fail, such as idem_key_absent, or any failure) makes
// the server skip everything behind it in the round trip, BEGIN and the
// carrying statement included, and roll back what ran ahead of it: the
// carrying statement returns that error, the transaction never began, and
// every later statement, Commit and Rollback find it closed. This is what
// lets the idempotency key's lookup decide, in the round trip that
// already carries the request's first statement, that the request must not
// run (idem.Store.Execute). When no statement ahead fails, the server
// makes them part of the transaction BEGIN opens.
//
// stmt runs exactly one statement on the DBTX it is given (a sqlc query
// does) and has no other effect: it is called once when queued, on a DBTX
// that only records the statement and fails it, and once on the result.
// It can only be queued before the transaction's first round trip.
func (t *Tx) Ahead(stmt func(q DBTX) error) error {
	if t.begun || t.done {
		return errors.New("db: a statement can go ahead of BEGIN only before the transaction's first round trip")
	}
	var c capture
	_ = stmt(&c) // learns the statement; its result is read later
	if c.statements != 1 {
		return fmt.Errorf("db: a statement ahead of BEGIN must run exactly one statement, not %d", c.statements)
	}
	t.pending = slices.Insert(t.pending, t.ahead, queued{sql: c.sql, args: c.args, read: stmt})
	t.ahead++
	return nil
}

// prepare prepares the statements of a round trip that carries statements
// ahead of BEGIN, by name, on the transaction's connection. Such a round
// trip fails by design (idem_key_absent, on every replay), and pgx drops
// every statement of a batch that failed from its statement cache, to be
// deallocated and prepared again on their next use: every replay would
// cost the next request on its connection two round trips more. Statements
// prepared by name live outside that cache, and pgx runs a statement
// prepared under its own text as such. Preparing costs a round trip once
// per statement and connection, and a map lookup after that. (It runs
// untraced: a span per lookup would say nothing.) Only in pgx's
// cache_statement mode, the one that prepares statements on the server:
// behind PgBouncer's transaction pooling (default_query_exec_mode=exec,
// docs/deployment.md) a statement prepared on one server connection is
// not there on the next, and in the modes without server-side statements
// there is no statement cache for a failure to empty.
func (t *Tx) prepare(ctx context.Context, b *pgx.Batch) error {
	if !preparesOnServer(t.conn.Conn()) {
		return nil
	}
	ctx = trace.ContextWithSpan(ctx, trace.SpanFromContext(context.Background()))
	for _, q := range b.QueuedQueries {
		if _, err := t.conn.Conn().Prepare(ctx, q.SQL, q.SQL); err != nil {
			return err
		}
	}
	return nil
}

// preparesOnServer reports whether conn runs in pgx's cache_statement mode,
// read from its configuration once per connection.
func preparesOnServer(conn *pgx.Conn) bool {
	const key = "db.preparesOnServer"
	data := conn.PgConn().CustomData()
	if v, ok := data[key].(bool); ok {
		return v
	}
	v := conn.Config().DefaultQueryExecMode == pgx.QueryExecModeCacheStatement
	data[key] = v
	return v
}

// Ahead is Tx.Ahead for a transaction that may or may not be pipelined;
// on any other transaction stmt runs at once, inside it, where an error
// from it aborts the transaction as well.
func Ahead(tx pgx.Tx, stmt func(q DBTX) error) error {
	if t, ok := tx.(*Tx); ok {
		return t.Ahead(stmt)
	}
	return stmt(tx)
}

// errAheadQueued is what a statement queued by Ahead sees when it is
// first called, to learn its statement: it runs later.
var errAheadQueued = errors.New("db: statement queued ahead of BEGIN; its result is read later")

// capture is the DBTX Ahead learns a statement on.
type capture struct {
	sql        string
	args       []any
	statements int
}

func (c *capture) record(sql string, args []any) {
	c.sql, c.args = sql, args
	c.statements++
}

func (c *capture) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.record(sql, args)
	return pgconn.CommandTag{}, errAheadQueued
}

func (c *capture) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.record(sql, args)
	return nil, errAheadQueued
}

func (c *capture) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	c.record(sql, args)
	return errRow{errAheadQueued}
}

// batchResult is the DBTX a statement queued by Ahead reads its result
// from: the next result of the round trip, whatever statement is asked.
type batchResult struct{ br pgx.BatchResults }

func (b batchResult) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return b.br.Exec()
}

func (b batchResult) Query(context.Context, string, ...any) (pgx.Rows, error) { return b.br.Query() }

func (b batchResult) QueryRow(context.Context, string, ...any) pgx.Row { return b.br.QueryRow() }

// end reads COMMIT's result, if it was sent, and closes the batch.
func (t *Tx) end(br pgx.BatchResults, commit bool, stmtErr error) error {
	var commitErr error
	if commit {
		tag, err := br.Exec()
		switch {
		case err != nil:
			commitErr = err
		case stmtErr != nil || tag.String() == "ROLLBACK":
			// PostgreSQL answers COMMIT in an aborted transaction with
			// ROLLBACK, not an error.
			commitErr = pgx.ErrTxCommitRollback
		}
	}
	closeErr := br.Close()
	if commit {
		if commitErr == nil {
			commitErr = closeErr
		}
		t.finish(commitErr)
	}
	if stmtErr != nil {
		return stmtErr
	}
	if closeErr != nil && !commit {
		return closeErr
	}
	return nil
}

// finish records how the transaction ended and returns the connection.
// When a statement failed ahead of the COMMIT that travelled behind it,
// the server skipped that COMMIT (a pipeline stops at its first error), so
// the transaction is still open, aborted: it is rolled back here, one more
// round trip on that failure path only, and the connection goes back idle.
func (t *Tx) finish(commitErr error) {
	t.done, t.committed, t.commitErr = true, true, commitErr
	if pc := t.conn.Conn().PgConn(); !pc.IsClosed() && pc.TxStatus() != 'I' {
		ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
		_, err := t.conn.Exec(ctx, "ROLLBACK")
		cancel()
		if err != nil {
			// The connection's state is unknown: close it rather than let
			// the pool hand out a connection in a transaction.
			_ = t.conn.Conn().Close(context.Background())
		}
	}
	t.release()
}

// abandon ends a transaction that never began: a statement ahead of its
// BEGIN failed, so the server skipped BEGIN and ended the round trip idle.
func (t *Tx) abandon() {
	t.done, t.pending = true, nil
	if pc := t.conn.Conn().PgConn(); !pc.IsClosed() && pc.TxStatus() != 'I' {
		// Not what the server does; should it ever differ, the connection
		// must not go back to the pool in a transaction.
		_ = t.conn.Conn().Close(context.Background())
	}
	t.release()
}

// rollbackTimeout bounds the ROLLBACK of a transaction whose COMMIT the
// server skipped; past it the connection is closed instead.
const rollbackTimeout = 5 * time.Second

// flush sends the queued statements alone, when something must reach the
// server before an operation that cannot carry them.
func (t *Tx) flush(ctx context.Context) error {
	if len(t.pending) == 0 {
		return nil
	}
	last := t.pending[len(t.pending)-1]
	t.pending = t.pending[:len(t.pending)-1]
	_, err := t.Exec(ctx, last.sql, last.args...)
	return err
}

// Exec runs sql, with whatever is queued, in one round trip.
func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	br, commit, err := t.send(ctx, queued{sql: sql, args: args})
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	return tag, t.end(br, commit, err)
}

// QueryRow runs sql, with whatever is queued, when the row is scanned.
func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return &pipedRow{t: t, ctx: ctx, q: queued{sql: sql, args: args}}
}

type pipedRow struct {
	t   *Tx
	ctx context.Context
	q   queued
}

func (r *pipedRow) Scan(dest ...any) error {
	br, commit, err := r.t.send(r.ctx, r.q)
	if err != nil {
		return err
	}
	err = br.QueryRow().Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		// No row is an answer, not a failure: a COMMIT behind it commits.
		if endErr := r.t.end(br, commit, nil); endErr != nil {
			return endErr
		}
		return err
	}
	return r.t.end(br, commit, err)
}

// Query runs sql, with whatever is queued, in one round trip; the rows must
// be closed before the next statement.
func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	br, commit, err := t.send(ctx, queued{sql: sql, args: args})
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, t.end(br, commit, err)
	}
	return &pipedRows{Rows: rows, t: t, br: br, commit: commit}, nil
}

type pipedRows struct {
	pgx.Rows
	t      *Tx
	br     pgx.BatchResults
	commit bool
	closed bool
	err    error
}

func (r *pipedRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.err = r.t.end(r.br, r.commit, r.Rows.Err())
}

func (r *pipedRows) Err() error {
	if r.closed {
		return r.err
	}
	return r.Rows.Err()
}

// SendBatch sends what is queued first, then b. Batches are not pipelined
// with the queue; nothing on a hot path uses them.
func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.flush(ctx); err != nil {
		return errBatch{err}
	}
	return t.conn.SendBatch(ctx, b)
}

type errBatch struct{ err error }

func (e errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, e.err }
func (e errBatch) Query() (pgx.Rows, error)         { return nil, e.err }
func (e errBatch) QueryRow() pgx.Row                { return errRow(e) }
func (e errBatch) Close() error                     { return e.err }
func (e errBatch) Tx() pgx.Tx                       { return nil }

type errRow struct{ err error }

func (e errRow) Scan(...any) error { return e.err }

// CopyFrom sends what is queued, then copies.
func (t *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.flush(ctx); err != nil {
		return 0, err
	}
	return t.conn.CopyFrom(ctx, table, columns, src)
}

// Prepare prepares on the transaction's connection.
func (t *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.conn.Conn().Prepare(ctx, name, sql)
}

// LargeObjects is not supported on a pipelined transaction.
func (t *Tx) LargeObjects() pgx.LargeObjects { panic("db.Tx: large objects are not supported") }

// Conn returns the transaction's connection.
func (t *Tx) Conn() *pgx.Conn { return t.conn.Conn() }

// Begin opens a savepoint, queued like the statements that need no answer.
func (t *Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.done {
		return nil, pgx.ErrTxClosed
	}
	t.savepoints++
	name := fmt.Sprintf("sp_%d", t.savepoints)
	t.Queue("SAVEPOINT " + name)
	return &savepoint{Tx: t, name: name}, nil
}

// Commit commits, or reports the outcome of the COMMIT that CommitAfterNext
// sent. What is still queued travels with the COMMIT.
func (t *Tx) Commit(ctx context.Context) error {
	if t.done {
		if t.committed {
			return t.commitErr
		}
		return pgx.ErrTxClosed
	}
	if !t.begun {
		// Nothing reached the server: there is nothing to commit.
		t.finish(nil)
		return nil
	}
	t.commitNext = false
	br, _, err := t.send(commitContext(ctx), queued{sql: "COMMIT"})
	if err != nil {
		t.finish(err)
		return err
	}
	tag, err := br.Exec()
	closeErr := br.Close()
	if err == nil && tag.String() == "ROLLBACK" {
		err = pgx.ErrTxCommitRollback
	}
	if err == nil {
		err = closeErr
	}
	t.finish(err)
	return err
}

// Rollback ends the transaction without its work. After Commit it does
// nothing and returns pgx.ErrTxClosed, so it can always be deferred. A
// transaction that never reached the server needs no statement.
func (t *Tx) Rollback(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	t.done, t.pending = true, nil
	defer t.release()
	if !t.begun {
		return nil
	}
	if _, err := t.conn.Exec(ctx, "ROLLBACK"); err != nil {
		// The connection's state is unknown: close it rather than let the
		// pool hand out a connection in a transaction.
		_ = t.conn.Conn().Close(ctx)
		return err
	}
	return nil
}

// DBTX is what runs statements: a pool, a connection, a transaction, or
// the Statements of one. sqlc's dbsqlc.DBTX has the same methods.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Statements is a transaction's statements without the transaction: Exec,
// Query and QueryRow, and nothing that ends it, opens a savepoint in it or
// reaches its connection. Code handed Statements can write inside the
// transaction, and only there: its owner alone decides whether any of it
// commits. The transaction cannot be had back from it, not even by a type
// assertion.
type Statements struct{ tx pgx.Tx }

// StatementsOf returns tx's Statements.
func StatementsOf(tx pgx.Tx) Statements { return Statements{tx} }

func (s Statements) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return s.tx.Exec(ctx, sql, args...)
}

func (s Statements) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return s.tx.Query(ctx, sql, args...)
}

func (s Statements) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return s.tx.QueryRow(ctx, sql, args...)
}

// Deferred returns a DBTX for statements whose result nothing reads (the
// transaction's SET LOCAL settings, an outbox row): on a Tx, or the
// Statements of one, Exec queues them to travel with the next statement;
// on anything else it runs them at once.
func Deferred(tx DBTX) Deferrer {
	if s, ok := tx.(Statements); ok {
		tx = s.tx
	}
	return Deferrer{tx}
}

// Deferrer is what Deferred returns. Only Exec may be deferred: a statement
// whose rows are read cannot wait.
type Deferrer struct{ tx DBTX }

func (d Deferrer) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	switch t := d.tx.(type) {
	case *Tx:
		t.Queue(sql, args...)
		return pgconn.CommandTag{}, nil
	case *savepoint:
		t.Queue(sql, args...)
		return pgconn.CommandTag{}, nil
	}
	return d.tx.Exec(ctx, sql, args...)
}

func (d Deferrer) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return nil, errors.New("db: a deferred statement cannot return rows")
}

func (d Deferrer) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return errRow{errors.New("db: a deferred statement cannot return rows")}
}

// savepoint is a pseudo-nested transaction inside a Tx: its SAVEPOINT,
// RELEASE and ROLLBACK TO are queued like any statement nothing waits on.
type savepoint struct {
	*Tx
	name   string
	closed bool
}

func (s *savepoint) Commit(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	s.Queue("RELEASE SAVEPOINT " + s.name)
	return nil
}

func (s *savepoint) Rollback(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	s.Queue("ROLLBACK TO SAVEPOINT " + s.name)
	return nil
}
