package stripeproc

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/stripe/stripe-go/v82"

	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/webhook"
)

// SignatureHeader carries Stripe's webhook signature (t=,v1=).
const SignatureHeader = "Stripe-Signature"

// Stripe's event types the payment machine reads, and what they become.
const (
	EventPaymentIntentSucceeded = "payment_intent.succeeded"
	EventPaymentIntentFailed    = "payment_intent.payment_failed"
	EventPaymentIntentCanceled  = "payment_intent.canceled"
	EventChargeRefunded         = "charge.refunded"
)

// eventTypes maps Stripe's event types onto the payment machine's.
var eventTypes = map[string]string{
	EventPaymentIntentSucceeded: processor.EventChargeSucceeded,
	EventPaymentIntentFailed:    processor.EventChargeFailed,
	EventPaymentIntentCanceled:  processor.EventChargeFailed,
	EventChargeRefunded:         processor.EventChargeRefunded,
}

// IgnoredPrefix starts the type of every Stripe event the machine does
// not read: recorded (its id deduplicated like any), with no effect.
const IgnoredPrefix = "stripe:"

// stripeEvent is the part of a Stripe event the adapter reads.
type stripeEvent struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Type    string `json:"type"`
	Created int64  `json:"created"`
	Data    struct {
		Object json.RawMessage `json:"object"`
	} `json:"data"`
}

// VerifyWebhook checks Stripe-Signature over the raw payload with v's
// secrets (Stripe's signing secrets, whsec_...), then maps the event: see
// the package documentation.
func (a *Adapter) VerifyWebhook(payload []byte, h http.Header, v webhook.Verifier) (processor.Event, error) {
	if err := v.Verify(payload, h, SignatureHeader, time.Now()); err != nil {
		return processor.Event{}, err
	}
	var se stripeEvent
	if err := json.Unmarshal(payload, &se); err != nil {
		return processor.Event{}, errorf("%v", err)
	}
	if se.ID == "" || se.Type == "" {
		return processor.Event{}, errorf("an event needs an id and a type")
	}
	ev := processor.Event{ID: se.ID, Object: "event", Created: se.Created}
	typ, ok := eventTypes[se.Type]
	if !ok {
		ev.Type = IgnoredPrefix + se.Type
		return ev, nil
	}
	ev.Type = typ
	switch se.Type {
	case EventChargeRefunded:
		var c stripe.Charge
		if err := json.Unmarshal(se.Data.Object, &c); err != nil {
			return processor.Event{}, errorf("%s: %v", se.Type, err)
		}
		if c.PaymentIntent == nil || c.PaymentIntent.ID == "" {
			// A charge made without a PaymentIntent (a legacy charge on the
			// same account) is none of ours, yet a well-formed event:
			// recorded with no effect, or Stripe redelivers it for days.
			ev.Type = IgnoredPrefix + se.Type
			return ev, nil
		}
		ev.Data.Object = processor.Charge{
			ID: c.PaymentIntent.ID, Object: "charge", Amount: c.Amount, Currency: string(c.Currency),
			Status: processor.StatusSucceeded, Metadata: c.Metadata, IdempotencyKey: c.Metadata[MetadataKey],
			RefundedAmount: c.AmountRefunded, Created: c.Created,
		}
	default:
		var pi stripe.PaymentIntent
		if err := json.Unmarshal(se.Data.Object, &pi); err != nil {
			return processor.Event{}, errorf("%s: %v", se.Type, err)
		}
		ch, err := chargeOf(&pi)
		if err != nil {
			return processor.Event{}, errorf("%s: %v", se.Type, err)
		}
		ev.Data.Object = ch
	}
	return ev, nil
}
