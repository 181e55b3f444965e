package payments

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/outbox"
	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/tracing"
)

// Recovery points of a payment (S1), between idem.RecoveryStarted and
// idem.RecoveryFinished.
const (
	// recoveryChargeSent: a charge call may have reached the processor
	// (transaction 1 commits a payment here). A resumed attempt looks it up
	// before charging again.
	recoveryChargeSent = "charge_sent"
)

// stepCharge names the charge's derived key (S2).
const stepCharge = "charge"

// chargeOutcome is what the processor finally said about the charge.
type chargeOutcome struct {
	charge   processor.Charge
	declined *processor.DeclineError
	rejected *processor.RequestError
	// extra: the lookup found succeeded charges beside the kept one; the
	// sweep refunds them right after the payment is recorded, whoever
	// settled it (recordCharge, recordSettled).
	extra bool
	// settledUnseen: another actor (a webhook) settled the payment with a
	// charge this attempt's lookup never saw: the attempt resumed to a
	// payment settled already, or its resend's mark found it settled. A
	// call whose outcome was unknown may have made more charges than the
	// one the webhook named (at a processor that ignores keys, one call
	// that reached it twice), and their webhooks may never come.
	settledUnseen bool
}

// errSettledMeanwhile: the mark before a charge call found the payment
// settled (a webhook confirmed it since the attempt last looked). Nothing
// is sent: the attempt records the settled payment instead.
var errSettledMeanwhile = errors.New("payments: the payment was settled before the charge call was marked")

// markChargeSent commits, before every charge call, that a call may be in
// flight: from here on a crash or a timeout cannot hide it. It returns the
// payment as marked, or errSettledMeanwhile: the mark is guarded (only an
// unsettled payment is marked), so a late resend can never move a settled
// payment back to charge_sent and have it settled, and counted, twice.
func markChargeSent(ctx context.Context, tx pgx.Tx, l *idem.Lease) (dbsqlc.Payment, error) {
	p, err := dbsqlc.New(tx).PaymentMarkChargeSent(ctx, dbsqlc.PaymentMarkChargeSentParams{TenantID: l.TenantID, ID: l.ResourceID})
	if errors.Is(err, pgx.ErrNoRows) {
		return p, errSettledMeanwhile
	}
	return p, err
}

