package payments

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/failpoint"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/processor"
)

// Pay runs POST /v1/payments under claim c (S1):
//
//	transaction 1   claim the key with a lease, insert the payment "created",
//	                recovery point payment_created                  (Begin)
//	transaction     payment "charge_sent", recovery point charge_sent
//	processor call  charge with the derived key (S2)
//	transaction 2   record the outcome on the payment and the order, and the
//	                exact response on the key: completed            (Phase)
//
// A retry of an unfinished payment takes the lease over and resumes from
// the recovery point (resume); so does the completer.
func (s *Service) Pay(ctx context.Context, c idem.Claim, in PayInput) (res idem.Response, replayed bool, err error) {
	return s.run(ctx, c, pointPaymentCreated, func(ctx context.Context, tx pgx.Tx) (uuid.UUID, error) {
		p, err := createPayment(ctx, tx, c, in)
		return p.ID, err
	})
}

// Refund runs POST /v1/payments/{id}/refunds under claim c, through the
// same machinery with its own derived key.
func (s *Service) Refund(ctx context.Context, c idem.Claim, paymentID uuid.UUID, amount int64) (res idem.Response, replayed bool, err error) {
	return s.run(ctx, c, pointRefundCreated, func(ctx context.Context, tx pgx.Tx) (uuid.UUID, error) {
		r, err := createRefund(ctx, tx, c, paymentID, amount)
		return r.ID, err
	})
}

