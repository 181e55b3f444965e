package payments

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/failpoint"
	"github.com/idemref/payments/internal/idem"
)

// Pay runs POST /v1/payments under claim c:
//
//	transaction 1   claim the key with a lease, insert the payment already
//	                marked "charge_sent" (its call counted as sent),
//	                recovery point charge_sent                      (Begin)
//	processor call  charge with the derived key
//	transaction 2   record the outcome on the payment and the order, and the
//	                exact response on the key: completed            (Phase)
//
// The mark rides in transaction 1 rather than a transaction of its own
// (P7): one transaction fewer per payment. Its price: a crash between
// transaction 1's commit and the charge call leaves a mark with no call
// behind it, and the attempt that resumes cannot tell that from a call in
// flight, so it waits out the settle window before it charges.
//
// A retry of an unfinished payment takes the lease over and resumes from
// the recovery point (resume); so does the completer.
func (s *Service) Pay(ctx context.Context, c idem.Claim, in PayInput) (res idem.Response, replayed bool, err error) {
	return s.run(ctx, c, recoveryChargeSent, func(ctx context.Context, tx pgx.Tx) (uuid.UUID, *dbsqlc.Payment, error) {
		p, err := createPayment(ctx, tx, c, in)
		return p.ID, &p, err
	})
}

// Refund runs POST /v1/payments/{id}/refunds under claim c, through the
// same machinery with its own derived key.
func (s *Service) Refund(ctx context.Context, c idem.Claim, paymentID uuid.UUID, amount int64) (res idem.Response, replayed bool, err error) {
	return s.run(ctx, c, recoveryRefundCreated, func(ctx context.Context, tx pgx.Tx) (uuid.UUID, *dbsqlc.Payment, error) {
		r, err := createRefund(ctx, tx, c, paymentID, amount)
		return r.ID, nil, err
	})
}

// run claims c, runs create in the claim's transaction (recovery point
// created, or a recorded deterministic failure), then drives the lease to
// the end. A replay or a first-phase failure answers at once. create
// returns the payment it inserted already marked for its charge call
// (nil: nothing marked, a refund), which the call then goes out on.
func (s *Service) run(ctx context.Context, c idem.Claim, created string, create func(context.Context, pgx.Tx) (uuid.UUID, *dbsqlc.Payment, error)) (idem.Response, bool, error) {
	var marked *dbsqlc.Payment
	begun, err := s.store.Begin(ctx, c, func(ctx context.Context, tx pgx.Tx, l idem.Lease) (idem.Step, error) {
		id, p, err := create(ctx, tx)
		if err != nil {
			return s.failureStep(err)
		}
		marked = p
		return idem.Step{RecoveryPoint: created, ResourceID: id}, nil
	})
	if err != nil {
		return idem.Response{}, false, err
	}
	if begun.Response != nil {
		return *begun.Response, begun.Replayed, nil
	}
	// Transaction 1 is committed; a crash here leaves the key at its
	// created point for a retry or the completer.
	failpoint.Inject("payment-after-create")
	res, err := s.resume(ctx, &begun.Lease, marked)
	return res, false, err
}

// failureStep completes the key with a failure the renderer says is
// recorded (deterministic), or passes the error on, rolling the claim back.
func (s *Service) failureStep(err error) (idem.Step, error) {
	res, recorded := s.render.Failure(err)
	if !recorded {
		return idem.Step{}, err
	}
	return idem.Step{Response: &res}, nil
}

// resume drives a held lease from its recovery point to the end. It uses
// only what is in the database, so a request, a retry that took over, and
// the completer all run exactly this code; marked is the one exception,
// the payment as this attempt's own transaction 1 marked it (nil when
// resuming).
func (s *Service) resume(ctx context.Context, l *idem.Lease, marked *dbsqlc.Payment) (_ idem.Response, err error) {
	defer func() {
		if err != nil {
			err = s.release(ctx, l, err)
		}
	}()
	// A fresh mark: this attempt has just committed the mark for the
	// processor call and has not sent it, so nothing can be in flight but
	// the call it is about to make. For a charge, marked is the payment as
	// that mark left it; for a refund, fresh says so.
	fresh := false
	for {
		switch l.RecoveryPoint {
		case recoveryChargeSent:
			outcome, err := s.charge(ctx, l, marked)
			if err != nil {
				return idem.Response{}, err
			}
			failpoint.Inject("payment-after-charge")
			res, err := s.store.Phase(ctx, l, func(ctx context.Context, tx pgx.Tx) (idem.Step, error) {
				return s.recordCharge(ctx, tx, l, outcome)
			})
			if err != nil {
				return idem.Response{}, err
			}
			return *res, nil

		case recoveryRefundCreated:
			if _, err := s.store.Phase(ctx, l, func(ctx context.Context, tx pgx.Tx) (idem.Step, error) {
				return idem.Step{RecoveryPoint: recoveryRefundSent}, markRefundSent(ctx, tx, l)
			}); err != nil {
				return idem.Response{}, err
			}
			fresh = true

		case recoveryRefundSent:
			outcome, err := s.sendRefund(ctx, l, fresh)
			if err != nil {
				return idem.Response{}, err
			}
			res, err := s.store.Phase(ctx, l, func(ctx context.Context, tx pgx.Tx) (idem.Step, error) {
				return s.recordRefund(ctx, tx, l, outcome)
			})
			if err != nil {
				return idem.Response{}, err
			}
			return *res, nil

		default:
			return idem.Response{}, fmt.Errorf("payments: key %s at unknown recovery point %q", l.Endpoint, l.RecoveryPoint)
		}
	}
}

// release gives the key back at its recovery point when a step failed
// (a processor call without a final answer, a database hiccup), so the
// retry or the completer resumes with the same derived key instead of
// waiting out the lease: at once, or after the RetryError's delay. After a
// lost lease it changes nothing: the release is fenced too.
func (s *Service) release(ctx context.Context, l *idem.Lease, cause error) error {
	if err := s.store.Release(ctx, *l, RetryAfter(cause)); err != nil {
		s.log.WarnContext(ctx, "release idempotency key", slog.Any("error", err))
	}
	return cause
}
