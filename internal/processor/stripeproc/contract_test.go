package stripeproc_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/processor/stripeproc"
	"github.com/idemref/payments/internal/tooling/processorcontract"
	"github.com/idemref/payments/internal/tooling/stripefake"
	"github.com/idemref/payments/internal/webhook"
)

// testKey is a test-mode key; the recorded answers refuse any other.
const testKey = "sk_test_contract"

// The Stripe adapter passes the contract every adapter passes (S7),
// against Stripe's recorded answers, with a search that lags as Stripe's
// does: the contract's lookups wait out the adapter's LookupLag.
func TestStripeAdapterPassesTheContract(t *testing.T) {
	fake := stripefake.Start(t)
	fake.SetSearchLag(300 * time.Millisecond)
	const secret = "whsec_contract"
	adapter := stripeproc.New(stripeproc.Config{APIKey: testKey, URL: fake.URL, SearchLag: 500 * time.Millisecond})

	processorcontract.Run(t, processorcontract.Harness{
		Processor: adapter,
		Approved:  stripefake.PaymentMethodVisa,
		Declined:  stripefake.PaymentMethodDeclined,
		Fail: func(t *testing.T, f processorcontract.Fault, _ processor.ChargeRequest, _ string) {
			answer := map[processorcontract.Fault]stripefake.Answer{
				processorcontract.FaultRateLimited:  stripefake.RateLimited,
				processorcontract.FaultServerError:  stripefake.ServerError,
				processorcontract.FaultKeyInUse:     stripefake.KeyInUse,
				processorcontract.FaultUnauthorized: stripefake.Unauthorized,
			}[f]
			fake.Queue("/v1/payment_intents", stripefake.Before, answer)
		},
		Deliver: func(t *testing.T, ch processor.Charge) ([]byte, http.Header) {
			return stripeEvent(t, "evt_contract_"+ch.ID, stripeproc.EventPaymentIntentSucceeded, map[string]any{
				"id": ch.ID, "object": "payment_intent", "amount": ch.Amount, "currency": "eur", "status": "succeeded",
				"metadata": map[string]string{stripeproc.MetadataKey: ch.IdempotencyKey}, "created": ch.Created,
			}, secret)
		},
		Verifier: webhook.Verifier{Secrets: []string{secret}},
	})
}

// stripeEvent is a Stripe event of typ about object, signed as Stripe
// signs (Stripe-Signature, t=,v1=) with secret.
func stripeEvent(t *testing.T, id, typ string, object map[string]any, secret string) ([]byte, http.Header) {
	t.Helper()
	payload, err := json.Marshal(map[string]any{
		"id": id, "object": "event", "type": typ, "api_version": "2025-07-30.basil", "created": time.Now().Unix(),
		"data": map[string]any{"object": object}, "livemode": false, "pending_webhooks": 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	return payload, http.Header{stripeproc.SignatureHeader: {webhook.Sign(payload, time.Now(), secret)}}
}
