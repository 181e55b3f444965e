package processor

import (
	"errors"
	"fmt"
)

// ErrTransient marks a call whose outcome is unknown or that the processor
// could not serve right now: a timeout, a connection error, a response lost
// after the request was sent, a 5xx or a 429. Match it with errors.Is; the
// underlying cause stays in the chain. The charge or refund may exist, so
// the only safe retry reuses the same idempotency key.
var ErrTransient = errors.New("processor: transient failure, outcome unknown")

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

// RequestError is any other 4xx: the request was wrong and nothing was
// executed, so repeating it is pointless. Type and Code come from the
// processor (for example invalid_request_error/amount_too_large, or
// idempotency_error when a key is reused with different parameters).
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

// transient wraps cause so that errors.Is(err, ErrTransient) holds and the
// cause (a net error, context.DeadlineExceeded, io.EOF) is still reachable.
func transient(op string, cause error) error {
	return fmt.Errorf("%w: %s: %w", ErrTransient, op, cause)
}
