package idem

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/failpoint"
)

var (
	// ErrKeyInUse: another request holds the key and has not finished
	// (L5): its claim is committed in progress, or this request's claim
	// waited on another transaction's uncommitted claim of the key past
	// Config.LockTimeout. The client should retry later with the same key.
	ErrKeyInUse = errors.New("a request with this Idempotency-Key is still in progress")
	// ErrConflictingWrite: the request's own work (exec) waited past
	// Config.LockTimeout on a row another transaction is writing and has
	// not committed, most often another key's request for the same natural
	// key (an order's reference). The key itself is free and nothing was
	// recorded: the client should retry later with the same key, and the
	// retry runs (or meets the backstop once the other request committed).
	ErrConflictingWrite = errors.New("another request is writing what this request must write")
	// ErrKeyReused: the key was used before for a different request (L5).
	ErrKeyReused = errors.New("this Idempotency-Key was already used for a different request")
	// ErrResultExpired matches *ResultExpiredError.
	ErrResultExpired = errors.New("the result of this Idempotency-Key has expired")
	// ErrUnavailable wraps transient failures (key store unreachable,
	// serialization failure, deadlock, timeout, a connection lost). Nothing
	// is recorded for the failure itself, so a retry with the same key runs
	// the request again (L6, O2), with one exception the retry resolves
	// on its own: a connection lost during COMMIT (D2), after which the
	// transaction may have committed, record included. The retry then
	// replays that record; had it not committed, the retry runs it.
	ErrUnavailable = errors.New("temporarily unavailable")
)

// ResultExpiredError: the key was used for this same request, but its
// result is past the TTL and no longer replayed. The request is not
// run again either: the client learns what it created, if anything.
type ResultExpiredError struct {
	// Status is the status the request was answered with.
	Status int
	// Location is the resource it created ("" if none).
	Location string
	// ExpiredAt is when the result expired; RetainedUntil when the key
	// will be forgotten.
	ExpiredAt, RetainedUntil time.Time
}

func (e *ResultExpiredError) Error() string { return ErrResultExpired.Error() }

// Is makes errors.Is(err, ErrResultExpired) hold.
func (e *ResultExpiredError) Is(target error) bool { return target == ErrResultExpired }

// Defaults for Config.
const (
	DefaultLockTimeout  = 2 * time.Second
	DefaultTTL          = 24 * time.Hour
	DefaultKeyRetention = 72 * time.Hour
	DefaultLease        = 60 * time.Second
)

// Config tunes a Store.
type Config struct {
	// LockTimeout bounds how long a duplicate waits on another
	// transaction's uncommitted claim before it gets ErrKeyInUse.
	LockTimeout time.Duration
	// TTL is how long a record's exact response is kept and replayed (E1).
	// It must exceed the longest time a client keeps retrying one
	// operation.
	TTL time.Duration
	// KeyRetention is how long the key itself is remembered (E3): after the
	// TTL, until KeyRetention from its creation, a retry finds a tombstone
	// and gets ErrResultExpired, never a second execution. Past it the key
	// is unknown and a request with it runs afresh. At least TTL.
	KeyRetention time.Duration
	// Lease is how long a multi-step attempt owns its key (S3) before
	// another attempt with the same request, or the completer, may take
	// over. It must stay well above the p99 latency of one step, the
	// processor call included.
	Lease time.Duration
	// KeyBudget is how many live keys one tenant may hold (R6; see
	// budget.go); zero means DefaultKeyBudget, negative turns it off.
	KeyBudget int64
}

// ErrRetentionShorterThanTTL: Config.KeyRetention is shorter than TTL.
// A key's tombstone must outlive the result it replaces (E3), or a retry
// between the two would find no key and run again; the schema checks
// retain_until >= expires_at too.
var ErrRetentionShorterThanTTL = errors.New("a key must be remembered (KeyRetention) at least as long as its result is replayed (TTL)")

