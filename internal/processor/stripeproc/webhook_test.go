package stripeproc_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/processor/stripeproc"
	"github.com/idemref/payments/internal/webhook"
)

// Stripe's event types map onto the payment machine's, each naming the
// PaymentIntent (the charge the payment knows) and the key from its
// metadata; any other type, Stripe's own charge.succeeded among them, gets
// a type of its own that nothing acts on.
func TestStripeEventsMapOntoThePaymentMachine(t *testing.T) {
	t.Parallel()
	const secret = "whsec_map"
	a := stripeproc.New(stripeproc.Config{APIKey: testKey})
	v := webhook.Verifier{Secrets: []string{secret}}
	intent := func(status string) map[string]any {
		return map[string]any{"id": "pi_9", "object": "payment_intent", "amount": 900, "currency": "eur", "status": status,
			"metadata": map[string]string{stripeproc.MetadataKey: "key-9"}, "created": 1700000000,
			"last_payment_error": map[string]any{"type": "card_error", "code": "card_declined", "decline_code": "insufficient_funds"}}
	}
	tests := []struct {
		typ        string
		object     map[string]any
		wantType   string
		wantStatus string
		wantID     string
	}{
		{stripeproc.EventPaymentIntentSucceeded, intent("succeeded"), processor.EventChargeSucceeded, processor.StatusSucceeded, "pi_9"},
		{stripeproc.EventPaymentIntentFailed, intent("requires_payment_method"), processor.EventChargeFailed, processor.StatusFailed, "pi_9"},
		{stripeproc.EventPaymentIntentCanceled, intent("canceled"), processor.EventChargeFailed, processor.StatusFailed, "pi_9"},
		{stripeproc.EventChargeRefunded, map[string]any{"id": "ch_9", "object": "charge", "amount": 900, "amount_refunded": 900, "payment_intent": "pi_9",
			"metadata": map[string]string{stripeproc.MetadataKey: "key-9"}}, processor.EventChargeRefunded, processor.StatusSucceeded, "pi_9"},
		{"charge.succeeded", map[string]any{"id": "ch_9", "object": "charge", "payment_intent": "pi_9"}, "stripe:charge.succeeded", "", ""},
		{"customer.created", map[string]any{"id": "cus_9", "object": "customer"}, "stripe:customer.created", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.typ, func(t *testing.T) {
			t.Parallel()
			payload, h := stripeEvent(t, "evt_"+tt.typ, tt.typ, tt.object, secret)
			ev, err := a.VerifyWebhook(payload, h, v)
			if err != nil {
				t.Fatal(err)
			}
			got := ev.Data.Object
			if ev.ID != "evt_"+tt.typ || ev.Type != tt.wantType || got.Status != tt.wantStatus || got.ID != tt.wantID {
				t.Errorf("event = %s %s, object %s %s; want %s, object %s %s", ev.ID, ev.Type, got.ID, got.Status, tt.wantType, tt.wantID, tt.wantStatus)
			}
			if tt.wantID != "" && got.IdempotencyKey != "key-9" {
				t.Errorf("key = %q, want key-9 from the metadata", got.IdempotencyKey)
			}
		})
	}

	t.Run("AStaleSignatureIsRefused", func(t *testing.T) {
		t.Parallel()
		payload, _ := stripeEvent(t, "evt_old", stripeproc.EventPaymentIntentSucceeded, intent("succeeded"), secret)
		h := http.Header{stripeproc.SignatureHeader: {webhook.Sign(payload, time.Now().Add(-time.Hour), secret)}}
		if _, err := a.VerifyWebhook(payload, h, v); !errors.Is(err, webhook.ErrStale) {
			t.Errorf("err = %v, want webhook.ErrStale", err)
		}
	})
	t.Run("TheSimulatorsHeaderIsNotStripes", func(t *testing.T) {
		t.Parallel()
		payload, _ := stripeEvent(t, "evt_hdr", stripeproc.EventPaymentIntentSucceeded, intent("succeeded"), secret)
		h := http.Header{webhook.Header: {webhook.Sign(payload, time.Now(), secret)}}
		if _, err := a.VerifyWebhook(payload, h, v); !errors.Is(err, webhook.ErrMissing) {
			t.Errorf("err = %v, want webhook.ErrMissing", err)
		}
	})
	t.Run("ASignedBodyThatIsNoEventIsABadEvent", func(t *testing.T) {
		t.Parallel()
		payload := []byte(`{"object":"event"}`)
		h := http.Header{stripeproc.SignatureHeader: {webhook.Sign(payload, time.Now(), secret)}}
		if _, err := a.VerifyWebhook(payload, h, v); !errors.Is(err, processor.ErrBadEvent) {
			t.Errorf("err = %v, want processor.ErrBadEvent", err)
		}
	})
}
