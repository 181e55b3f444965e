package idem

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/tracing"
)

// Multi-step keys (S1, S3).
//
// A request whose side effect leaves our database (a charge at a payment
// processor) cannot claim, execute and record in one transaction. It runs
// as a sequence of phases instead, each committed in its own transaction
// together with the key's recovery point:
//
//	Begin   claim the key with a lease and run the first phase (one transaction)
//	Phase   one more step, fenced by the lease generation
//	...     calls to other services happen between phases, never inside one
//	Phase   the last step records the exact response: the key is completed
//
// A retry of an unfinished request (same key, same fingerprint) finds the
// lease expired (or released after a transient failure), takes it over with
// a new generation and resumes from the recovery point. So does the
// completer, for clients that never retry.

// Recovery points shared by every multi-step endpoint. Endpoints define
// their own in between.
const (
	// RecoveryStarted is the point of a key just claimed, before its first
	// phase committed. Begin runs the first phase in the claim's
	// transaction, so no committed key is ever left at this point.
	RecoveryStarted = "started"
	// RecoveryFinished is the point of a completed key.
	RecoveryFinished = "finished"
)

// ErrLeaseLost: another attempt took the key over (a newer lease
// generation). The attempt that gets it must stop without writing anything:
// the one that took over owns the work now.
var ErrLeaseLost = errors.New("the lease on this Idempotency-Key was taken over by another attempt")

// Lease is an attempt's hold on a multi-step key.
type Lease struct {
	Claim
	// Generation is the fencing token: every phase's write checks it.
	Generation int64
	// RecoveryPoint is the last committed step.
	RecoveryPoint string
	// ResourceID is the resource the key created (a payment, a refund).
	ResourceID uuid.UUID
	// Resumed is true when this attempt took over from an earlier one,
	// which may have called other services already.
	Resumed bool
}

// Step is what a phase decides: advance to RecoveryPoint (optionally
// naming the created resource), or complete the key with Response.
type Step struct {
	RecoveryPoint string
	ResourceID    uuid.UUID
	Response      *Response
}

