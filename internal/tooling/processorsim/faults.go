package processorsim

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/idemref/payments/internal/processor/simproc"
)

// FaultKind names a fault. Its values are the strings the /_sim/faults
// endpoint accepts and Call.Fault reports.
type FaultKind string

// The faults a call can take.
const (
	// FaultTimeout never answers: the call holds until the client gives up
	// (or MaxExecution passes) and then the connection is closed. Nothing
	// is executed and the key stays free.
	FaultTimeout FaultKind = "timeout"
	// FaultServerError answers 500 api_error without executing. It is
	// FaultStatus with status 500, kept under its own name.
	FaultServerError FaultKind = "server_error"
	// FaultStatus answers Fault.Status without executing and without
	// storing anything under the key: the answers a processor or a proxy
	// in front of it gives that are not outcomes: 408, 425, 429, 500,
	// 502, 503 or 504.
	FaultStatus FaultKind = "status"
	// FaultLostResponse executes the call and stores its response as
	// usual, then closes the connection without sending it: the charge
	// exists but the client cannot know.
	FaultLostResponse FaultKind = "lost_response"
	// FaultLatency accepts the call, holds it Fault.Latency with its key
	// in flight, then proceeds normally. If the client gives up meanwhile
	// the call is abandoned: nothing executes and the key is free again.
	FaultLatency FaultKind = "latency"
	// FaultLateExecution accepts the call and holds it Fault.Latency with
	// its key in flight whether or not the client is still there, then
	// executes it and stores the response, as a processor that keeps
	// working on a call whose client disconnected does. Only a client
	// still connected gets the response. Set Latency beyond the client's
	// timeout to have the charge land after its caller gave up.
	//
	// Neither holds a call its key answers at once (a replay, a 409): the
	// fault is used up on it all the same, as any fault is by its call.
	FaultLateExecution FaultKind = "late_execution"
)

// MaxExecution is the longest any call takes from arriving to executing:
// latency and late_execution faults longer than this are rejected, and a
// call still waiting (in the configured latency plus a fault's) when it
// passes is dropped without executing. Callers derive their settle window
// from it: no call lands later than MaxExecution after it arrived.
const MaxExecution = 30 * time.Second

// faultStatuses are the statuses FaultStatus can answer with. None of them
// is an outcome: 429 says the call was not executed, 401 and 403 refuse
// the caller's credentials (its own configuration: not executed either),
// the others leave it unknown to the caller.
var faultStatuses = []int{
	http.StatusUnauthorized,        // 401
	http.StatusForbidden,           // 403
	http.StatusRequestTimeout,      // 408
	http.StatusTooEarly,            // 425
	http.StatusTooManyRequests,     // 429
	http.StatusInternalServerError, // 500
	http.StatusBadGateway,          // 502
	http.StatusServiceUnavailable,  // 503
	http.StatusGatewayTimeout,      // 504
}

// defaultRetryAfter is what a 429 asks the client to wait when the fault
// names no delay.
const defaultRetryAfter = time.Second

// Fault is a one-shot fault for the next POST to Path ("/v1/charges" or
// "/v1/refunds").
type Fault struct {
	Path string
	Kind FaultKind
	// Latency is how long FaultLatency and FaultLateExecution hold the
	// call, at most MaxExecution.
	Latency time.Duration
	// Status is FaultStatus's answer: 408, 425, 429, 500, 502, 503 or 504.
	Status int
	// RetryAfter is the Retry-After of a FaultStatus 429, rounded up to
	// whole seconds; zero means one second.
	RetryAfter time.Duration
}

// Paths that take faults.
const (
	PathCharges = "/v1/charges"
	PathRefunds = "/v1/refunds"
)

// validFault reports whether f can be queued: a known kind for a path
// that takes faults, with only the parameters that kind uses, in range.
func validFault(f Fault) bool {
	if f.Path != PathCharges && f.Path != PathRefunds {
		return false
	}
	if f.Latency < 0 || f.Latency > MaxExecution || f.RetryAfter < 0 {
		return false
	}
	if f.RetryAfter != 0 && (f.Kind != FaultStatus || f.Status != http.StatusTooManyRequests) {
		return false
	}
	switch f.Kind {
	case FaultStatus:
		return slices.Contains(faultStatuses, f.Status)
	case FaultTimeout, FaultServerError, FaultLostResponse, FaultLatency, FaultLateExecution:
		// A status on another kind would be silently ignored; the caller
		// most likely meant a status fault.
		return f.Status == 0
	default:
		return false
	}
}

// holds reports whether kind holds an accepted call, key in flight, before
// it executes.
func holds(kind FaultKind) bool {
	return kind == FaultLatency || kind == FaultLateExecution
}

// faultOutcome is the answer of a server_error or status fault, given
// without executing.
func faultOutcome(f Fault) outcome {
	if f.Kind == FaultServerError {
		f.Status = http.StatusInternalServerError
	}
	if f.Status == http.StatusTooManyRequests {
		out := errorOutcome(f.Status, simproc.APIError{
			Type: simproc.ErrorTypeRateLimit, Code: simproc.CodeRateLimited,
			Message: "Too many requests hit the API too quickly (injected status 429 fault).",
		})
		out.retryAfter = f.RetryAfter
		if out.retryAfter == 0 {
			out.retryAfter = defaultRetryAfter
		}
		return out
	}
	if f.Status == http.StatusUnauthorized || f.Status == http.StatusForbidden {
		return errorOutcome(f.Status, simproc.APIError{
			Type: simproc.ErrorTypeInvalidRequest, Message: fmt.Sprintf("The API key was refused (injected status %d fault).", f.Status),
		})
	}
	injected := string(f.Kind)
	if f.Kind == FaultStatus {
		injected = "status " + strconv.Itoa(f.Status)
	}
	return errorOutcome(f.Status, simproc.APIError{
		Type: simproc.ErrorTypeAPI, Message: fmt.Sprintf("An unexpected error occurred (injected %s fault).", injected),
	})
}

// retryAfterSeconds is d as a Retry-After value: whole seconds, rounded up
// so the client never retries early, and at least 1.
func retryAfterSeconds(d time.Duration) string {
	return strconv.FormatInt(max(1, int64((d+time.Second-1)/time.Second)), 10)
}

// sleep waits d and reports whether it did; it gives up early, returning
// false, when ctx is done (the client left, the server is shutting down,
// or the call's MaxExecution passed).
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// dropConnection ends the call with no response at all, as a crashed
// processor or a broken network would.
func dropConnection(w http.ResponseWriter) {
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		conn.Close()
		return
	}
	// Connections that cannot be hijacked (HTTP/2) are reset by aborting
	// the handler, which also sends nothing.
	panic(http.ErrAbortHandler)
}
