package httpapi_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/idemref/payments/internal/processor/stripeproc"
	"github.com/idemref/payments/internal/tooling/stripefake"
	"github.com/idemref/payments/internal/tooling/testkit"
	"github.com/idemref/payments/internal/webhook"
)

// Payments, refunds and webhooks through the HTTP API with the Stripe
// adapter against the Stripe fake (setup's withStripe): the rows written,
// the keys' state and the calls the fake recorded.

// deliverStripe posts a Stripe event to the webhook endpoint, signed as
// Stripe signs it (Stripe-Signature) with the server's secret.
func (e *bundle) deliverStripe(t *testing.T, id, typ string, object map[string]any) response {
	t.Helper()
	payload, err := json.Marshal(map[string]any{"id": id, "object": "event", "type": typ, "created": time.Now().Unix(),
		"api_version": "2025-03-31.basil", "livemode": false, "data": map[string]any{"object": object}})
	if err != nil {
		t.Fatal(err)
	}
	return e.do(t, http.MethodPost, "/v1/webhooks/processor", "", payload,
		withHeader(stripeproc.SignatureHeader, webhook.Sign(payload, time.Now(), webhookSecret)))
}

// moneyRows is every payment and refund row, whole, for a test that must
// see none of them change.
func (e *bundle) moneyRows(t *testing.T) []struct{ Row string } {
	t.Helper()
	return testkit.Rows[struct{ Row string }](t, e.pool,
		`SELECT 'payment ' || to_jsonb(p)::text FROM payments p
		 UNION ALL SELECT 'refund ' || to_jsonb(r)::text FROM refunds r ORDER BY 1`)
}

// A charge.refunded about a charge made without a PaymentIntent (a legacy
// charge on the same Stripe account) is none of ours: it is recorded in
// the inbox like any event and acknowledged, with no effect, so Stripe
// stops redelivering it; its redelivery is a duplicate.
func TestStripeChargeRefundedWithoutAPaymentIntentIsRecorded(t *testing.T) {
	t.Parallel()
	e := setup(t, withStripe())
	o := e.newOrder(t, e.a, "legacy")
	res := e.pay(t, e.a.Key, "pay-legacy", payBody(o.Id.String(), stripefake.PaymentMethodVisa))
	wantStatus(t, res, http.StatusCreated)
	p := decodePayment(t, res)
	wantStatus(t, e.refund(t, e.a.Key, "refund-legacy", p.Id.String(), refundBody(500)), http.StatusCreated)
	before := e.moneyRows(t)

	legacy := map[string]any{"id": "ch_legacy", "object": "charge", "amount": 1500, "amount_refunded": 1500,
		"currency": "eur", "payment_intent": nil, "refunded": true, "status": "succeeded", "metadata": map[string]any{},
		"created": time.Now().Add(-48 * time.Hour).Unix()}
	for i, want := range []string{"recorded", "duplicate"} {
		res := e.deliverStripe(t, "evt_legacy_refund", stripeproc.EventChargeRefunded, legacy)
		wantStatus(t, res, http.StatusOK)
		var got struct {
			Received bool   `json:"received"`
			EventID  string `json:"event_id"`
			Result   string `json:"result"`
		}
		decodeJSON(t, res, &got)
		if got.EventID != "evt_legacy_refund" || got.Result != want {
			t.Errorf("delivery %d: %+v, want event evt_legacy_refund %s", i+1, got, want)
		}
	}
	if n := e.count(t, `SELECT count(*) FROM processed_messages WHERE message_id = 'evt_legacy_refund'`); n != 1 {
		t.Errorf("processed_messages rows for the event: %d, want 1", n)
	}
	if diff := cmp.Diff(before, e.moneyRows(t)); diff != "" {
		t.Errorf("payments and refunds changed (-before +after):\n%s", diff)
	}
}
