package processor

// The domain types of the Processor interface. Their JSON form is also the
// simulator's wire format (internal/processor/simproc), which the
// simulator serves.

// Charge statuses. A declined card still creates a charge, with
// StatusFailed, so the attempt stays visible in the processor's records.
const (
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed"
)

// Refund statuses beside StatusSucceeded and StatusFailed, as at Stripe: a
// pending refund may still succeed or fail, a canceled one did not happen.
const (
	StatusPending  = "pending"
	StatusCanceled = "canceled"
)

// ChargeRequest is the body of POST /v1/charges. Amount is in minor units
// of Currency (an ISO 4217 code).
type ChargeRequest struct {
	Amount        int64             `json:"amount"`
	Currency      string            `json:"currency"`
	PaymentMethod string            `json:"payment_method"`
	Metadata      map[string]string `json:"metadata,omitempty"`
}

// Charge is a charge as the processor reports it. IdempotencyKey is the key
// of the call that created it, which is how a caller that lost a response
// finds out whether its charge exists.
type Charge struct {
	ID             string            `json:"id"`
	Object         string            `json:"object"`
	Amount         int64             `json:"amount"`
	Currency       string            `json:"currency"`
	PaymentMethod  string            `json:"payment_method"`
	Status         string            `json:"status"`
	Metadata       map[string]string `json:"metadata"`
	IdempotencyKey string            `json:"idempotency_key"`
	RefundedAmount int64             `json:"refunded_amount"`
	// DeclineCode says why a failed charge was declined (like Stripe's
	// outcome.reason), so a caller that finds the charge by looking it up
	// learns what a caller that got the 402 learned.
	DeclineCode string `json:"decline_code,omitempty"`
	Created     int64  `json:"created"`
}

// RefundRequest is the body of POST /v1/refunds. A zero Amount refunds
// whatever remains refundable on the charge.
type RefundRequest struct {
	Charge string `json:"charge"`
	Amount int64  `json:"amount,omitempty"`
}

// Refund is a refund as the processor reports it.
type Refund struct {
	ID             string `json:"id"`
	Object         string `json:"object"`
	Charge         string `json:"charge"`
	Amount         int64  `json:"amount"`
	Status         string `json:"status"`
	IdempotencyKey string `json:"idempotency_key"`
	Created        int64  `json:"created"`
}

// Error codes of a DeclineError or RequestError that adapter-neutral code
// branches on: the payment machine, and the shared classification
// (Misconfigured). They are Stripe's, which the simulator speaks too.
const (
	CodeCardDeclined          = "card_declined"
	CodeResourceMissing       = "resource_missing"
	CodeChargeAlreadyRefunded = "charge_already_refunded"
)

// Webhook event types the processor sends.
const (
	EventChargeSucceeded = "charge.succeeded"
	EventChargeFailed    = "charge.failed"
	EventChargeRefunded  = "charge.refunded"
)

// Event is a webhook delivery's body, shaped like a Stripe event. ID is
// assigned by the processor once per event and is the same on every
// delivery attempt of it: the id a receiver deduplicates on.
type Event struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Type    string `json:"type"`
	Created int64  `json:"created"`
	Data    struct {
		// Object is the charge (charge.*), as it was when the event
		// happened.
		Object Charge `json:"object"`
	} `json:"data"`
}
