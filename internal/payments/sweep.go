package payments

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/processor"
)

// The reconciliation sweep (S4, S6).
//
// A payment or refund finishes on the first final answer, but when its call
// was sent more than once an earlier call may still land beside the
// recorded one: late (the processor kept executing after we gave up), from
// a stalled attempt, or twice at a processor that ignores keys. Once the
// last call can no longer land (the settle window plus a margin, sweep_at),
// the sweep looks at the processor's records again, every page:
//
//   - a succeeded charge under the payment's derived key other than the
//     recorded one is refunded: a compensation, recorded on the payment
//     with its reason and visible in GET /v1/payments/{id};
//   - money refunded more than once under a refund's key is reported (log
//     at error, the refund's duplicate_amount): it cannot be pulled back.
//
// The sweep claims due rows with FOR UPDATE SKIP LOCKED and pushes them out
// by sweepHold while it works, so any number of processes may sweep.

// sweepHold is how long a claimed row is kept from other sweepers; a
// sweeper that dies mid-way leaves it due again after that.
const sweepHold = time.Minute

// sweepRetry is how soon a look that could not finish (the processor was
// unavailable) is tried again.
const sweepRetry = 5 * time.Second

// refusedRetry is how soon a compensation the processor refused with a
// final error is tried again: the refusal is alerted on and a person
// looks, but a later try costs nothing (the refund's key is derived, and
// only what is left of the charge is refunded) and may succeed once the
// processor's side changed.
const refusedRetry = time.Hour

// Sweep looks again at up to max payments and up to max refunds whose sweep
// is due, and returns how many it looked at.
func (s *Service) Sweep(ctx context.Context, max int) (int, error) {
	q := dbsqlc.New(s.pool)
	payments, err := q.PaymentClaimSweep(ctx, dbsqlc.PaymentClaimSweepParams{HoldSeconds: sweepHold.Seconds(), MaxRows: db.Int32(max)})
	if err != nil {
		return 0, err
	}
	for _, p := range payments {
		// A trace of its own, linked to the payment's (tracing.go).
		pctx, span := startJob(ctx, spanSweep, p.TraceParent)
		retry := s.sweepPayment(pctx, p)
		sweepRowsTotal.WithLabelValues("payment", sweepResult(retry > 0)).Inc()
		err := q.PaymentSweepDone(pctx, dbsqlc.PaymentSweepDoneParams{
			TenantID: p.TenantID, ID: p.ID, ClaimedUntil: p.SweepAt,
			RetrySeconds: retry.Seconds(), SweepDelaySeconds: s.sweepDelay().Seconds(),
		})
		endJob(span, sweepResult(retry > 0), err != nil)
		if err != nil {
			return 0, err
		}
	}
	refunds, err := q.RefundClaimSweep(ctx, dbsqlc.RefundClaimSweepParams{HoldSeconds: sweepHold.Seconds(), MaxRows: db.Int32(max)})
	if err != nil {
		return len(payments), err
	}
	for _, r := range refunds {
		rctx, span := startJob(ctx, spanSweepRefund, nil)
		retry := s.sweepRefund(rctx, r)
		sweepRowsTotal.WithLabelValues("refund", sweepResult(retry > 0)).Inc()
		err := q.RefundSweepDone(rctx, dbsqlc.RefundSweepDoneParams{
			TenantID: r.TenantID, ID: r.ID, ClaimedUntil: r.SweepAt,
			RetrySeconds: retry.Seconds(), SweepDelaySeconds: s.sweepDelay().Seconds(),
		})
		endJob(span, sweepResult(retry > 0), err != nil)
		if err != nil {
			return len(payments), err
		}
	}
	return len(payments) + len(refunds), nil
}

// sweepPayment refunds every succeeded charge under the payment's derived
// key except the one it recorded (none, if it was declined or failed). It
// returns how soon to look again: 0 when it is done.
func (s *Service) sweepPayment(ctx context.Context, p dbsqlc.Payment) time.Duration {
	log := s.log.With(slog.String("payment_id", p.ID.String()), slog.String("tenant_id", p.TenantID.String()))
	charges, err := s.proc.ChargesByIdempotencyKey(ctx, p.ChargeKey)
	if err != nil {
		log.WarnContext(ctx, "sweep: look up charges; will retry", slog.Any("error", err))
		return sweepRetry
	}
	kept, reason := "", ReasonChargeAfterFailure
	if p.Status == StatusSucceeded && p.ChargeID != nil {
		kept, reason = *p.ChargeID, ReasonDuplicateCharge
	}
	var retry time.Duration
	for _, ch := range charges {
		if ch.Status != processor.StatusSucceeded || ch.ID == kept {
			continue
		}
		if again := s.compensate(ctx, log, p, ch, reason); again > 0 && (retry == 0 || again < retry) {
			retry = again
		}
	}
	return retry
}