// charge gets the charge's final outcome: from the call this attempt just
// marked (marked is the payment as that mark left it), or, for an attempt
// that resumed (marked nil), from a lookup of what earlier calls did,
// sending again only once they can no longer land.
func (s *Service) charge(ctx context.Context, l *idem.Lease, marked *dbsqlc.Payment) (chargeOutcome, error) {
	var p dbsqlc.Payment
	var unsettled time.Duration
	if marked != nil {
		// The mark's own transaction returned the row: reading it again
		// would cost a round trip and tell nothing new (P2).
		p = *marked
	} else {
		row, err := dbsqlc.New(s.pool).PaymentGetUnsettled(ctx, dbsqlc.PaymentGetUnsettledParams{
			TenantID: l.TenantID, ID: l.ResourceID, SettleSeconds: s.settleWindow().Seconds(),
		})
		if err != nil {
			return chargeOutcome{}, err
		}
		p, unsettled = row.Payment, seconds(row.UnsettledSeconds)
		linkPayment(ctx, p.TraceParent)
		if p.Status == StatusSucceeded && p.ChargeID != nil {
			// A webhook confirmed the charge while the key was unfinished
			// (webhook.go): nothing to send. Nor to look up now (the
			// processor may be down, and the payment is settled), but what
			// else the unknown call made is unseen: the sweep looks.
			return chargeOutcome{charge: processor.Charge{ID: *p.ChargeID}, settledUnseen: true}, nil
		}
	}
	out, err := settle(ctx, s.log, processorCall[chargeOutcome]{
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
				n, err := dbsqlc.New(tx).PaymentUnmarkChargeSent(ctx, dbsqlc.PaymentUnmarkChargeSentParams{TenantID: l.TenantID, ID: l.ResourceID, PreviousSentAt: previous})
				if err == nil && n == 0 {
					// Settled meanwhile: its count of calls stays as it is.
					staleWritesTotal.WithLabelValues("unmark_charge_sent").Inc()
				}
				return err
			})
		},
		send: func(ctx context.Context) (chargeOutcome, error) {
			ch, err := s.proc.CreateCharge(ctx, processor.ChargeRequest{
				Amount:        p.Amount,
				Currency:      p.Currency,
				PaymentMethod: p.PaymentMethod,
				Metadata:      chargeMetadata(p),
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
	if errors.Is(err, errSettledMeanwhile) {
		// Nothing was sent; recordCharge finds the payment settled and
		// records it as it is (recordSettled). The charge that settled it
		// landed after this attempt's lookup saw nothing: unseen.
		staleWritesTotal.WithLabelValues("mark_charge_sent").Inc()
		s.log.InfoContext(ctx, "payment settled before its resend; nothing sent", slog.String("payment_id", p.ID.String()))
		return chargeOutcome{settledUnseen: true}, nil
	}
	return out, err
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

// recordCharge is transaction 2: the outcome on the payment, its event in
// the outbox, and the exact response on the key, committed together. Only
// final outcomes get here. The order is not touched: the orders
// consumer applies the payment.succeeded event to it.
//
// The outcome is written first, by PaymentFinish, whose guard (the payment
// still charge_sent) is exactly "not settled" and whose UPDATE takes the
// payment's row lock: that lock serialises this record with a webhook that
// confirms the same payment (see webhook.go), whichever commits first
// settles it and writes its one event. No row back: the payment was
// settled (by the webhook, before or while this waited on its lock), and
// only then is it read, under its lock, to be recorded as it is. The
// common path so spends one round trip less than reading the row first
// (the payment against its baseline).
func (s *Service) recordCharge(ctx context.Context, tx pgx.Tx, l *idem.Lease, o chargeOutcome) (idem.Step, error) {
	q := dbsqlc.New(tx)
	settled := func() (idem.Step, error) {
		cur, err := q.PaymentGetForUpdate(ctx, dbsqlc.PaymentGetForUpdateParams{TenantID: l.TenantID, ID: l.ResourceID})
		if err != nil {
			return idem.Step{}, err
		}
		if !paymentFrom(cur).Settled() {
			return idem.Step{}, fmt.Errorf("payments: payment %s is %s: neither charge_sent nor settled", cur.ID, cur.Status)
		}
		return s.recordSettled(ctx, q, cur, o)
	}
	finish := dbsqlc.PaymentFinishParams{TenantID: l.TenantID, ID: l.ResourceID, SweepDelaySeconds: s.sweepDelay().Seconds(), SweepNow: o.extra}
	var failure error // the recorded answer of a declined or rejected charge
	switch {
	case o.declined != nil:
		code := o.declined.DeclineCode
		if code == "" {
			code = o.declined.Code
		}
		finish.Status, finish.ChargeID, finish.DeclineCode = StatusDeclined, nonEmpty(o.declined.ChargeID), &code
		failure = &DeclinedError{PaymentID: l.ResourceID, DeclineCode: code}
	case o.rejected != nil:
		finish.Status, finish.FailureMessage = StatusFailed, &o.rejected.Message
		failure = &ProcessorRejectedError{Code: o.rejected.Code, Message: o.rejected.Message}
	case o.charge.ID == "":
		// Only a settled payment gets here without a charge (the resend
		// found it settled): nothing to finish.
		step, err := settled()
		if err != nil {
			return idem.Step{}, fmt.Errorf("payments: payment %s: a charge outcome without a charge id: %w", l.ResourceID, err)
		}
		return step, nil
	default:
		finish.Status, finish.ChargeID = StatusSucceeded, &o.charge.ID
	}
	row, err := q.PaymentFinish(ctx, finish)
	if errors.Is(err, pgx.ErrNoRows) {
		return settled()
	}
	if err != nil {
		return idem.Step{}, err
	}
	if err := writePaymentEvent(ctx, tx, row); err != nil {
		return idem.Step{}, err
	}
	if failure != nil {
		// A processor's final answer is an outcome: always recorded.
		res, _ := s.render.Failure(failure)
		return idem.Step{Response: &res}, nil
	}
	// No compensation can exist yet: the sweep only looks at payments that
	// have finished, so the recorded response shows an empty list without
	// asking the database.
	p := paymentFrom(row)
	p.Compensations = []Compensation{}
	res := s.render.Payment(p)
	return idem.Step{Response: &res}, nil
}

// recordSettled records the key's response for a payment that a webhook
// settled first. Its event is already in the outbox; none is written
// again. What this attempt knows, or cannot know, of charges beside the
// one the webhook confirmed goes to the sweep, which looks now.
func (s *Service) recordSettled(ctx context.Context, q *dbsqlc.Queries, cur dbsqlc.Payment, o chargeOutcome) (idem.Step, error) {
	otherCharge := o.declined == nil && o.rejected == nil && o.charge.ID != "" && (cur.ChargeID == nil || *cur.ChargeID != o.charge.ID)
	// The webhook settled the payment knowing of one charge only. The
	// extra charges the lookup found were about to make the sweep due
	// (PaymentFinish's sweep_now); dropped here, nothing would: with one
	// marked call no sweep is scheduled, and an extra charge whose webhook
	// never comes would stay charged for ever. Likewise when this attempt
	// saw nothing of the processor's charges: the sweep looks instead.
	if otherCharge || o.extra || o.settledUnseen {
		n, err := q.PaymentSweepNow(ctx, dbsqlc.PaymentSweepNowParams{TenantID: cur.TenantID, ID: cur.ID})
		if err != nil {
			return idem.Step{}, err
		}
		if n == 0 {
			// cur is settled and locked by this transaction: the guard
			// cannot refuse it. If it did, recording the response without
			// the sweep would lose the extra charge: roll back instead,
			// and the attempt is retried.
			return idem.Step{}, fmt.Errorf("payments: payment %s (%s): the sweep could not be made due", cur.ID, cur.Status)
		}
	}
	p, err := withCompensations(ctx, q, paymentFrom(cur))
	if err != nil {
		return idem.Step{}, err
	}
	var res idem.Response
	switch p.Status {
	case StatusSucceeded:
		res = s.render.Payment(p)
	case StatusDeclined:
		// A processor's final answer is an outcome: always recorded.
		res, _ = s.render.Failure(&DeclinedError{PaymentID: p.ID, DeclineCode: p.DeclineCode})
	default:
		msg := ""
		if cur.FailureMessage != nil {
			msg = *cur.FailureMessage
		}
		// A processor's final answer is an outcome: always recorded.
		res, _ = s.render.Failure(&ProcessorRejectedError{Message: msg})
	}
	return idem.Step{Response: &res}, nil
}

// writePaymentEvent adds the payment's final event to the outbox, in the
// transaction that finished it (M2).
func writePaymentEvent(ctx context.Context, tx pgx.Tx, p dbsqlc.Payment) error {
	typ := TypePaymentFailed
	if p.Status == StatusSucceeded {
		typ = TypePaymentSucceeded
	}
	data := PaymentEvent{PaymentID: p.ID, OrderID: p.OrderID, Amount: p.Amount, Currency: p.Currency, Status: p.Status}
	if p.ChargeID != nil {
		data.ChargeID = *p.ChargeID
	}
	// The event stays in the payment's trace whoever finishes it: the
	// request, or the processor's webhook or the completer, each a trace of
	// its own (X3). The consumer's work on it then continues that trace.
	eventCtx := ctx
	if p.TraceParent != nil {
		eventCtx = tracing.InTrace(ctx, *p.TraceParent)
	}
	_, err := outbox.Write(eventCtx, tx, p.TenantID, typ, data)
	return err
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
