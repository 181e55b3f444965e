package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idemref/payments/client/api"
)

// Error is an answer that is not a success: the server's problem document
// (RFC 9457), with its status. For a create, a recorded failure (a 400
// validation_failed, a 409 order_reference_exists, a 402 card_declined, ...)
// is final for its key: retrying replays it, with Replayed set.
type Error struct {
	Status   int
	Problem  api.Problem
	Key      string // the operation's Idempotency-Key; "" for reads
	Replayed bool   // the server replayed a recorded answer
	Attempts int
	Header   http.Header
}

func (e *Error) Error() string {
	return fmt.Sprintf("payments API: %d %s: %s", e.Status, e.Problem.Code, e.Problem.Title)
}

// Code is the problem's stable machine-readable code, such as
// "order_reference_exists".
func (e *Error) Code() string { return string(e.Problem.Code) }

// HasCode reports whether err is (or wraps) an *Error with the given code.
func HasCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code() == code
}

// ErrOutcomeUnknown is matched by every *OutcomeUnknownError.
var ErrOutcomeUnknown = errors.New("outcome unknown")

// OutcomeUnknownError says that the client stopped retrying without a final
// answer: an attempt may have been executed (a connection cut after the
// server committed looks the same as one cut before). Nothing is lost: the
// operation is resolved with the same key, either by Client.Resolve (what
// the server recorded under it) or by sending the same request again with
// Key, later, which replays the result if there is one and runs it if there
// is none.
type OutcomeUnknownError struct {
	Key      string // the Idempotency-Key every attempt carried
	Endpoint string // the route template the key is scoped to, such as "POST /v1/orders"
	Attempts int
	// LastSent is when the last attempt was sent. The server may still be
	// running it: Resolve takes no record of the key for final only once
	// the server's commit window has passed since then. Keep it with the
	// key if the operation is resumed by another process; zero counts as
	// "just now".
	LastSent time.Time
	// Last is why the client stopped (attempts, budget, deadline) joined
	// with the last attempt's error or *Error.
	Last error
}

func (e *OutcomeUnknownError) Error() string {
	return fmt.Sprintf("payments API: outcome unknown after %d attempts of %s with Idempotency-Key %q: %v", e.Attempts, e.Endpoint, e.Key, e.Last)
}

// Unwrap matches ErrOutcomeUnknown and the causes, such as
// context.DeadlineExceeded.
func (e *OutcomeUnknownError) Unwrap() []error { return []error{ErrOutcomeUnknown, e.Last} }

// ErrKeyNotYetRecorded is matched by every *NotRecordedError.
var ErrKeyNotYetRecorded = errors.New("no record of this Idempotency-Key yet")

// NotRecordedError says that the server has no record of a key, but a
// request under it may still be running: the server records a key when its
// request commits, and a request can commit until Window after it was
// sent. It is not "never ran". Either ask again once FinalAt has passed
// (Resolve does, when its context allows), or send the same request again
// with the same key, which is safe: at most one attempt commits, and the
// others get its answer.
type NotRecordedError struct {
	Key      string
	Endpoint string
	// Window is the server's commit window (the problem's
	// commit_window_seconds): how long after it was sent a request can
	// still commit.
	Window time.Duration
	// FinalAt is when no record becomes final: Window after the key's last
	// request was sent. Zero from KeyStatus, which does not know when that
	// was.
	FinalAt time.Time
}

func (e *NotRecordedError) Error() string {
	when := fmt.Sprintf("once %v has passed since the key's last request was sent", e.Window)
	if !e.FinalAt.IsZero() {
		when = "at " + e.FinalAt.Format(time.RFC3339)
	}
	return fmt.Sprintf("payments API: no record of Idempotency-Key %q on %s yet: a request under it may still be running, and no record is final %s; ask again then, or send the same request again with the same key (at most one attempt commits)",
		e.Key, e.Endpoint, when)
}

// Is makes errors.Is(err, ErrKeyNotYetRecorded) hold.
func (e *NotRecordedError) Is(target error) bool { return target == ErrKeyNotYetRecorded }

// decodeProblem reads a problem document; anything else (a proxy's HTML
// error page) becomes a problem with the status only.
func decodeProblem(a answer) api.Problem {
	var p api.Problem
	if strings.HasPrefix(a.header.Get("Content-Type"), "application/problem+json") && json.Unmarshal(a.body, &p) == nil && p.Status != 0 {
		return p
	}
	return api.Problem{Status: a.status, Title: http.StatusText(a.status)}
}