// compensate refunds whatever is left of the extra charge ch, under a key
// derived from the payment's charge key and ch's id, so that every sweep of
// this charge sends the same refund. It returns how soon to try again: 0
// when it is done.
func (s *Service) compensate(ctx context.Context, log *slog.Logger, p dbsqlc.Payment, ch processor.Charge, reason string) time.Duration {
	q := dbsqlc.New(s.pool)
	key := idem.DeriveChildKey(p.ChargeKey, "compensate:"+ch.ID)
	if err := q.CompensationCreate(ctx, dbsqlc.CompensationCreateParams{
		TenantID: p.TenantID, PaymentID: p.ID, ChargeID: ch.ID, Amount: ch.Amount, Reason: reason, RefundKey: key,
	}); err != nil {
		log.WarnContext(ctx, "sweep: record compensation; will retry", slog.Any("error", err))
		return sweepRetry
	}
	succeeded := func(refundID *string) time.Duration {
		n, err := q.CompensationMarkSucceeded(ctx, dbsqlc.CompensationMarkSucceededParams{
			TenantID: p.TenantID, PaymentID: p.ID, ChargeID: ch.ID, ProcessorRefundID: refundID,
		})
		if err != nil {
			log.WarnContext(ctx, "sweep: record compensation refund; will retry", slog.Any("error", err))
			return sweepRetry
		}
		if n == 0 {
			// It succeeded already: an earlier sweep recorded it.
			staleWritesTotal.WithLabelValues("compensation_succeeded").Inc()
		}
		return 0
	}
	// Refunding only what is left makes a second refund of the same charge
	// impossible at the processor, whether or not it deduplicates.
	left := ch.Amount - ch.RefundedAmount
	if left <= 0 {
		return succeeded(nil)
	}
	re, err := s.proc.Refund(ctx, processor.RefundRequest{Charge: ch.ID, Amount: left}, key)
	var rejected *processor.RequestError
	switch {
	case err == nil:
		compensationsTotal.WithLabelValues(reason).Inc()
		log.WarnContext(ctx, "sweep: refunded an extra charge",
			slog.String("charge_id", ch.ID), slog.Int64("amount", left), slog.String("reason", reason), slog.String("refund_id", re.ID))
		return succeeded(&re.ID)
	case errors.As(err, &rejected) && rejected.Code == processor.CodeChargeAlreadyRefunded:
		return succeeded(nil)
	case errors.As(err, &rejected):
		// Final for this try: recorded as refused (visible on the payment),
		// counted and alerted on, and tried again after refusedRetry, so a
		// refusal is never forgotten as "pending".
		compensationsRefusedTotal.Inc()
		log.ErrorContext(ctx, "sweep: the processor refused to refund an extra charge; recorded as refused, tried again later",
			slog.String("charge_id", ch.ID), slog.Int64("amount", left), slog.Duration("retry_in", refusedRetry), slog.Any("error", err))
		if _, err := q.CompensationMarkRefused(ctx, dbsqlc.CompensationMarkRefusedParams{
			TenantID: p.TenantID, PaymentID: p.ID, ChargeID: ch.ID, FailureMessage: nonEmpty(rejected.Code + ": " + rejected.Message),
		}); err != nil {
			log.WarnContext(ctx, "sweep: record refused compensation; will retry", slog.Any("error", err))
			return sweepRetry
		}
		return refusedRetry
	default:
		log.WarnContext(ctx, "sweep: refund an extra charge; will retry", slog.String("charge_id", ch.ID), slog.Any("error", err))
		return sweepRetry
	}
}

// sweepRefund compares what the processor refunded under the refund's key
// with what the refund recorded, and reports the difference.
func (s *Service) sweepRefund(ctx context.Context, r dbsqlc.RefundClaimSweepRow) time.Duration {
	log := s.log.With(slog.String("refund_id", r.ID.String()), slog.String("tenant_id", r.TenantID.String()))
	mine, err := refundsUnder(ctx, s.proc, r.ChargeID, r.RefundKey)
	if err != nil {
		log.WarnContext(ctx, "sweep: look up refunds; will retry", slog.Any("error", err))
		return sweepRetry
	}
	// Only refunds that went through moved money; a failed or canceled
	// one under the key is no duplicate.
	var landed int64
	for _, re := range mine {
		if re.Status == processor.StatusSucceeded {
			landed += re.Amount
		}
	}
	expected := int64(0)
	if r.Status == RefundStatusSucceeded {
		expected = r.Amount
	}
	duplicate := max(landed-expected, 0)
	if duplicate == r.DuplicateAmount {
		return 0
	}
	duplicateRefundsTotal.Inc()
	log.ErrorContext(ctx, "sweep: money was refunded more than once; it cannot be pulled back",
		slog.String("payment_id", r.PaymentID.String()), slog.Int64("asked", expected), slog.Int64("refunded", landed),
		slog.Int64("duplicate_amount", duplicate), slog.Int("refunds", len(mine)))
	if err := dbsqlc.New(s.pool).RefundFlagDuplicate(ctx, dbsqlc.RefundFlagDuplicateParams{TenantID: r.TenantID, ID: r.ID, DuplicateAmount: duplicate}); err != nil {
		log.WarnContext(ctx, "sweep: flag the duplicate refund; will retry", slog.Any("error", err))
		return sweepRetry
	}
	return 0
}