// Check reports the first rule c breaks, before NewStore quietly raises
// what it can: a configuration read from the environment should be
// refused with the reason, not adjusted.
func (c Config) Check() error {
	if c.KeyRetention > 0 && c.KeyRetention < c.TTL {
		return ErrRetentionShorterThanTTL
	}
	return nil
}

// Store runs requests under idempotency keys kept in PostgreSQL.
type Store struct {
	pool   *pgxpool.Pool
	cfg    Config
	budget *keyBudget // nil: no budget
}

// NewStore returns a Store over pool; zero Config fields take the defaults.
func NewStore(pool *pgxpool.Pool, cfg Config) *Store {
	if cfg.LockTimeout <= 0 {
		cfg.LockTimeout = DefaultLockTimeout
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.KeyRetention <= 0 {
		cfg.KeyRetention = max(DefaultKeyRetention, cfg.TTL)
	}
	cfg.KeyRetention = max(cfg.KeyRetention, cfg.TTL)
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.KeyBudget == 0 {
		cfg.KeyBudget = DefaultKeyBudget
	}
	st := &Store{pool: pool, cfg: cfg}
	if cfg.KeyBudget > 0 {
		st.budget = newKeyBudget(pool, cfg.KeyBudget)
	}
	return st
}

// Claim identifies one idempotent request.
type Claim struct {
	TenantID uuid.UUID
	// Endpoint is the method and route template, e.g. "POST /v1/orders".
	Endpoint string
	Key      string
	// Fingerprint is Fingerprint's hash of the canonical request.
	Fingerprint []byte
}

// Response is an HTTP response as recorded and replayed: the exact status,
// the headers that matter and the exact body bytes.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// ExpiresHeader tells, on every response recorded under a key and on its
// replays, when the replay ends (E4): the key's expires_at as an HTTP-date.
// The recording statement stamps it from the row, so the first answer and
// every replay carry the same instant.
const ExpiresHeader = "Idempotency-Expires"

// RecordedHeaders are the response headers stored with the record and
// replayed. Per-request headers (X-Request-Id, Date) are not: they describe
// the retry, not the original outcome.
var RecordedHeaders = []string{"Content-Type", "Location", "Cache-Control"}

// UndoableTx is all that Execute's work gets of the transaction it runs
// in: statements (dbsqlc.New takes it, so do orders.Create and
// outbox.Write), never the transaction itself. It has no Commit, Rollback
// or Begin and no connection, and the value behind it is not a pgx.Tx, so
// the work cannot end the transaction or step outside it.
//
// Everything done through it may be undone: Execute rolls it back when
// the work fails, when the response is a deterministic failure (the
// failure is then recorded alone), and when a duplicate of the request recorded the key first.
// A duplicate that arrives while the request runs executes the same work
// concurrently, and all but one of them roll back. So the work's effects
// must be statements through this handle and nothing else: an e-mail, a
// message published, an HTTP call or a write through the pool would happen
// once per attempt, rolled back or not. Announce a change with
// outbox.Write(ctx, tx, ...) instead: the event commits with the change or
// not at all. Calls to other services take the multi-step path (lease.go).
type UndoableTx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// UndoableWork is the work Execute runs under a key: it runs inside the
// key's transaction, through tx only, and returns the response to record.
// It may run more than once for one key, and every run but the one that
// commits is rolled back (see UndoableTx).
type UndoableWork func(ctx context.Context, tx UndoableTx) (Response, error)

// Execute is the one-transaction idempotency path, for side effects
// that live in our own database. It replays the response recorded under
// the key (replayed = true) without running exec; or it runs exec in a new
// transaction and records exec's response under the key as that
// transaction's last statement, so that both commit or neither does; or,
// when a duplicate recorded the key first, it rolls exec's work back and
// replays the duplicate's response. exec returns the response to record;
// one with status >= 400 is recorded apart, its work rolled back. An
// error from exec records nothing.
//
// Errors: ErrKeyReused (the key was used for another request), ErrKeyInUse
// (its request is unfinished, or a duplicate held the key past
// Config.LockTimeout), ErrConflictingWrite (exec waited past it on a row
// another transaction is writing), ErrUnavailable wrapping a transient
// failure; other errors from exec as they are.
//
// The package documentation tells the rule: the four steps in order, why
// the claim comes last, the round trips, how long the key has no
// row (CommitWindow), and what exec may and may not do (UndoableTx).
func (s *Store) Execute(ctx context.Context, c Claim, exec UndoableWork) (res Response, replayed bool, err error) {
	caller := trace.SpanFromContext(ctx)
	ctx, span := startSpan(ctx, spanExecute)
	defer span.End()
	var createdAt time.Time
	// Counted once, when the outcome is decided: after the commit or the
	// rollback; traced on this span and the caller's.
	defer func() {
		traceOutcome(caller, span, c, countOutcome(c.Endpoint, err, replayed, false, createdAt), replayed)
	}()
	if err := s.admit(ctx, c); err != nil {
		return Response{}, false, s.wrap(err)
	}

	// One connection for the whole request: the transactions and the read
	// after a lost race. A duplicate storm would otherwise queue for the
	// pool at each of them, behind every other duplicate.
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return Response{}, false, s.wrap(err)
	}
	defer conn.Release()
	q := dbsqlc.New(conn)

	for attempt := 1; ; attempt++ {
		var look lookup
		res, err = s.execute(ctx, conn, c, exec, &look)
		if look.row == nil {
			break
		}
		// 1. Replay, looked up first. Nothing of exec's ran: the key's
		// row stopped the round trip ahead of BEGIN, or, had a statement
		// ignored that, the transaction rolled back.
		if !look.row.Forgotten {
			res, createdAt, err = replay(*look.row, c)
			return res, err == nil, s.wrap(err)
		}
		// Past its retention the key is unknown (E3): the claim is a plain
		// INSERT, so the old row goes first, as the reaper would take it,
		// and the request runs afresh. A row forgotten again at once was
		// claimed over by another request that has since finished and
		// aged out: not for this request to wait on.
		if attempt > 1 {
			return Response{}, false, ErrKeyInUse
		}
		if err := q.IdemKeyForget(ctx, dbsqlc.IdemKeyForgetParams{TenantID: c.TenantID, Endpoint: c.Endpoint, IdemKey: c.Key}); err != nil {
			return Response{}, false, s.wrap(err)
		}
	}
	switch {
	case db.IsUniqueViolation(err, keyPrimaryKey), keyHadRow(err):
		// 4. Replay, after a lost race: everything this request wrote has
		// rolled back. Under READ COMMITTED this new read sees the row the
		// winner committed. (IdemKeyAbsent fails the same way when the
		// key's row was committed between the lookup and it.)
		res, createdAt, err = existing(ctx, q, c)
		return res, err == nil, s.wrap(err)
	case errors.Is(err, ErrConflictingWrite):
		return Response{}, false, ErrConflictingWrite
	case db.IsLockTimeout(err):
		// The claim waited on a duplicate's uncommitted key row.
		return Response{}, false, ErrKeyInUse
	case err != nil:
		return Response{}, false, s.wrap(err)
	}
	s.claimed(c)
	// The work is committed. A crash from here until the response is
	// written is the window test T1 covers: the client's retry replays the
	// stored response.
	failpoint.Inject("idem-after-commit")
	return res, false, nil
}

