package payments

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/inbox"
	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/webhook"
)

// Processor webhooks (M1, M4).
//
// The processor tells us about charges at least once, in any order. Each
// event's id (assigned by the processor, the same on every delivery) goes
// into the inbox in the transaction that applies the event, so a
// redelivery is skipped. The effects:
//
//   - charge.succeeded for a payment at charge_sent (a call marked, no
//     outcome recorded yet) confirms it: the payment succeeds with that charge and its
//     payment.succeeded event goes to the outbox. The key is left to the
//     attempt that holds it (or the completer): it finds the payment
//     settled and records the response without calling the processor.
//   - charge.succeeded for a charge the payment does not know (it
//     succeeded with another charge, or was declined or failed): a late
//     duplicate. The sweep is made due at once and refunds it, the same
//     compensation it makes for a duplicate it finds itself.
//   - charge.succeeded for the payment's own charge, charge.failed and
//     charge.refunded: recorded, no effect. Failures are left to the
//     lookup, which sees every charge under the key (S6), and refunds are
//     ours to begin with.
//
// Who wins a race. The webhook, the attempt's record of its charge (after
// the call or a lookup) and the sweep all take the payment's row lock, and
// only a payment not yet settled can be settled: whichever of webhook and
// attempt commits first settles the payment and writes its one event; the
// other finds it settled. An attempt that finds it settled makes the sweep
// due when its charge is another one, when its lookup found more than one
// succeeded charge, or when it saw none of the processor's charges itself
// (recordSettled): this webhook names one charge, and another one's may
// never come. The sweep only ever looks at settled payments, so it runs
// after both and refunds every succeeded charge but the recorded one. One
// charge is kept, one event written, whatever the order.

// Finding the tenant first (D8). Every payment is read by its tenant and
// charge key, so that on a database sharded by tenant a webhook's
// transaction is single-shard, as the request's own. The processor's event
// names no tenant of ours, so the charge carries it in its metadata
// (MetadataTenant, beside payment_id and order_id), which both adapters
// send with the charge and read back in its webhooks. A charge made before
// the metadata named the tenant (before migration 000022) is resolved by
// its key alone, one index probe per tenant (PaymentFindTenantByChargeKey):
// such webhooks stop once those charges are past the processor's retries.

// MetadataTenant is the charge metadata field naming the tenant whose
// payment made the charge.
const MetadataTenant = "tenant_id"

// chargeMetadata is what a payment's charge carries to the processor and
// back in its webhooks.
func chargeMetadata(p dbsqlc.Payment) map[string]string {
	return map[string]string{
		MetadataTenant: p.TenantID.String(),
		"payment_id":   p.ID.String(),
		"order_id":     p.OrderID.String(),
	}
}

// chargeTenant is the tenant of a charge a webhook names: its metadata's,
// else, for a charge made before the metadata carried it, the tenant with
// a payment under its key. ok is false for a charge that is not ours.
func chargeTenant(ctx context.Context, q *dbsqlc.Queries, ch processor.Charge) (tenant uuid.UUID, ok bool, err error) {
	if v, named := ch.Metadata[MetadataTenant]; named {
		tenant, err := uuid.Parse(v)
		return tenant, err == nil, nil
	}
	if ch.IdempotencyKey == "" {
		return uuid.Nil, false, nil
	}
	tenant, err = q.PaymentFindTenantByChargeKey(ctx, ch.IdempotencyKey)
	if errors.Is(err, pgx.ErrNoRows) {
		return uuid.Nil, false, nil
	}
	return tenant, err == nil, err
}

// Inbox names of processor webhooks.
const (
	webhookConsumer = "processor-webhooks"
	webhookSource   = "processor"
)

// WebhookResult says what an event did.
type WebhookResult string

// Webhook results.
const (
	// WebhookDuplicate: the event was processed before; nothing done.
	WebhookDuplicate WebhookResult = "duplicate"
	// WebhookConfirmed: the event confirmed an unsettled payment.
	WebhookConfirmed WebhookResult = "confirmed"
	// WebhookCompensating: the charge is unknown to its payment; the sweep
	// refunds it.
	WebhookCompensating WebhookResult = "compensating"
	// WebhookRecorded: recorded, no effect.
	WebhookRecorded WebhookResult = "recorded"
)

