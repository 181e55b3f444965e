package processor

import (
	"errors"
	"fmt"
)

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

// List is one page of a list endpoint, oldest item first, as at Stripe:
// at most `limit` items (default DefaultListLimit, at most MaxListLimit).
// HasMore says another page follows; ask for it with
// starting_after=<the id of this page's last item>.
type List[T any] struct {
	Object  string `json:"object"`
	Data    []T    `json:"data"`
	HasMore bool   `json:"has_more"`
}

// Page sizes of the list endpoints.
const (
	DefaultListLimit = 10
	MaxListLimit     = 100
)

// ErrorResponse is the body of every failed response.
type ErrorResponse struct {
	Error APIError `json:"error"`
}

// APIError describes a failure. Type is the broad class
// (invalid_request_error, card_error, idempotency_error, api_error); Code
// and DeclineCode are the machine-readable detail; Charge names the failed
// charge a decline created.
type APIError struct {
	Type        string `json:"type"`
	Code        string `json:"code,omitempty"`
	DeclineCode string `json:"decline_code,omitempty"`
	Message     string `json:"message"`
	Param       string `json:"param,omitempty"`
	Charge      string `json:"charge,omitempty"`
}

// Error types and codes the processor sends and callers branch on.
const (
	ErrorTypeInvalidRequest = "invalid_request_error"
	ErrorTypeCard           = "card_error"
	ErrorTypeIdempotency    = "idempotency_error"
	ErrorTypeAPI            = "api_error"
	ErrorTypeRateLimit      = "rate_limit_error"

	CodeCardDeclined          = "card_declined"
	CodeResourceMissing       = "resource_missing"
	CodeAmountTooLarge        = "amount_too_large"
	CodeChargeAlreadyRefunded = "charge_already_refunded"
	CodeChargeNotRefundable   = "charge_not_refundable"
	CodeParameterMissing      = "parameter_missing"
	CodeParameterInvalid      = "parameter_invalid"
	// CodeIdempotencyKeyInUse comes with 409: another call with the same
	// key is still executing. This call did nothing; that one may still
	// succeed.
	CodeIdempotencyKeyInUse = "idempotency_key_in_use"
	// CodeIdempotencyKeyReused comes with 400 idempotency_error: the key
	// was first used with other parameters.
	CodeIdempotencyKeyReused = "idempotency_key_reused"
	CodeRateLimited          = "rate_limited"
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

// complete reports what a charge from a 2xx answer lacks for a caller to
// act on it: an answer that parses but names no charge, or no outcome,
// says nothing about the money (S6), and must not be taken as final.
func (ch Charge) complete() error {
	switch {
	case ch.ID == "":
		return errors.New("the charge has no id")
	case ch.Status != StatusSucceeded && ch.Status != StatusFailed:
		return fmt.Errorf("the charge %s has no final status (%q)", ch.ID, ch.Status)
	case ch.Amount <= 0:
		return fmt.Errorf("the charge %s has no amount", ch.ID)
	}
	return nil
}

// complete is Charge.complete for refunds.
func (re Refund) complete() error {
	switch {
	case re.ID == "":
		return errors.New("the refund has no id")
	case re.Status != StatusSucceeded && re.Status != StatusFailed && re.Status != StatusPending && re.Status != StatusCanceled:
		return fmt.Errorf("the refund %s has an unknown status (%q)", re.ID, re.Status)
	case re.Amount <= 0:
		return fmt.Errorf("the refund %s has no amount", re.ID)
	}
	return nil
}

// complete checks that a page is one, and every item of it. An answer that
// parses but is no list ({}) must not read as an empty page: a lookup
// would take it for "nothing under this key" and, once the settle window
// passed, send again, a second charge or refund at a processor that
// ignores keys.
func (l List[T]) complete() error {
	if l.Object != "list" || l.Data == nil {
		return errors.New(`the answer is no list (want "object":"list" and "data")`)
	}
	for _, item := range l.Data {
		if c, ok := any(item).(completer); ok {
			if err := c.complete(); err != nil {
				return err
			}
		}
	}
	return nil
}

// completer is a 2xx answer that can tell whether it says enough.
type completer interface{ complete() error }
