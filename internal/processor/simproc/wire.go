package simproc

import (
	"errors"
	"fmt"

	"github.com/idemref/payments/internal/processor"
)

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

// Error types and codes the simulator sends, beside the ones of the
// processor package (CodeCardDeclined, ...).
const (
	ErrorTypeInvalidRequest = "invalid_request_error"
	ErrorTypeCard           = "card_error"
	ErrorTypeIdempotency    = "idempotency_error"
	ErrorTypeAPI            = "api_error"
	ErrorTypeRateLimit      = "rate_limit_error"

	CodeAmountTooLarge      = "amount_too_large"
	CodeChargeNotRefundable = "charge_not_refundable"
	CodeParameterMissing    = "parameter_missing"
	CodeParameterInvalid    = "parameter_invalid"
	// CodeIdempotencyKeyInUse comes with 409: another call with the same
	// key is still executing. This call did nothing; that one may still
	// succeed.
	CodeIdempotencyKeyInUse = "idempotency_key_in_use"
	// CodeIdempotencyKeyReused comes with 400 idempotency_error: the key
	// was first used with other parameters.
	CodeIdempotencyKeyReused = "idempotency_key_reused"
	CodeRateLimited          = "rate_limited"
)

// complete reports what a 2xx answer out (a *Charge, a *Refund, a *List
// of them) lacks for a caller to act on it: an answer that parses but
// names no charge, or no outcome, says nothing about the money, and
// must not be taken as final.
func complete(out any) error {
	switch v := out.(type) {
	case *processor.Charge:
		return chargeComplete(*v)
	case *processor.Refund:
		return refundComplete(*v)
	case completer:
		return v.complete()
	}
	return nil
}

// chargeComplete is complete for a charge.
func chargeComplete(ch processor.Charge) error {
	switch {
	case ch.ID == "":
		return errors.New("the charge has no id")
	case ch.Status != processor.StatusSucceeded && ch.Status != processor.StatusFailed:
		return fmt.Errorf("the charge %s has no final status (%q)", ch.ID, ch.Status)
	case ch.Amount <= 0:
		return fmt.Errorf("the charge %s has no amount", ch.ID)
	}
	return nil
}

// refundComplete is complete for a refund.
func refundComplete(re processor.Refund) error {
	switch {
	case re.ID == "":
		return errors.New("the refund has no id")
	case re.Status != processor.StatusSucceeded && re.Status != processor.StatusFailed && re.Status != processor.StatusPending && re.Status != processor.StatusCanceled:
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
	for i := range l.Data {
		if err := complete(&l.Data[i]); err != nil {
			return err
		}
	}
	return nil
}

// completer is a 2xx answer that can tell whether it says enough.
type completer interface{ complete() error }
