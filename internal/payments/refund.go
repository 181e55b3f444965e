package payments

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/outbox"
	"github.com/idemref/payments/internal/processor"
)

// Refund statuses, as stored.
const (
	RefundStatusCreated   = "created"
	RefundStatusSent      = "refund_sent"
	RefundStatusSucceeded = "succeeded"
	RefundStatusFailed    = "failed"
)

// Refund is a refund of part or all of a payment.
type Refund struct {
	ID        uuid.UUID
	PaymentID uuid.UUID
	Amount    int64
	Status    string
	CreatedAt time.Time
}

// GetRefund returns one refund of one of the tenant's payments.
func (s *Service) GetRefund(ctx context.Context, tenantID, paymentID, refundID uuid.UUID) (Refund, error) {
	row, err := dbsqlc.New(s.pool).RefundGet(ctx, dbsqlc.RefundGetParams{TenantID: tenantID, ID: refundID})
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && row.PaymentID != paymentID) {
		return Refund{}, ErrRefundNotFound
	}
	if err != nil {
		return Refund{}, err
	}
	return refundFrom(row), nil
}

func refundFrom(row dbsqlc.Refund) Refund {
	return Refund{ID: row.ID, PaymentID: row.PaymentID, Amount: row.Amount, Status: row.Status, CreatedAt: row.CreatedAt}
}

// Recovery points of a refund (S1).
const (
	// recoveryRefundCreated: the refund row is committed.
	recoveryRefundCreated = "refund_created"
	// recoveryRefundSent: a refund call may have reached the processor.
	recoveryRefundSent = "refund_sent"
)

// stepRefund names the refund's derived key (S2).
const stepRefund = "refund"

// refundOutcome is what the processor finally said about the refund.
type refundOutcome struct {
	refund   processor.Refund
	rejected *processor.RequestError
	// extra: the lookup found more than one refund under the key.
	extra bool
}

// markRefundSent is markChargeSent for refunds. Only the attempt holding
// the key's lease settles a refund, inside the same fenced phases, so a
// guarded mark that matches nothing means the database and the lease
// disagree: an error, never a resend.
func markRefundSent(ctx context.Context, tx pgx.Tx, l *idem.Lease) error {
	_, err := dbsqlc.New(tx).RefundMarkSent(ctx, dbsqlc.RefundMarkSentParams{TenantID: l.TenantID, ID: l.ResourceID})
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("payments: refund %s is settled, but its key is not finished", l.ResourceID)
	}
	return err
}

// sendRefund is charge for refunds. Money sent back cannot be pulled back,
// so waiting out the settle window before a resend is what keeps a
// processor that ignores keys from refunding twice.
func (s *Service) sendRefund(ctx context.Context, l *idem.Lease, fresh bool) (refundOutcome, error) {
	q := dbsqlc.New(s.pool)
	row, err := q.RefundGetUnsettled(ctx, dbsqlc.RefundGetUnsettledParams{
		TenantID: l.TenantID, ID: l.ResourceID, SettleSeconds: s.settleWindow().Seconds(),
	})
	if err != nil {
		return refundOutcome{}, err
	}
	r := row.Refund
	p, err := q.PaymentGet(ctx, dbsqlc.PaymentGetParams{TenantID: l.TenantID, ID: r.PaymentID})
	if err != nil {
		return refundOutcome{}, err
	}
	if p.ChargeID == nil {
		return refundOutcome{}, fmt.Errorf("payments: refund %s of payment %s without a charge", r.ID, p.ID)
	}
	chargeID := *p.ChargeID
	return settle(ctx, s.log, processorCall[refundOutcome]{
		fresh:     fresh,
		sentAt:    r.RefundSentAt,
		unsettled: seconds(row.UnsettledSeconds),
		lookup: func(ctx context.Context) (*refundOutcome, error) {
			mine, err := refundsUnder(ctx, s.proc, chargeID, r.RefundKey)
			if err != nil {
				return nil, err
			}
			return refundFound(mine)
		},
		mark: func(ctx context.Context) error {
			return s.stayAt(ctx, l, func(ctx context.Context, tx pgx.Tx) error { return markRefundSent(ctx, tx, l) })
		},
		unmark: func(ctx context.Context, previous *time.Time) error {
			return s.stayAt(ctx, l, func(ctx context.Context, tx pgx.Tx) error {
				return dbsqlc.New(tx).RefundUnmarkSent(ctx, dbsqlc.RefundUnmarkSentParams{TenantID: l.TenantID, ID: l.ResourceID, PreviousSentAt: previous})
			})
		},
		send: func(ctx context.Context) (refundOutcome, error) {
			ref, err := s.proc.Refund(ctx, processor.RefundRequest{Charge: chargeID, Amount: r.Amount}, r.RefundKey)
			var rejected *processor.RequestError
			if errors.As(err, &rejected) {
				return refundOutcome{rejected: rejected}, nil
			}
			return refundOutcome{refund: ref}, err
		},
	})
}

