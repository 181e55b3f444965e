package payments_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/processor/stripeproc"
	"github.com/idemref/payments/internal/tooling/stripefake"
	"github.com/idemref/payments/internal/webhook"
)

// Stripe's webhooks drive the payment machine (S7, M4): a payment whose
// charge answer was lost is confirmed by Stripe's
// payment_intent.succeeded, verified over Stripe-Signature and mapped onto
// charge.succeeded; Stripe's own charge.succeeded, which names a ch_
// object, is recorded and changes nothing; a redelivery is a duplicate.
func TestStripeWebhookConfirmsAPaymentWithAnUnknownOutcome(t *testing.T) {
	t.Parallel()
	w := setup(t, 2*time.Second, 500*time.Millisecond)
	fake := stripefake.Start(t)
	adapter := stripeproc.New(stripeproc.Config{APIKey: "sk_test_hooks", URL: fake.URL, Timeout: w.timeout, SearchLag: time.Minute})
	svc := payments.NewService(w.pool, idem.NewStore(w.pool, idem.Config{Lease: w.lease}), adapter, httpapi.Renderer{}, w.log,
		payments.Config{SettleWindow: w.settle})
	p := w.newPayment(t, "pay-hook", 1800)
	fake.Queue("/v1/payment_intents", stripefake.After, stripefake.ServerError)
	if _, _, err := svc.Pay(t.Context(), p.claim, p.in); !errors.Is(err, payments.ErrOutcomeUnknown) {
		t.Fatalf("Pay = %v, want ErrOutcomeUnknown", err)
	}
	pi := fake.PaymentIntents()[0]
	const secret = "whsec_stripe_hooks"
	verifier := webhook.Verifier{Secrets: []string{secret}}
	deliver := func(id, typ string, object map[string]any) payments.WebhookResult {
		t.Helper()
		payload, err := json.Marshal(map[string]any{"id": id, "object": "event", "type": typ, "created": time.Now().Unix(), "data": map[string]any{"object": object}})
		if err != nil {
			t.Fatal(err)
		}
		ev, err := svc.VerifyProcessorEvent(payload, http.Header{stripeproc.SignatureHeader: {webhook.Sign(payload, time.Now(), secret)}}, verifier)
		if err != nil {
			t.Fatalf("verify %s: %v", typ, err)
		}
		res, err := svc.HandleProcessorEvent(t.Context(), ev)
		if err != nil {
			t.Fatalf("handle %s: %v", typ, err)
		}
		return res
	}
	intent := map[string]any{"id": pi.ID, "object": "payment_intent", "amount": pi.Amount, "currency": pi.Currency,
		"status": "succeeded", "metadata": pi.Metadata, "created": pi.Created}

	if got := deliver("evt_charge", "charge.succeeded", map[string]any{"id": "ch_1", "object": "charge", "amount": pi.Amount,
		"status": "succeeded", "payment_intent": pi.ID, "metadata": pi.Metadata}); got != payments.WebhookRecorded {
		t.Errorf("Stripe's charge.succeeded: %s, want recorded (no effect)", got)
	}
	w.wantPaymentStatus(t, p, payments.StatusChargeSent)
	if got := deliver("evt_pi", stripeproc.EventPaymentIntentSucceeded, intent); got != payments.WebhookConfirmed {
		t.Fatalf("payment_intent.succeeded: %s, want confirmed", got)
	}
	if got := deliver("evt_pi", stripeproc.EventPaymentIntentSucceeded, intent); got != payments.WebhookDuplicate {
		t.Errorf("its redelivery: %s, want duplicate", got)
	}
	if row := w.onePayment(t, p); row.Status != payments.StatusSucceeded || row.ChargeID != pi.ID {
		t.Errorf("payment = %+v, want succeeded with %s", row, pi.ID)
	}
	if n := len(fake.PaymentIntents()); n != 1 {
		t.Errorf("Stripe has %d PaymentIntents, want 1", n)
	}
}
