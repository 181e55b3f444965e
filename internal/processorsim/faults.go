package processorsim

import (
	"context"
	"net/http"
	"time"
)

// FaultKind names a fault. Its values are the strings the /_sim/faults
// endpoint accepts and Call.Fault reports.
type FaultKind string

// The faults a call can take.
const (
	// FaultTimeout never answers: the call holds until the client gives up
	// (or timeoutFaultCap passes) and then the connection is closed.
	// Nothing is executed.
	FaultTimeout FaultKind = "timeout"
	// FaultServerError answers 500 api_error without executing.
	FaultServerError FaultKind = "server_error"
	// FaultLostResponse executes the call and stores its response as
	// usual, then closes the connection without sending it: the charge
	// exists but the client cannot know.
	FaultLostResponse FaultKind = "lost_response"
	// FaultLatency waits Fault.Latency, then proceeds normally.
	FaultLatency FaultKind = "latency"
)

// Fault is a one-shot fault for the next POST to Path ("/v1/charges" or
// "/v1/refunds"). A fault queued for any other path is never taken.
type Fault struct {
	Path    string
	Kind    FaultKind
	Latency time.Duration // for FaultLatency
}

// Paths that take faults.
const (
	PathCharges = "/v1/charges"
	PathRefunds = "/v1/refunds"
)

// timeoutFaultCap bounds how long a timeout fault holds a call whose
// client never gives up, so a forgotten fault cannot pin a goroutine
// forever.
const timeoutFaultCap = time.Minute

func validFault(f Fault) bool {
	switch f.Kind {
	case FaultTimeout, FaultServerError, FaultLostResponse, FaultLatency:
	default:
		return false
	}
	return (f.Path == PathCharges || f.Path == PathRefunds) && f.Latency >= 0
}

// sleep waits d and reports whether it did; it gives up early, returning
// false, when ctx is done (the client left or the server is shutting down).
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