// DeriveKey returns the key for a call this request makes to another
// service (S2): a hash of the scoped parent key and the step name. It is
// deterministic, so a resumed attempt sends the same child key and the other
// service deduplicates; it differs per step, so two calls to one service
// never collide; and it does not reveal the client's key.
func DeriveKey(c Claim, step string) string {
	h := sha256.New()
	for _, part := range []string{"idem-derived/v1", c.TenantID.String(), c.Endpoint, c.Key, step} {
		// Length-prefixed, so no two different tuples hash the same input.
		fmt.Fprintf(h, "%d:%s", len(part), part)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// DeriveChildKey returns the key for a further call made on behalf of a
// call that already has a derived key (a refund compensating a duplicate
// charge): a hash of parent and step, as deterministic as DeriveKey, so
// every attempt at the further call sends the same key.
func DeriveChildKey(parent, step string) string {
	h := sha256.New()
	for _, part := range []string{"idem-derived-child/v1", parent, step} {
		fmt.Fprintf(h, "%d:%s", len(part), part)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Begin claims c for a multi-step request. On a new claim it runs first in
// the claim's transaction, inside a savepoint: the claim, the first phase's
// writes and its recovery point commit together. A Step with a
// Response of status >= 400 is a deterministic failure found before anything
// left the database: its writes are rolled back to the savepoint and the
// response recorded, as in Execute.
//
// When the key exists, Begin replays a completed key, returns ErrKeyReused
// for another fingerprint, ErrKeyInUse while another attempt's lease is
// live, and otherwise takes the lease over and returns it with Resumed set:
// the caller resumes from its RecoveryPoint.
func (s *Store) Begin(ctx context.Context, c Claim, first func(ctx context.Context, tx pgx.Tx, l Lease) (Step, error)) (begun Begun, err error) {
	caller := trace.SpanFromContext(ctx)
	ctx, span := startSpan(ctx, spanBegin)
	defer span.End()
	// Counted once, when the outcome is decided: after the commit or the
	// rollback; traced on this span and the caller's.
	var createdAt time.Time // a replayed record's, for the replay age metric
	defer func() {
		outcome := countOutcome(c.Endpoint, err, begun.Replayed, begun.Lease.Resumed, createdAt)
		traceOutcome(caller, span, c, outcome, begun.Replayed)
		switch {
		case err == nil && begun.Lease.Resumed:
			leaseTakeoversTotal.WithLabelValues(c.Endpoint).Inc()
		case errors.Is(err, ErrLeaseLost):
			fencingRejectionsTotal.WithLabelValues(c.Endpoint).Inc()
		}
	}()
	if err := s.admit(ctx, c); err != nil {
		return Begun{}, s.wrap(err)
	}
	var b Begun
	claimed := false
	// Pipelined, like Execute's: the lock timeout travels with the claim,
	// COMMIT with apply's statement (P2).
	err = db.WithPipelinedTx(ctx, s.pool, func(ctx context.Context, tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		if err := s.boundLockWaits(ctx, tx); err != nil {
			return err
		}
		claimCtx, claiming := startSpan(ctx, spanClaim)
		start := time.Now()
		gen, err := s.claim(claimCtx, q, c)
		observeLockWait(c.Endpoint, start)
		if errors.Is(err, pgx.ErrNoRows) {
			b, createdAt, err = s.takeOver(claimCtx, q, c)
			claiming.End()
			return err
		}
		claiming.End()
		switch {
		case db.IsLockTimeout(err):
			return ErrKeyInUse
		case err != nil:
			return err
		}
		claimed = true

		b.Lease = Lease{Claim: c, Generation: gen, RecoveryPoint: RecoveryStarted}
		var step Step
		runCtx, run := startSpan(ctx, spanRun)
		_, err = executeInSavepoint(runCtx, tx, func(ctx context.Context, sp pgx.Tx) (Response, error) {
			var err error
			if step, err = first(ctx, sp, b.Lease); err != nil || step.Response == nil {
				return Response{}, err // advancing: the savepoint is released
			}
			return *step.Response, nil
		})
		run.End()
		if err != nil {
			return err
		}
		b.Response = step.Response
		return s.apply(ctx, tx, &b.Lease, step)
	})
	if err != nil {
		return Begun{}, s.wrap(err)
	}
	if claimed {
		s.claimed(c)
	}
	return b, nil
}

// Begun is what Begin found or did.
type Begun struct {
	// Lease is held by this attempt unless Response is set.
	Lease Lease
	// Response is set when the request is answered already: a completed
	// key's recorded response (Replayed), or the first phase completed the
	// key itself.
	Response *Response
	Replayed bool
}

// claim inserts a multi-step key row (L1, S3), holding a lease of the
// configured length. pgx.ErrNoRows means the key exists already.
func (s *Store) claim(ctx context.Context, q *dbsqlc.Queries, c Claim) (generation int64, err error) {
	expires, retain := s.horizons()
	return q.IdemKeyClaim(ctx, dbsqlc.IdemKeyClaimParams{
		TenantID:           c.TenantID,
		Endpoint:           c.Endpoint,
		IdemKey:            c.Key,
		Fingerprint:        c.Fingerprint,
		FingerprintVersion: FingerprintVersion,
		ExpiresAt:          expires,
		RetainUntil:        retain,
		LeaseSeconds:       s.cfg.Lease.Seconds(),
	})
}

// takeOver handles a claim that found the key already there. createdAt is
// the key's creation time.
func (s *Store) takeOver(ctx context.Context, q *dbsqlc.Queries, c Claim) (_ Begun, createdAt time.Time, err error) {
	start := time.Now()
	locked, err := q.IdemKeyGetForUpdate(ctx, dbsqlc.IdemKeyGetForUpdateParams{TenantID: c.TenantID, Endpoint: c.Endpoint, IdemKey: c.Key})
	observeLockWait(c.Endpoint, start)
	switch {
	case db.IsLockTimeout(err):
		return Begun{}, time.Time{}, ErrKeyInUse
	case errors.Is(err, pgx.ErrNoRows):
		return Begun{}, time.Time{}, ErrKeyInUse // deleted by expiry in between; the retry claims afresh
	case err != nil:
		return Begun{}, time.Time{}, err
	}
	row := locked.IdempotencyKey
	// Never take over, or replay, another request's key (S3, L5).
	res, err := settled(row, locked.ResultExpired, c)
	if err != nil || res != nil {
		return Begun{Response: res, Replayed: res != nil}, row.CreatedAt, err
	}
	if !locked.LeaseExpired || row.RecoveryPoint == nil {
		return Begun{}, time.Time{}, ErrKeyInUse
	}
	taken, err := q.IdemKeyTakeOver(ctx, dbsqlc.IdemKeyTakeOverParams{
		TenantID: c.TenantID, Endpoint: c.Endpoint, IdemKey: c.Key,
		Generation: row.LeaseGeneration, LeaseSeconds: s.cfg.Lease.Seconds(),
	})
	if err != nil {
		return Begun{}, time.Time{}, err
	}
	return Begun{Lease: leaseFrom(c, taken.LeaseGeneration, taken.RecoveryPoint, taken.ResourceID)}, row.CreatedAt, nil
}

// Phase runs one step of a multi-step request in its own transaction. It
// first locks the key row and checks the fencing token: if another attempt
// took the lease over, it returns ErrLeaseLost and nothing of fn's runs in
// the database. Then it commits fn's writes together with the new recovery
// point (renewing the lease), or with the recorded response when the step
// completes the key; the response is then returned.
//
// The fence (IdemKeyLeaseHeld) is queued behind BEGIN and travels with fn's
// first statement, which costs no round trip of its own: a lost lease
// makes it fail, and the server then skips fn's statement. So fn's Go code
// runs up to its first statement even for a lease that turns out lost; like
// Execute's work, it must do nothing outside the transaction, and pass its
// statements' errors on.
func (s *Store) Phase(ctx context.Context, l *Lease, fn func(ctx context.Context, tx pgx.Tx) (Step, error)) (*Response, error) {
	ctx, span := startSpan(ctx, spanPhase)
	defer span.End()
	if span.IsRecording() {
		tracing.Idempotency(span, l.Endpoint, l.Key)
		span.SetAttributes(attrRecoveryPoint.String(l.RecoveryPoint))
	}
	var step Step
	// Pipelined, as in Begin.
	err := db.WithPipelinedTx(ctx, s.pool, func(ctx context.Context, tx pgx.Tx) error {
		if err := s.boundLockWaits(ctx, tx); err != nil {
			return err
		}
		if err := dbsqlc.New(db.Deferred(tx)).IdemKeyLeaseHeld(ctx, dbsqlc.IdemKeyLeaseHeldParams{
			TenantID: l.TenantID, Endpoint: l.Endpoint, IdemKey: l.Key, Generation: l.Generation,
		}); err != nil {
			return err
		}
		var err error
		if step, err = fn(ctx, tx); err != nil {
			return err
		}
		return s.apply(ctx, tx, l, step)
	})
	if leaseLost(err) {
		err = ErrLeaseLost
	}
	if err != nil {
		if errors.Is(err, ErrLeaseLost) {
			fencingRejectionsTotal.WithLabelValues(l.Endpoint).Inc()
		}
		return nil, s.wrap(err)
	}
	return step.Response, nil
}

// apply commits a phase's decision on the key row, fenced by generation.
// It is the phase's last statement, and the transaction's COMMIT travels
// with it: its fence cannot fail here, because the caller holds the row
// (Begin inserted it; Phase's IdemKeyLeaseHeld locked it FOR UPDATE under
// the generation), so its result cannot change the decision to commit. An
// error from it still aborts the transaction and the COMMIT rolls back.
func (s *Store) apply(ctx context.Context, tx pgx.Tx, l *Lease, step Step) error {
	ctx, span := startSpan(ctx, spanRecord)
	defer span.End()
	q := dbsqlc.New(tx)
	var n int64
	var err error
	db.CommitAfterNext(tx)
	from := l.RecoveryPoint
	if step.Response != nil {
		rec, rerr := encodeRecord(*step.Response)
		if rerr != nil {
			return rerr
		}
		expires, cerr := q.IdemKeyCompleteLease(ctx, dbsqlc.IdemKeyCompleteLeaseParams{
			TenantID: l.TenantID, Endpoint: l.Endpoint, IdemKey: l.Key, Generation: l.Generation, FromPoint: &from,
			ResponseStatus: &rec.status, ResponseHeaders: rec.headers, ResponseBody: rec.body, ResourceLocation: rec.location,
			TtlSeconds: s.cfg.TTL.Seconds(), RetentionSeconds: s.cfg.KeyRetention.Seconds(),
		})
		switch {
		case errors.Is(cerr, pgx.ErrNoRows):
			n = 0 // the lease was lost
		case cerr != nil:
			err = cerr
		default:
			n = 1
			stampExpiry(step.Response, expires)
		}
		step.RecoveryPoint = RecoveryFinished
	} else {
		var resource *uuid.UUID
		if step.ResourceID != uuid.Nil {
			resource = &step.ResourceID
		}
		n, err = q.IdemKeyAdvance(ctx, dbsqlc.IdemKeyAdvanceParams{
			TenantID: l.TenantID, Endpoint: l.Endpoint, IdemKey: l.Key, Generation: l.Generation, FromPoint: &from,
			RecoveryPoint: &step.RecoveryPoint, ResourceID: resource, LeaseSeconds: s.cfg.Lease.Seconds(),
		})
	}
	if err != nil {
		return err
	}
	if n != 1 {
		return ErrLeaseLost
	}
	l.RecoveryPoint = step.RecoveryPoint
	if step.ResourceID != uuid.Nil {
		l.ResourceID = step.ResourceID
	}
	return nil
}

// codeLeaseLost is IdemKeyLeaseHeld's SQLSTATE (migration 000019).
const codeLeaseLost = "IK002"

// leaseLost reports IdemKeyLeaseHeld's failure, whichever statement of the
// phase's round trip returned it.
func leaseLost(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == codeLeaseLost
}

// Release gives the key back at its recovery point after a transient
// failure (O2): neither completed nor deleted, with its lease ending after
// hold (0: now), so the client's retry (or the completer) resumes then. A
// retry that comes earlier gets ErrKeyInUse. A lease already lost is not an
// error: the attempt that took over owns the key.
func (s *Store) Release(ctx context.Context, l Lease, hold time.Duration) error {
	// The request may have failed because its context ended; releasing
	// must still happen.
	ctx = context.WithoutCancel(ctx)
	_, err := dbsqlc.New(s.pool).IdemKeyRelease(ctx, dbsqlc.IdemKeyReleaseParams{
		TenantID: l.TenantID, Endpoint: l.Endpoint, IdemKey: l.Key, Generation: l.Generation,
		HoldSeconds: max(hold, 0).Seconds(),
	})
	return err
}

// TakeOverExpired is the completer's claim: it takes over up to max keys of
// the given endpoints whose lease expired before they finished. Rows that
// another completer is taking over right now are skipped (SKIP LOCKED), so
// any number of processes can run completers.
func (s *Store) TakeOverExpired(ctx context.Context, endpoints []string, max int) ([]Lease, error) {
	var leases []Lease
	// A plain transaction: the completer runs off any request's path, and
	// every statement here is read before the next.
	err := db.WithTx(ctx, s.pool, func(ctx context.Context, tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		rows, err := q.IdemKeyListExpiredLeases(ctx, dbsqlc.IdemKeyListExpiredLeasesParams{Endpoints: endpoints, MaxRows: db.Int32(max)})
		if err != nil {
			return err
		}
		for _, row := range rows {
			c := Claim{TenantID: row.TenantID, Endpoint: row.Endpoint, Key: row.IdemKey}
			taken, err := q.IdemKeyTakeOver(ctx, dbsqlc.IdemKeyTakeOverParams{
				TenantID: c.TenantID, Endpoint: c.Endpoint, IdemKey: c.Key,
				Generation: row.LeaseGeneration, LeaseSeconds: s.cfg.Lease.Seconds(),
			})
			if err != nil {
				return err
			}
			leases = append(leases, leaseFrom(c, taken.LeaseGeneration, taken.RecoveryPoint, taken.ResourceID))
		}
		return nil
	})
	if err != nil {
		return nil, s.wrap(err)
	}
	// Counted once the takeovers are committed.
	for _, l := range leases {
		leaseTakeoversTotal.WithLabelValues(l.Endpoint).Inc()
	}
	return leases, nil
}

func leaseFrom(c Claim, gen int64, point *string, resource *uuid.UUID) Lease {
	l := Lease{Claim: c, Generation: gen, Resumed: true}
	if point != nil {
		l.RecoveryPoint = *point
	}
	if resource != nil {
		l.ResourceID = *resource
	}
	return l
}
