package httpapi_test

import (
	"encoding/json"
	"net/http"
	"strings"
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

// S8: Stripe refusing our own configuration (a revoked secret key, a
// restricted key without the permission, a base URL Stripe has no
// endpoint at) is never a payment's or a refund's outcome. The client gets
// 503 processor_unavailable with Retry-After and nothing of Stripe's
// message; the payment is not failed and the key not completed. Once the
// configuration is fixed, the same client retry pays, and refunds,
// exactly once.
func TestStripeRefusingOurConfigurationFailsNothing(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		refusal stripefake.Answer
	}{
		{"RevokedKey", stripefake.Unauthorized},
		{"KeyWithoutPermission", stripefake.Forbidden},
		{"UnrecognizedURL", stripefake.UnrecognizedURL},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, withStripe())
			o := e.newOrder(t, e.a, "config")
			const payKey, refundKey = "pay-config", "refund-config"
			body := payBody(o.Id.String(), stripefake.PaymentMethodVisa)

			e.stripe.Refuse(tt.refusal)
			e.wantRefusal(t, e.pay(t, e.a.Key, payKey, body))
			row := e.onePayment(t, o.Id.String())
			if row.Status != "charge_sent" || row.ChargeID != "" || row.DeclineCode != "" {
				t.Errorf("payment = %+v, want charge_sent: nothing happened to it", row)
			}
			e.wantKeyState(t, e.a.ID, endpointPayments, payKey, keyState{State: "in_progress", RecoveryPoint: "charge_sent", ResourceID: row.ID})

			e.stripe.Lift()
			retry := e.pay(t, e.a.Key, payKey, body)
			wantStatus(t, retry, http.StatusCreated)
			if p := decodePayment(t, retry); p.Id.String() != row.ID || p.Status != "succeeded" {
				t.Errorf("the retry answered %+v, want payment %s succeeded", p, row.ID)
			}
			intents := e.stripe.PaymentIntents()
			if len(intents) != 1 || intents[0].Metadata[stripeproc.MetadataKey] != chargeKey(e.a.ID, payKey) {
				t.Fatalf("PaymentIntents = %+v, want exactly one, under the payment's derived key", intents)
			}
			e.wantStripeCalls(t, "/v1/payment_intents", tt.refusal.Status, http.StatusOK)
			e.wantKeyState(t, e.a.ID, endpointPayments, payKey, completed(http.StatusCreated, row.ID))

			e.stripe.Refuse(tt.refusal)
			e.wantRefusal(t, e.refund(t, e.a.Key, refundKey, row.ID, refundBody(1000)))
			refunds := e.refundRows(t, row.ID)
			if len(refunds) != 1 || refunds[0].Status == "failed" || refunds[0].ProcessorRefundID != "" {
				t.Errorf("refunds = %+v, want one, not failed: nothing happened to it", refunds)
			}
			if len(refunds) == 1 {
				e.wantKeyState(t, e.a.ID, endpointRefunds, refundKey, keyState{State: "in_progress", RecoveryPoint: "refund_sent", ResourceID: refunds[0].ID})
			}

			e.stripe.Lift()
			wantStatus(t, e.refund(t, e.a.Key, refundKey, row.ID, refundBody(1000)), http.StatusCreated)
			if got := e.stripe.Refunds(); len(got) != 1 || got[0].Amount != 1000 || got[0].PaymentIntent != intents[0].ID {
				t.Errorf("refunds at Stripe = %+v, want one of 1000 on %s", got, intents[0].ID)
			}
			e.wantStripeCalls(t, "/v1/refunds", tt.refusal.Status, http.StatusOK)
		})
	}
}

