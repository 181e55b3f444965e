//go:build loadtest

package idem

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/failpoint"
)

// RecoveryStarted is where IdemKeyClaim leaves a fresh key.
const recoveryStarted = "started"

// ExecuteClaimFirst is the load benchmark's claim-first peer (P8), compiled
// into -tags loadtest builds only: the classic shape of a Postgres
// idempotency key (brandur/rocket-rides-atomic's, and Stripe's published
// one), in one transaction:
//
//  1. claim: INSERT the key row in progress, with a lease
//     (IdemKeyClaim, ON CONFLICT DO NOTHING); a duplicate waits here on
//     the first one's uncommitted row, bounded by the lock timeout, and a
//     key that exists is read and replayed (or 409, 422) as in Execute;
//  2. execute the work in a savepoint;
//  3. UPDATE the key row to completed with the response
//     (IdemKeyCompleteLease), and COMMIT.
//
// Same key table, same fingerprint, same work and the same round trips'
// transport (db.WithPipelinedTxOn) as Execute: what differs is the shape,
// a key row written twice (an insert, then a non-HOT update through the
// state trigger) where Execute writes it once, last. It is the shape
// Execute had before claim-at-end; the benchmark runs it beside Execute
// over HTTP. The key budget is not checked (nothing else is left out).
func (s *Store) ExecuteClaimFirst(ctx context.Context, c Claim, exec UndoableWork) (res Response, replayed bool, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return Response{}, false, s.wrap(err)
	}
	defer conn.Release()
	var taken bool
	err = db.WithPipelinedTxOn(ctx, conn, func(ctx context.Context, tx pgx.Tx) error {
		if err := s.boundLockWaits(ctx, tx); err != nil {
			return err
		}
		q := dbsqlc.New(tx)
		generation, err := s.claim(ctx, q, c)
		if errors.Is(err, pgx.ErrNoRows) {
			taken = true
			return nil
		}
		if err != nil {
			return err
		}
		res, err = executeInSavepoint(ctx, tx, func(ctx context.Context, sp pgx.Tx) (Response, error) {
			return exec(ctx, db.StatementsOf(sp))
		})
		if db.IsLockTimeout(err) {
			return ErrConflictingWrite
		}
		if err != nil {
			return err
		}
		rec, err := encodeRecord(res)
		if err != nil {
			return err
		}
		from := recoveryStarted
		db.CommitAfterNext(tx)
		expires, err := q.IdemKeyCompleteLease(ctx, dbsqlc.IdemKeyCompleteLeaseParams{
			TenantID: c.TenantID, Endpoint: c.Endpoint, IdemKey: c.Key, Generation: generation, FromPoint: &from,
			ResponseStatus: &rec.status, ResponseHeaders: rec.headers, ResponseBody: rec.body, ResourceLocation: rec.location,
			TtlSeconds: s.cfg.TTL.Seconds(), RetentionSeconds: s.cfg.KeyRetention.Seconds(),
		})
		if err != nil {
			return err
		}
		stampExpiry(&res, expires)
		return nil
	})
	switch {
	case errors.Is(err, ErrConflictingWrite):
		return Response{}, false, ErrConflictingWrite
	case db.IsLockTimeout(err):
		return Response{}, false, ErrKeyInUse
	case err != nil:
		return Response{}, false, s.wrap(err)
	case taken:
		res, _, err = existing(ctx, dbsqlc.New(conn), c)
		return res, err == nil, s.wrap(err)
	}
	// The same crash point as Execute's, for the benchmark's crash test.
	failpoint.Inject("claim-first-after-commit")
	return res, false, nil
}