// HandleProcessorEvent applies a verified webhook event in one
// transaction with its inbox row. The caller answers 2xx only after it
// returned without error: the transaction has committed.
func (s *Service) HandleProcessorEvent(ctx context.Context, ev processor.Event) (WebhookResult, error) {
	result := WebhookRecorded
	err := db.WithTx(ctx, s.pool, func(ctx context.Context, tx pgx.Tx) error {
		result = WebhookRecorded
		// The tenant first: the inbox row goes under it, beside the
		// payment it changes (D8). The same event always resolves to the
		// same tenant (its charge's metadata, or the one payment under its
		// key), so a redelivery finds the row its first delivery wrote.
		ch := ev.Data.Object
		tenant, ours, err := chargeTenant(ctx, dbsqlc.New(tx), ch)
		if err != nil {
			return err
		}
		if !ours {
			tenant = inbox.NoTenant
		}
		fresh, err := inbox.Record(ctx, tx, tenant, webhookConsumer, webhookSource, ev.ID)
		if err != nil {
			return err
		}
		if !fresh {
			result = WebhookDuplicate
			return nil
		}
		if ev.Type != processor.EventChargeSucceeded || ch.Status != processor.StatusSucceeded {
			return nil
		}
		if !ours {
			// Not a charge of ours (or of a payment pruned long ago).
			s.log.WarnContext(ctx, "webhook: a charge no payment made", slog.String("charge_id", ch.ID))
			return nil
		}
		result, err = s.chargeSucceeded(ctx, tx, tenant, ch)
		return err
	})
	if err != nil {
		return "", err
	}
	webhookEventsTotal.WithLabelValues(webhookTypeLabel(ev.Type), string(result)).Inc()
	return result, nil
}

func (s *Service) chargeSucceeded(ctx context.Context, tx pgx.Tx, tenant uuid.UUID, ch processor.Charge) (WebhookResult, error) {
	q := dbsqlc.New(tx)
	cur, err := q.PaymentGetByChargeKeyForUpdate(ctx, dbsqlc.PaymentGetByChargeKeyForUpdateParams{TenantID: tenant, ChargeKey: ch.IdempotencyKey})
	if errors.Is(err, pgx.ErrNoRows) {
		// Not a charge of ours (or of a payment pruned long ago).
		s.log.WarnContext(ctx, "webhook: a charge no payment made", slog.String("charge_id", ch.ID))
		return WebhookRecorded, nil
	}
	if err != nil {
		return "", err
	}
	switch {
	case cur.Status == StatusChargeSent:
		p, err := q.PaymentFinish(ctx, dbsqlc.PaymentFinishParams{
			TenantID: cur.TenantID, ID: cur.ID, Status: StatusSucceeded, ChargeID: &ch.ID,
			SweepDelaySeconds: s.sweepDelay().Seconds(),
		})
		if err != nil {
			return "", err
		}
		return WebhookConfirmed, writePaymentEvent(ctx, tx, p)
	case cur.Status == StatusSucceeded && cur.ChargeID != nil && *cur.ChargeID == ch.ID:
		return WebhookRecorded, nil
	default:
		s.log.WarnContext(ctx, "webhook: a charge the payment does not know; the sweep refunds it",
			slog.String("payment_id", cur.ID.String()), slog.String("charge_id", ch.ID), slog.String("payment_status", cur.Status))
		n, err := q.PaymentSweepNow(ctx, dbsqlc.PaymentSweepNowParams{TenantID: cur.TenantID, ID: cur.ID})
		if err == nil && n == 0 {
			// Every unsettled state was handled above, under the row lock:
			// the guard cannot refuse. If it did, the event would be marked
			// processed with its charge never refunded: roll back instead,
			// and the processor delivers it again.
			err = fmt.Errorf("payments: payment %s (%s): the sweep could not be made due", cur.ID, cur.Status)
		}
		return WebhookCompensating, err
	}
}

// VerifyProcessorEvent checks a webhook delivery's signature over its raw
// bytes with v and reads its event, through the processor's adapter (its
// signature header and event shape are the processor's): see
// processor.Processor.VerifyWebhook.
func (s *Service) VerifyProcessorEvent(payload []byte, h http.Header, v webhook.Verifier) (processor.Event, error) {
	return s.proc.VerifyWebhook(payload, h, v)
}