// execute runs steps 1 to 3 on conn: exec in a transaction with the
// lookup ahead of it, then the record; a deterministic failure is recorded
// in a transaction of its own. When the lookup found the key's row, look
// holds it and nothing committed.
func (s *Store) execute(ctx context.Context, conn *pgxpool.Conn, c Claim, exec UndoableWork, look *lookup) (res Response, err error) {
	defer look.end()
	var failed *deterministicFailure
	err = db.WithPipelinedTxOn(ctx, conn, func(ctx context.Context, tx pgx.Tx) error {
		if err := look.queue(ctx, tx, c); err != nil {
			return err
		}
		if err := s.boundLockWaits(ctx, tx); err != nil {
			return err
		}

		// 2. Execute, in the transaction itself, with its statements only.
		// No savepoint: the path that commits does not pay for one (P7). A
		// deterministic failure rolls the whole transaction back instead
		// (which also clears a statement that aborted it), and is
		// recorded in a transaction of its own (below).
		runCtx, run := startSpan(ctx, spanRun)
		res, err = exec(runCtx, db.StatementsOf(tx))
		run.End()
		switch {
		case look.row != nil:
			return errKeyHasRow // step 1 found the key: nothing of exec's may commit
		case db.IsLockTimeout(err):
			// A wait on a business row, not on the key: the claim comes
			// after exec.
			return ErrConflictingWrite
		case err != nil:
			return err
		case res.Status >= 400:
			failed = &deterministicFailure{res: res}
			return failed
		}
		return s.record(ctx, tx, c, &res)
	})
	if !errors.As(err, &failed) {
		if err != nil && !look.answered {
			// exec failed before its first statement, so the lookup never
			// went out. A key that has a row is still replayed (step 1):
			// this run was not the request's to make.
			_ = look.read(ctx, dbsqlc.New(conn), c)
		}
		return res, err
	}
	// The failure's work is rolled back: nothing of it survives, so
	// recording it alone commits nothing the success path would not. A
	// duplicate that recorded the key meanwhile wins as at step 4. When
	// exec failed before its first statement, the lookup never went out:
	// it goes ahead of this transaction instead, so a key that has a row
	// is replayed, and one past its retention forgotten, as in step 1.
	res = failed.res
	err = db.WithPipelinedTxOn(ctx, conn, func(ctx context.Context, tx pgx.Tx) error {
		if !look.answered {
			if err := look.queue(ctx, tx, c); err != nil {
				return err
			}
		}
		if err := s.boundLockWaits(ctx, tx); err != nil {
			return err
		}
		return s.record(ctx, tx, c, &res)
	})
	return res, err
}

