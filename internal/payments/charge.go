package payments

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/processor"
)

// Recovery points of a payment (S1), between idem.RecoveryStarted and
// idem.RecoveryFinished.
const (
	// pointPaymentCreated: transaction 1 committed the payment row.
	pointPaymentCreated = "payment_created"
	// pointChargeSent: a charge call may have reached the processor. A
	// resumed attempt looks it up before charging again.
	pointChargeSent = "charge_sent"
)

// stepCharge names the charge's derived key (S2).
const stepCharge = "charge"

// chargeOutcome is what the processor finally said about the charge.
type chargeOutcome struct {
	charge   processor.Charge
	declined *processor.DeclineError
	rejected *processor.RequestError
	// extra: the lookup found succeeded charges beside the kept one; the
	// sweep refunds them right after the payment is recorded.
	extra bool
}

// markChargeSent commits, before every charge call, that a call may be in
// flight: from here on a crash or a timeout cannot hide it. It returns the
// payment as marked.
func markChargeSent(ctx context.Context, tx pgx.Tx, l *idem.Lease) (dbsqlc.Payment, error) {
	return dbsqlc.New(tx).PaymentMarkChargeSent(ctx, dbsqlc.PaymentMarkChargeSentParams{TenantID: l.TenantID, ID: l.ResourceID})
}

// charge gets the charge's final outcome: from the call this attempt just
// marked (marked is the payment as that mark left it), or, for an attempt
// that resumed (marked nil), from a lookup of what earlier calls did,
// sending again only once they can no longer land (S6).
func (s *Service) charge(ctx context.Context, l *idem.Lease, marked *dbsqlc.Payment) (chargeOutcome, error) {
	var p dbsqlc.Payment
	var unsettled time.Duration
	if marked != nil {
		// The mark's own transaction returned the row: reading it again
		// would cost a round trip and tell nothing new (P2).
		p = *marked
	} else {
		row, err := dbsqlc.New(s.pool).PaymentGetUnsettled(ctx, dbsqlc.PaymentGetUnsettledParams{
			TenantID: l.TenantID, ID: l.ResourceID, SettleSeconds: s.cfg.SettleWindow.Seconds(),
		})
		if err != nil {
			return chargeOutcome{}, err
		}
		p, unsettled = row.Payment, seconds(row.UnsettledSeconds)
	}
	return settle(ctx, s.log, processorCall[chargeOutcome]{
		fresh:     marked != nil,
		sentAt:    p.ChargeSentAt,
		unsettled: unsettled,
		lookup: func(ctx context.Context) (*chargeOutcome, error) {
			return s.lookUpCharge(ctx, p.ChargeKey)
		},
		mark: func(ctx context.Context) error {
			return s.stayAt(ctx, l, func(ctx context.Context, tx pgx.Tx) error {
				_, err := markChargeSent(ctx, tx, l)
				return err
			})
		},
		unmark: func(ctx context.Context, previous *time.Time) error {
			return s.stayAt(ctx, l, func(ctx context.Context, tx pgx.Tx) error {
				return dbsqlc.New(tx).PaymentUnmarkChargeSent(ctx, dbsqlc.PaymentUnmarkChargeSentParams{TenantID: l.TenantID, ID: l.ResourceID, PreviousSentAt: previous})
			})
		},
		send: func(ctx context.Context) (chargeOutcome, error) {
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
			}
			return chargeOutcome{charge: ch}, err
		},
	})
}

// lookUpCharge reads every charge made under the derived key. The first
// succeeded one is the outcome; any other succeeded one is a double charge
// that the sweep refunds (compensation). Only failed charges: the card was
// declined. None: nil.
func (s *Service) lookUpCharge(ctx context.Context, chargeKey string) (*chargeOutcome, error) {
	charges, err := s.proc.ChargesByIdempotencyKey(ctx, chargeKey)
	if err != nil || len(charges) == 0 {
		return nil, err
	}
	var out *chargeOutcome
	for _, ch := range charges {
		if ch.Status != processor.StatusSucceeded {
			continue
		}
		if out != nil {
			out.extra = true
			continue
		}
		out = &chargeOutcome{charge: ch}
	}
	if out != nil {
		return out, nil
	}
	first := charges[0]
	return &chargeOutcome{declined: &processor.DeclineError{Code: processor.CodeCardDeclined, DeclineCode: first.DeclineCode, ChargeID: first.ID}}, nil
}

// recordCharge is transaction 2: the outcome on the payment (and the order)
// and the exact response on the key, committed together. Only final
// outcomes get here (S6).
func (s *Service) recordCharge(ctx context.Context, tx pgx.Tx, l *idem.Lease, o chargeOutcome) (idem.Step, error) {
	q := dbsqlc.New(tx)
	finish := dbsqlc.PaymentFinishParams{TenantID: l.TenantID, ID: l.ResourceID, SweepDelaySeconds: s.sweepDelay().Seconds(), SweepNow: o.extra}
	switch {
	case o.declined != nil:
		code := o.declined.DeclineCode
		if code == "" {
			code = o.declined.Code
		}
		finish.Status, finish.ChargeID, finish.DeclineCode = StatusDeclined, nonEmpty(o.declined.ChargeID), &code
		p, err := q.PaymentFinish(ctx, finish)
		if err != nil {
			return idem.Step{}, err
		}
		res := s.render.Failure(&DeclinedError{PaymentID: p.ID, DeclineCode: code})
		return idem.Step{Response: &res}, nil
	case o.rejected != nil:
		finish.Status, finish.FailureMessage = StatusFailed, &o.rejected.Message
		if _, err := q.PaymentFinish(ctx, finish); err != nil {
			return idem.Step{}, err
		}
		res := s.render.Failure(&ProcessorRejectedError{Code: o.rejected.Code, Message: o.rejected.Message})
		return idem.Step{Response: &res}, nil
	}
	finish.Status, finish.ChargeID = StatusSucceeded, &o.charge.ID
	row, err := q.PaymentFinish(ctx, finish)
	if err != nil {
		return idem.Step{}, err
	}
	if _, err := q.OrderAddPaid(ctx, dbsqlc.OrderAddPaidParams{TenantID: l.TenantID, ID: row.OrderID, Amount: row.Amount}); err != nil {
		return idem.Step{}, err
	}
	// No compensation can exist yet: the sweep only looks at payments that
	// have finished, so the recorded response shows an empty list without
	// asking the database.
	p := paymentFrom(row)
	p.Compensations = []Compensation{}
	res := s.render.Payment(p)
	return idem.Step{Response: &res}, nil
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
