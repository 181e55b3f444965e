package payments_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/processorsim"
)

// lostCharge leaves p at charge_sent with its charge made at the processor
// and the answer lost, and returns that charge as the processor holds it.
func (w *bundle) lostCharge(t *testing.T, p payment) processor.Charge {
	t.Helper()
	w.abandon(t, deadline(t), p, processorsim.FaultLostResponse)
	charges := w.chargesWithKey(p.chargeKey())
	if len(charges) != 1 {
		t.Fatalf("charges under the payment's key = %d, want 1", len(charges))
	}
	return charges[0]
}

// handle delivers a charge.succeeded event about ch under id and returns
// what it did.
func (w *bundle) handle(t *testing.T, id string, ch processor.Charge) payments.WebhookResult {
	t.Helper()
	ev := processor.Event{ID: id, Object: "event", Type: processor.EventChargeSucceeded, Created: time.Now().Unix()}
	ev.Data.Object = ch
	res, err := w.svc.HandleProcessorEvent(context.Background(), ev)
	if err != nil {
		t.Fatalf("webhook %s: %v", id, err)
	}
	return res
}

// wantConfirmedBy checks the rows a webhook's confirmation leaves: the
// payment succeeded with ch, one payment.succeeded event, one inbox row.
func (w *bundle) wantConfirmedBy(t *testing.T, p payment, ch processor.Charge, eventID string) {
	t.Helper()
	if got := w.onePayment(t, p); got.Status != payments.StatusSucceeded || got.ChargeID != ch.ID {
		t.Errorf("payment = %s with charge %q, want succeeded with %s", got.Status, got.ChargeID, ch.ID)
	}
	if got := w.orderOf(t, p); got != (orderEvents{Succeeded: 1, Amount: p.in.Amount}) {
		t.Errorf("events of the order = %+v, want one payment.succeeded", got)
	}
	var inbox int
	if err := w.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM processed_messages WHERE consumer = 'processor-webhooks' AND message_id = $1`, eventID).Scan(&inbox); err != nil || inbox != 1 {
		t.Errorf("inbox rows of %s = %d (%v), want 1", eventID, inbox, err)
	}
}

// D8: a charge carries its payment's tenant in its metadata, and the
// webhook reads the payment by that tenant and the charge's key: a
// metadata naming another tenant finds nothing there and changes nothing;
// the charge as the processor holds it confirms the payment.
func TestWebhookFindsThePaymentByTheTenantInTheChargeMetadata(t *testing.T) {
	t.Parallel()
	w := setup(t, shortLease, shortTimeout)
	p := w.newPayment(t, "pay-tenant-metadata", 1800)
	ch := w.lostCharge(t, p)
	if got := ch.Metadata[payments.MetadataTenant]; got != w.tenant.String() {
		t.Fatalf("charge metadata %s = %q, want the payment's tenant %s", payments.MetadataTenant, got, w.tenant)
	}

	other, _, err := tenants.Create(t.Context(), w.pool, "tenant "+uuid.NewString())
	if err != nil {
		t.Fatal(err)
	}
	elsewhere := ch
	elsewhere.Metadata = map[string]string{payments.MetadataTenant: other.String()}
	if res := w.handle(t, "evt_elsewhere", elsewhere); res != payments.WebhookRecorded {
		t.Errorf("a charge named under another tenant = %s, want %s", res, payments.WebhookRecorded)
	}
	w.wantPaymentStatus(t, p, payments.StatusChargeSent)

	if res := w.handle(t, "evt_"+ch.ID, ch); res != payments.WebhookConfirmed {
		t.Errorf("the charge's webhook = %s, want %s", res, payments.WebhookConfirmed)
	}
	w.wantConfirmedBy(t, p, ch, "evt_"+ch.ID)
}

// D8, the upgrade path: a charge made before its metadata named the tenant
// (before migration 000022) is found by its key alone, and confirms its
// payment as before.
func TestWebhookFindsAChargeMadeBeforeItsMetadataNamedTheTenant(t *testing.T) {
	t.Parallel()
	w := setup(t, shortLease, shortTimeout)
	// A second tenant, so the lookup by key has more than one to try.
	if _, _, err := tenants.Create(t.Context(), w.pool, "tenant "+uuid.NewString()); err != nil {
		t.Fatal(err)
	}
	p := w.newPayment(t, "pay-tenant-legacy", 1900)
	ch := w.lostCharge(t, p)
	legacy := ch
	legacy.Metadata = map[string]string{}
	for k, v := range ch.Metadata {
		if k != payments.MetadataTenant {
			legacy.Metadata[k] = v
		}
	}

	if res := w.handle(t, "evt_"+ch.ID, legacy); res != payments.WebhookConfirmed {
		t.Errorf("the legacy charge's webhook = %s, want %s", res, payments.WebhookConfirmed)
	}
	w.wantConfirmedBy(t, p, ch, "evt_"+ch.ID)

	// A charge under a key no payment has is not ours: recorded, no effect.
	stray := legacy
	stray.ID, stray.IdempotencyKey = "ch_stray", "not-a-key-of-ours"
	if res := w.handle(t, "evt_stray", stray); res != payments.WebhookRecorded {
		t.Errorf("a stray charge = %s, want %s", res, payments.WebhookRecorded)
	}
}