// errKeyHasRow ends a transaction whose lookup found the key's row.
var errKeyHasRow = errors.New("idem: the key has a row; nothing of the request may commit")

// codeKeyHasRow is IdemKeyAbsent's SQLSTATE (migration 000019).
const codeKeyHasRow = "IK001"

// keyHadRow reports IdemKeyAbsent's failure.
func keyHadRow(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == codeKeyHasRow
}

// lookup is step 1, queued ahead of a transaction's BEGIN (db.Ahead): the
// key's row, if it has one, and the statement that then stops the round
// trip.
type lookup struct {
	answered bool
	row      *dbsqlc.IdemKeyGetRow // nil: the key has no row
	span     trace.Span
}

func (l *lookup) queue(ctx context.Context, tx pgx.Tx, c Claim) error {
	if l.span == nil {
		ctx, l.span = startSpan(ctx, spanLookup)
	}
	if err := db.Ahead(tx, func(q db.DBTX) error { return l.read(ctx, dbsqlc.New(q), c) }); err != nil {
		return err
	}
	return db.Ahead(tx, func(q db.DBTX) error {
		err := dbsqlc.New(q).IdemKeyAbsent(ctx, dbsqlc.IdemKeyAbsentParams{TenantID: c.TenantID, Endpoint: c.Endpoint, IdemKey: c.Key})
		if l.answered {
			l.span.End() // the lookup's round trip is back
		}
		return err
	})
}

// read reads the key's row: ahead of a transaction's BEGIN, or on its
// own for a transaction that never sent it.
func (l *lookup) read(ctx context.Context, q *dbsqlc.Queries, c Claim) error {
	row, err := q.IdemKeyGet(ctx, dbsqlc.IdemKeyGetParams{TenantID: c.TenantID, Endpoint: c.Endpoint, IdemKey: c.Key})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		l.answered = true
		return nil
	case err != nil:
		return err
	}
	l.answered, l.row = true, &row
	return nil
}

