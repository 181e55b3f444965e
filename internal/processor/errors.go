package processor

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Class is what one answer of the processor means for the operation.
// Every answer is classified once, by its adapter, and only
// ClassFinal answers may complete an idempotency key or mark a payment
// failed.
type Class int

const (
	// ClassFinal: the answer is the outcome (a charge, a decline, a
	// rejected request). Retrying gives the same answer.
	ClassFinal Class = iota + 1
	// ClassNotExecuted: this call did nothing (429, or no connection could
	// be made). Retrying later is safe, but a call sent before it may still
	// land.
	ClassNotExecuted
	// ClassOutcomeUnknown: the call may have executed, or may still execute
	// after we stopped waiting (a timeout, a lost response, a 5xx, 408,
	// 425), or another call with the same key is still running (409). The
	// operation is unsettled until a lookup finds it or the settle window
	// has passed.
	ClassOutcomeUnknown
)

func (c Class) String() string {
	switch c {
	case ClassFinal:
		return "final"
	case ClassNotExecuted:
		return "not_executed"
	case ClassOutcomeUnknown:
		return "outcome_unknown"
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// Sentinels for errors.Is on an *UnsettledError.
var (
	// ErrNotExecuted matches an UnsettledError of ClassNotExecuted.
	ErrNotExecuted = errors.New("processor: the call was not executed")
	// ErrOutcomeUnknown matches an UnsettledError of ClassOutcomeUnknown.
	ErrOutcomeUnknown = errors.New("processor: the outcome of the call is unknown")
	// ErrMisconfigured matches an UnsettledError whose answer refused our
	// own configuration rather than the request (S8): see Misconfigured.
	ErrMisconfigured = errors.New("processor: our configuration was refused (check the secret key and the URL)")
)

// UnsettledError is a call that got no final answer. The charge or refund
// it asked for may exist (ClassOutcomeUnknown) or certainly does not
// because of this call (ClassNotExecuted); either way the only safe resend
// reuses the same idempotency key.
type UnsettledError struct {
	Class Class
	// Op is the call, e.g. "POST /v1/charges".
	Op string
	// Status is the HTTP status received, 0 when none was.
	Status int
	// RetryAfter is the processor's Retry-After, 0 when it sent none.
	RetryAfter time.Duration
	// Err is the underlying cause: a net error, context.DeadlineExceeded,
	// the processor's message.
	Err error
}

// Error implements error.
func (e *UnsettledError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("processor: %s: %s (status %d): %v", e.Op, e.Class, e.Status, e.Err)
	}
	return fmt.Sprintf("processor: %s: %s: %v", e.Op, e.Class, e.Err)
}

// Unwrap exposes the cause.
func (e *UnsettledError) Unwrap() error { return e.Err }

// Is matches the sentinel of e's class.
func (e *UnsettledError) Is(target error) bool {
	return (target == ErrNotExecuted && e.Class == ClassNotExecuted) ||
		(target == ErrOutcomeUnknown && e.Class == ClassOutcomeUnknown)
}

// ClassOf returns the class of an error returned by an adapter's call: nil,
// *DeclineError and *RequestError are final; an *UnsettledError says its
// class. Any other error (the caller's own, such as a missing key) did not
// reach the processor and counts as not executed.
func ClassOf(err error) Class {
	var unsettled *UnsettledError
	var declined *DeclineError
	var rejected *RequestError
	switch {
	case err == nil, errors.As(err, &declined), errors.As(err, &rejected):
		return ClassFinal
	case errors.As(err, &unsettled):
		return unsettled.Class
	}
	return ClassNotExecuted
}

// Misconfigured reports whether an error answer refused our own
// configuration rather than the request (S8): a 401 (the secret key is
// wrong, rolled or revoked), a 403 (a key without the permission the call
// needs), or a 404 that names no missing object (anything but
// resource_missing: an unrecognized URL, a wrong base URL, a proxy's
// page). Each adapter's classification asks it about every 4xx. A 404
// resource_missing is about the charge the request names: its outcome.
func Misconfigured(status int, code string) bool {
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden:
		return true
	case http.StatusNotFound:
		return code != CodeResourceMissing
	}
	return false
}

// MisconfiguredError is the error of an answer Misconfigured: not
// executed (nothing ran, and a retry once the configuration is fixed
// executes), never a payment's outcome, and matching ErrMisconfigured. It
// keeps the status only: the processor's message may name our key, and no
// secret goes into an error or a log line.
func MisconfiguredError(op string, status int) *UnsettledError {
	return &UnsettledError{Class: ClassNotExecuted, Op: op, Status: status, Err: ErrMisconfigured}
}

// SendFailureClass classifies a call that got no HTTP answer. Only a
// failure to connect proves the request never left; a timeout, a reset or
// a closed connection after sending may hide an executed call.
func SendFailureClass(err error) Class {
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return ClassNotExecuted
	}
	return ClassOutcomeUnknown
}

// RetryAfterOf returns the Retry-After the processor sent with err, or 0.
func RetryAfterOf(err error) time.Duration {
	var unsettled *UnsettledError
	if errors.As(err, &unsettled) {
		return unsettled.RetryAfter
	}
	return 0
}

// DeclineError is a card decline (HTTP 402). It is final: the same request
// is declined again. ChargeID names the failed charge the processor
// recorded for the attempt.
type DeclineError struct {
	Code        string
	DeclineCode string
	Message     string
	ChargeID    string
}

// Error implements error.
func (e *DeclineError) Error() string {
	return fmt.Sprintf("processor: card declined (%s/%s): %s", e.Code, e.DeclineCode, e.Message)
}

// RequestError is a 4xx about the request itself (its parameters, the
// charge it names): nothing was executed and repeating it is pointless.
// Type and Code come from the processor (for example
// invalid_request_error/amount_too_large). A 4xx about the idempotency key
// is never a RequestError: see the table in each adapter's package
// documentation.
type RequestError struct {
	Status  int
	Type    string
	Code    string
	Message string
}

// Error implements error.
func (e *RequestError) Error() string {
	return fmt.Sprintf("processor: request rejected with %d (%s/%s): %s", e.Status, e.Type, e.Code, e.Message)
}