// run claims c, runs create in the claim's transaction (recovery point
// created, or a recorded deterministic failure), then drives the lease to
// the end. A replay or a first-phase failure answers at once.
func (s *Service) run(ctx context.Context, c idem.Claim, created string, create func(context.Context, pgx.Tx) (uuid.UUID, error)) (idem.Response, bool, error) {
	begun, err := s.store.Begin(ctx, c, func(ctx context.Context, tx pgx.Tx, l idem.Lease) (idem.Step, error) {
		id, err := create(ctx, tx)
		if err != nil {
			return s.failureStep(err)
		}
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
	res, err := s.resume(ctx, &begun.Lease)
	return res, false, err
}

// failureStep completes the key with a deterministic failure, or passes a
// transient error on (rolling back the claim).
func (s *Service) failureStep(err error) (idem.Step, error) {
	if !isDeterministic(err) {
		return idem.Step{}, err
	}
	res := s.render.Failure(err)
	return idem.Step{Response: &res}, nil
}

// resume drives a held lease from its recovery point to the end. It uses
// only what is in the database, so a request, a retry that took over, and
// the completer all run exactly this code.
func (s *Service) resume(ctx context.Context, l *idem.Lease) (_ idem.Response, err error) {
	defer func() {
		if err != nil {
			err = s.release(ctx, l, err)
		}
	}()
	for {
		switch l.RecoveryPoint {
		case pointPaymentCreated:
			if _, err := s.store.Phase(ctx, l, func(ctx context.Context, tx pgx.Tx) (idem.Step, error) {
				_, err := setPaymentStatus(ctx, tx, l, dbsqlc.PaymentSetStatusParams{Status: StatusChargeSent})
				return idem.Step{RecoveryPoint: pointChargeSent}, err
			}); err != nil {
				return idem.Response{}, err
			}
			failpoint.Inject("payment-after-charge-sent")

		case pointChargeSent:
			outcome, err := s.charge(ctx, l)
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

		case pointRefundCreated:
			if _, err := s.store.Phase(ctx, l, func(ctx context.Context, tx pgx.Tx) (idem.Step, error) {
				_, err := setRefundStatus(ctx, tx, l, dbsqlc.RefundSetStatusParams{Status: "refund_sent"})
				return idem.Step{RecoveryPoint: pointRefundSent}, err
			}); err != nil {
				return idem.Response{}, err
			}

		case pointRefundSent:
			outcome, err := s.sendRefund(ctx, l)
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
// (a processor timeout, a database hiccup), so the retry or the completer
// resumes at once with the same derived key instead of waiting out the
// lease. After a lost lease it changes nothing: the release is fenced too.
func (s *Service) release(ctx context.Context, l *idem.Lease, cause error) error {
	if err := s.store.Release(ctx, *l); err != nil {
		s.log.WarnContext(ctx, "release idempotency key", slog.Any("error", err))
	}
	switch {
	case errors.Is(cause, processor.ErrTransient):
		return fmt.Errorf("%w: %w", ErrProcessorUnavailable, cause)
	case db.IsTransient(cause) && !errors.Is(cause, idem.ErrUnavailable):
		return fmt.Errorf("%w: %w", idem.ErrUnavailable, cause)
	}
	return cause
}

// chargeOutcome is what the processor said about the charge.
type chargeOutcome struct {
	charge   processor.Charge
	declined *processor.DeclineError
	rejected *processor.RequestError
}

// charge calls the processor with the payment's derived key. An attempt
// that resumed (an earlier one may have sent the charge) first looks the
// charge up by that key (S4): against a processor that deduplicates this
// is merely cheaper, against one that does not it is what prevents a second
// charge. Extra charges found under the key are refunded (compensation).
func (s *Service) charge(ctx context.Context, l *idem.Lease) (chargeOutcome, error) {
	p, err := dbsqlc.New(s.pool).PaymentGet(ctx, dbsqlc.PaymentGetParams{TenantID: l.TenantID, ID: l.ResourceID})
	if err != nil {
		return chargeOutcome{}, err
	}
	if l.Resumed {
		found, err := s.reconcile(ctx, l, p.ChargeKey)
		if err != nil || found != nil {
			if found != nil {
				return *found, nil
			}
			return chargeOutcome{}, err
		}
	}
	ch, err := s.proc.CreateCharge(ctx, processor.ChargeRequest{
		Amount:        p.Amount,
		Currency:      p.Currency,
		PaymentMethod: p.PaymentMethod,
		Metadata:      map[string]string{"payment_id": p.ID.String(), "order_id": p.OrderID.String()},
	}, p.ChargeKey)
	var declined *processor.DeclineError
	var rejected *processor.RequestError
	switch {
	case errors.As(err, &declined):
		return chargeOutcome{declined: declined}, nil
	case errors.As(err, &rejected):
		return chargeOutcome{rejected: rejected}, nil
	case err != nil:
		return chargeOutcome{}, err
	}
	return chargeOutcome{charge: ch}, nil
}

// reconcile looks for charges already made under the derived key. It keeps
// the first succeeded one (or, if none succeeded, reports the decline) and
// refunds every other succeeded charge: a double charge never survives.
func (s *Service) reconcile(ctx context.Context, l *idem.Lease, chargeKey string) (*chargeOutcome, error) {
	charges, err := s.proc.ChargesByIdempotencyKey(ctx, chargeKey)
	if err != nil || len(charges) == 0 {
		return nil, err
	}
	var kept *processor.Charge
	for i := range charges {
		ch := charges[i]
		if ch.Status != processor.StatusSucceeded {
			continue
		}
		if kept == nil {
			kept = &charges[i]
			continue
		}
		// A deterministic key per duplicate: a retry of this compensation
		// refunds each duplicate once.
		refundKey := idem.DeriveKey(l.Claim, "refund-duplicate:"+ch.ID)
		if _, err := s.proc.Refund(ctx, processor.RefundRequest{Charge: ch.ID, Amount: ch.Amount - ch.RefundedAmount}, refundKey); err != nil {
			var rejected *processor.RequestError
			if !errors.As(err, &rejected) { // already fully refunded is fine
				return nil, err
			}
		}
		s.log.WarnContext(ctx, "refunded a duplicate charge", slog.String("charge_id", ch.ID), slog.String("kept_charge_id", kept.ID))
	}
	if kept != nil {
		return &chargeOutcome{charge: *kept}, nil
	}
	// Only failed charges: the card was declined before.
	return &chargeOutcome{declined: &processor.DeclineError{Code: "card_declined", DeclineCode: charges[0].DeclineCode, ChargeID: charges[0].ID}}, nil
}

// recordCharge is transaction 2: the outcome on the payment (and the order)
// and the exact response on the key, committed together.
func (s *Service) recordCharge(ctx context.Context, tx pgx.Tx, l *idem.Lease, o chargeOutcome) (idem.Step, error) {
	switch {
	case o.declined != nil:
		code := o.declined.DeclineCode
		if code == "" {
			code = o.declined.Code
		}
		p, err := setPaymentStatus(ctx, tx, l, dbsqlc.PaymentSetStatusParams{Status: StatusDeclined, ChargeID: nonEmpty(o.declined.ChargeID), DeclineCode: &code})
		if err != nil {
			return idem.Step{}, err
		}
		res := s.render.Failure(&DeclinedError{PaymentID: p.ID, DeclineCode: code})
		return idem.Step{Response: &res}, nil
	case o.rejected != nil:
		_, err := setPaymentStatus(ctx, tx, l, dbsqlc.PaymentSetStatusParams{Status: StatusFailed, FailureMessage: &o.rejected.Message})
		if err != nil {
			return idem.Step{}, err
		}
		res := s.render.Failure(&ProcessorRejectedError{Code: o.rejected.Code, Message: o.rejected.Message})
		return idem.Step{Response: &res}, nil
	}
	p, err := setPaymentStatus(ctx, tx, l, dbsqlc.PaymentSetStatusParams{Status: StatusSucceeded, ChargeID: &o.charge.ID})
	if err != nil {
		return idem.Step{}, err
	}
	if _, err := dbsqlc.New(tx).OrderAddPaid(ctx, dbsqlc.OrderAddPaidParams{TenantID: l.TenantID, ID: p.OrderID, Amount: p.Amount}); err != nil {
		return idem.Step{}, err
	}
	res := s.render.Payment(paymentFrom(p))
	return idem.Step{Response: &res}, nil
}

// refundOutcome is what the processor said about the refund.
type refundOutcome struct {
	refund   processor.Refund
	rejected *processor.RequestError
}

func (s *Service) sendRefund(ctx context.Context, l *idem.Lease) (refundOutcome, error) {
	q := dbsqlc.New(s.pool)
	r, err := q.RefundGet(ctx, dbsqlc.RefundGetParams{TenantID: l.TenantID, ID: l.ResourceID})
	if err != nil {
		return refundOutcome{}, err
	}
	p, err := q.PaymentGet(ctx, dbsqlc.PaymentGetParams{TenantID: l.TenantID, ID: r.PaymentID})
	if err != nil {
		return refundOutcome{}, err
	}
	if p.ChargeID == nil {
		return refundOutcome{}, fmt.Errorf("payments: refund %s of payment %s without a charge", r.ID, p.ID)
	}
	if l.Resumed {
		// As for charges (see reconcile): an earlier attempt may have sent
		// this refund, and a processor that ignores keys would refund twice.
		refunds, err := s.proc.RefundsByCharge(ctx, *p.ChargeID)
		if err != nil {
			return refundOutcome{}, err
		}
		for _, found := range refunds {
			if found.IdempotencyKey == r.RefundKey {
				return refundOutcome{refund: found}, nil
			}
		}
	}
	ref, err := s.proc.Refund(ctx, processor.RefundRequest{Charge: *p.ChargeID, Amount: r.Amount}, r.RefundKey)
	var rejected *processor.RequestError
	switch {
	case errors.As(err, &rejected):
		return refundOutcome{rejected: rejected}, nil
	case err != nil:
		return refundOutcome{}, err
	}
	return refundOutcome{refund: ref}, nil
}

func (s *Service) recordRefund(ctx context.Context, tx pgx.Tx, l *idem.Lease, o refundOutcome) (idem.Step, error) {
	if o.rejected != nil {
		if _, err := setRefundStatus(ctx, tx, l, dbsqlc.RefundSetStatusParams{Status: "failed", FailureMessage: &o.rejected.Message}); err != nil {
			return idem.Step{}, err
		}
		res := s.render.Failure(&ProcessorRejectedError{Code: o.rejected.Code, Message: o.rejected.Message})
		return idem.Step{Response: &res}, nil
	}
	r, err := setRefundStatus(ctx, tx, l, dbsqlc.RefundSetStatusParams{Status: "succeeded", ProcessorRefundID: &o.refund.ID})
	if err != nil {
		return idem.Step{}, err
	}
	if err := dbsqlc.New(tx).PaymentAddRefunded(ctx, dbsqlc.PaymentAddRefundedParams{TenantID: l.TenantID, ID: r.PaymentID, Amount: r.Amount}); err != nil {
		return idem.Step{}, err
	}
	res := s.render.Refund(refundFrom(r))
	return idem.Step{Response: &res}, nil
}

func setPaymentStatus(ctx context.Context, tx pgx.Tx, l *idem.Lease, p dbsqlc.PaymentSetStatusParams) (dbsqlc.Payment, error) {
	p.TenantID, p.ID = l.TenantID, l.ResourceID
	return dbsqlc.New(tx).PaymentSetStatus(ctx, p)
}

func setRefundStatus(ctx context.Context, tx pgx.Tx, l *idem.Lease, p dbsqlc.RefundSetStatusParams) (dbsqlc.Refund, error) {
	p.TenantID, p.ID = l.TenantID, l.ResourceID
	return dbsqlc.New(tx).RefundSetStatus(ctx, p)
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