// end ends the lookup's span when its round trip never went out.
func (l *lookup) end() {
	if l.span != nil {
		l.span.End()
	}
}

// deterministicFailure carries a response with status >= 400 out of the
// transaction that produced it, rolling that transaction back.
type deterministicFailure struct{ res Response }

func (*deterministicFailure) Error() string {
	return "idem: a deterministic failure, rolled back to be recorded alone"
}

// record is step 3: the claim and the record in one statement, the key row
// inserted with the exact response, as the transaction's last
// statement. COMMIT travels with it: nothing it returns can change the
// decision to commit, and when it fails (the key is taken) nothing
// commits: the server skips the COMMIT behind a failed statement, and
// db.Tx rolls the transaction back. It stamps res with the record's expiry.
func (s *Store) record(ctx context.Context, tx pgx.Tx, c Claim, res *Response) error {
	rec, err := encodeRecord(*res)
	if err != nil {
		return err
	}
	db.CommitAfterNext(tx)
	start := time.Now()
	recordCtx, span := startSpan(ctx, spanRecord)
	expires, err := s.claimCompleted(recordCtx, dbsqlc.New(tx), c, rec)
	span.End()
	observeLockWait(c.Endpoint, start)
	if err != nil {
		return err
	}
	stampExpiry(res, expires)
	return nil
}

// keyPrimaryKey is the constraint a claim of a taken key fails on.
const keyPrimaryKey = "idempotency_keys_pkey"

// claimCompleted is the one-transaction claim and record: the key row
// inserted already completed with rec (IdemKeyClaimCompleted; L1, L3). A
// taken key fails it on keyPrimaryKey.
func (s *Store) claimCompleted(ctx context.Context, q *dbsqlc.Queries, c Claim, rec record) (expiresAt time.Time, err error) {
	expires, retain := s.horizons()
	return q.IdemKeyClaimCompleted(ctx, dbsqlc.IdemKeyClaimCompletedParams{
		TenantID:           c.TenantID,
		Endpoint:           c.Endpoint,
		IdemKey:            c.Key,
		Fingerprint:        c.Fingerprint,
		FingerprintVersion: FingerprintVersion,
		ResponseStatus:     &rec.status,
		ResponseHeaders:    rec.headers,
		ResponseBody:       rec.body,
		ResourceLocation:   rec.location,
		ExpiresAt:          expires,
		RetainUntil:        retain,
	})
}

// existing reads a key that a claim found taken: replay, 409 or 422.
// createdAt is the record's creation time, for the replay age metric.
func existing(ctx context.Context, q *dbsqlc.Queries, c Claim) (res Response, createdAt time.Time, err error) {
	ctx, span := startSpan(ctx, spanLookup)
	defer span.End()
	row, err := q.IdemKeyGet(ctx, dbsqlc.IdemKeyGetParams{TenantID: c.TenantID, Endpoint: c.Endpoint, IdemKey: c.Key})
	if errors.Is(err, pgx.ErrNoRows) {
		// The row vanished between the claim and this read: it was
		// forgotten and deleted. Rare; the retry will claim it afresh.
		return Response{}, time.Time{}, ErrKeyInUse
	}
	if err != nil {
		return Response{}, time.Time{}, err
	}
	if row.Forgotten {
		// Taken a moment ago by a row already past its retention: the
		// retry deletes it and runs.
		return Response{}, time.Time{}, ErrKeyInUse
	}
	return replay(row, c)
}

// replay answers a request from its key's row: the recorded response, or
// the error that says why there is none to give.
func replay(row dbsqlc.IdemKeyGetRow, c Claim) (Response, time.Time, error) {
	stored, err := settled(row.IdempotencyKey, row.ResultExpired, c)
	if err != nil {
		return Response{}, time.Time{}, err
	}
	if stored == nil {
		return Response{}, time.Time{}, ErrKeyInUse
	}
	return *stored, row.IdempotencyKey.CreatedAt, nil
}