// wantRefusal checks the answer to a request Stripe refused for our
// configuration: 503 processor_unavailable, Retry-After, and neither
// Stripe's message nor anything about our key.
func (e *bundle) wantRefusal(t *testing.T, res response) {
	t.Helper()
	wantProblem(t, res, http.StatusServiceUnavailable, "processor_unavailable")
	if res.header.Get("Retry-After") == "" {
		t.Error("no Retry-After")
	}
	wantRetryAfter(t, res)
	for _, leak := range []string{"API Key", "1234", "permission", "Unrecognized", "sk_", "rk_", "stripe"} {
		if strings.Contains(string(res.body), leak) {
			t.Errorf("the answer carries %q: %s", leak, res.body)
		}
	}
}

// wantStripeCalls checks the statuses of the POSTs to path the fake
// recorded, in order.
func (e *bundle) wantStripeCalls(t *testing.T, path string, statuses ...int) {
	t.Helper()
	var got []int
	for _, c := range e.stripe.Calls() {
		if c.Method == http.MethodPost && c.Path == path {
			got = append(got, c.Status)
		}
	}
	if diff := cmp.Diff(statuses, got); diff != "" {
		t.Errorf("POST %s calls at Stripe by status (-want +got):\n%s", path, diff)
	}
}

// A PaymentIntent that stops after its confirm at a state waiting for an
// action nobody here takes would keep its payment at charge_sent, polled
// forever. Through the API it is a decline: answered at once, or found by
// the retry's lookup after the answer was lost; either way the
// PaymentIntent is canceled, the payment declined and the key completed.
func TestStripePaymentIntentThatStopsIsDeclined(t *testing.T) {
	t.Parallel()
	e := setup(t, withStripe())

	t.Run("Answered", func(t *testing.T) {
		o := e.newOrder(t, e.a, "stops")
		e.stripe.StopNext("requires_action")
		res := e.pay(t, e.a.Key, "pay-stops", payBody(o.Id.String(), stripefake.PaymentMethodVisa))
		if p := wantProblem(t, res, http.StatusPaymentRequired, "card_declined"); p.DeclineCode == nil || *p.DeclineCode != "abandoned" {
			t.Errorf("decline_code = %v, want abandoned", p.DeclineCode)
		}
		e.wantStoppedAndDeclined(t, o.Id.String(), "pay-stops")
	})
	t.Run("FoundByTheLookup", func(t *testing.T) {
		o := e.newOrder(t, e.a, "stops-lost")
		body := payBody(o.Id.String(), stripefake.PaymentMethodVisa)
		e.stripe.StopNext("requires_capture")
		e.stripe.Queue("/v1/payment_intents", stripefake.After, stripefake.ServerError)
		wantProblem(t, e.pay(t, e.a.Key, "pay-stops-lost", body), http.StatusServiceUnavailable, "processor_outcome_unknown")
		e.passSettleWindow(t, e.a.ID, endpointPayments, "pay-stops-lost")
		wantProblem(t, e.pay(t, e.a.Key, "pay-stops-lost", body), http.StatusPaymentRequired, "card_declined")
		e.wantStoppedAndDeclined(t, o.Id.String(), "pay-stops-lost")
	})
}

// wantStoppedAndDeclined checks a payment whose PaymentIntent stopped:
// one PaymentIntent under its key, canceled; the payment declined with
// it; the key completed with the 402.
func (e *bundle) wantStoppedAndDeclined(t *testing.T, orderID, key string) {
	t.Helper()
	var mine []stripefake.PaymentIntent
	for _, pi := range e.stripe.PaymentIntents() {
		if pi.Metadata[stripeproc.MetadataKey] == chargeKey(e.a.ID, key) {
			mine = append(mine, pi)
		}
	}
	if len(mine) != 1 || mine[0].Status != "canceled" {
		t.Fatalf("PaymentIntents under the key: %+v, want one, canceled", mine)
	}
	row := e.onePayment(t, orderID)
	if row.Status != "declined" || row.ChargeID != mine[0].ID || row.DeclineCode != "abandoned" {
		t.Errorf("payment = %+v, want declined (abandoned) with %s", row, mine[0].ID)
	}
	e.wantKeyState(t, e.a.ID, endpointPayments, key, completed(http.StatusPaymentRequired, row.ID))
}