// errRefundPending: the lookup found the refund still pending at the
// processor. The call landed, so nothing may be sent again; its outcome
// is not known yet, so nothing is final: the key is released and the
// retry (or the completer) looks again.
var errRefundPending = errors.New("the refund is pending at the processor")

// refundFound is what the refunds made under one key say, as a lookup's
// outcome. A succeeded one is the outcome (more than one: money went back
// twice, which the sweep reports). A pending one landed but may still
// succeed or fail: errRefundPending, never "nothing found", which would
// let a resend go out once the settle window passed. Only failed or
// canceled ones: the refund did not happen, and the processor said so, a
// final failure. A failed refund is never recorded as succeeded. None:
// nil.
func refundFound(mine []processor.Refund) (*refundOutcome, error) {
	var out *refundOutcome
	var pending, failed *processor.Refund
	for i, re := range mine {
		switch re.Status {
		case processor.StatusSucceeded:
			if out != nil {
				out.extra = true
				continue
			}
			out = &refundOutcome{refund: re}
		case processor.StatusPending:
			pending = &mine[i]
		default:
			failed = &mine[i]
		}
	}
	switch {
	case out != nil:
		return out, nil
	case pending != nil:
		return nil, fmt.Errorf("%w: %s", errRefundPending, pending.ID)
	case failed == nil:
		return nil, nil
	}
	return &refundOutcome{rejected: &processor.RequestError{
		Status: 402, Code: "refund_" + failed.Status,
		Message: "the processor reports refund " + failed.ID + " as " + failed.Status,
	}}, nil
}

// refundsUnder lists the refunds of chargeID made under key, every page.
func refundsUnder(ctx context.Context, proc processor.Processor, chargeID, key string) ([]processor.Refund, error) {
	refunds, err := proc.RefundsByCharge(ctx, chargeID)
	if err != nil {
		return nil, err
	}
	var mine []processor.Refund
	for _, re := range refunds {
		if re.IdempotencyKey == key {
			mine = append(mine, re)
		}
	}
	return mine, nil
}

// recordRefund is the refund's last transaction: its outcome, the
// payment's refunded total, its event in the outbox and the exact
// response, committed together.
func (s *Service) recordRefund(ctx context.Context, tx pgx.Tx, l *idem.Lease, o refundOutcome) (idem.Step, error) {
	q := dbsqlc.New(tx)
	finish := dbsqlc.RefundFinishParams{TenantID: l.TenantID, ID: l.ResourceID, SweepDelaySeconds: s.sweepDelay().Seconds(), SweepNow: o.extra}
	if o.rejected != nil {
		finish.Status, finish.FailureMessage = RefundStatusFailed, &o.rejected.Message
		if _, err := q.RefundFinish(ctx, finish); err != nil {
			return idem.Step{}, err
		}
		// A processor's final answer is an outcome: always recorded.
		res, _ := s.render.Failure(&ProcessorRejectedError{Code: o.rejected.Code, Message: o.rejected.Message})
		return idem.Step{Response: &res}, nil
	}
	finish.Status, finish.ProcessorRefundID = RefundStatusSucceeded, &o.refund.ID
	r, err := q.RefundFinish(ctx, finish)
	if err != nil {
		return idem.Step{}, err
	}
	if err := q.PaymentAddRefunded(ctx, dbsqlc.PaymentAddRefundedParams{TenantID: l.TenantID, ID: r.PaymentID, Amount: r.Amount}); err != nil {
		return idem.Step{}, err
	}
	p, err := q.PaymentGet(ctx, dbsqlc.PaymentGetParams{TenantID: l.TenantID, ID: r.PaymentID})
	if err != nil {
		return idem.Step{}, err
	}
	// The refund's event, in the transaction that made it (M2).
	if _, err := outbox.Write(ctx, tx, l.TenantID, TypeRefundSucceeded, RefundEvent{
		RefundID: r.ID, PaymentID: p.ID, OrderID: p.OrderID, Amount: r.Amount, Currency: p.Currency,
	}); err != nil {
		return idem.Step{}, err
	}
	res := s.render.Refund(refundFrom(r))
	return idem.Step{Response: &res}, nil
}
