package payments

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/tracing"
)

// Completer finishes payments and refunds whose client went away, and runs
// the reconciliation sweep. It takes over keys whose lease expired at a
// recovery point short of finished and resumes them, using only what is in
// the database. The recorded response is the one the client would have
// got, so a late retry replays it.
//
// Any number of processes may run a Completer: the takeover skips rows
// another completer holds (FOR UPDATE SKIP LOCKED) and bumps the lease
// generation, which fences off any attempt still running elsewhere; the
// sweep claims its rows the same way.
type Completer struct {
	svc      *Service
	interval time.Duration
	batch    int
}

// resumable names the endpoints whose expired keys the completer takes
// over: the multi-step ones of Endpoints, since only those leave a key at a
// recovery point short of finished.
var resumable = multiStepNames(Endpoints)

// multiStepNames returns the names of the multi-step endpoints among
// endpoints.
func multiStepNames(endpoints []idem.Endpoint) []string {
	var names []string
	for _, e := range endpoints {
		if e.MultiStep {
			names = append(names, e.String())
		}
	}
	return names
}

// NewCompleter returns a completer that polls every interval.
func NewCompleter(svc *Service, interval time.Duration) *Completer {
	return &Completer{svc: svc, interval: interval, batch: 20}
}

// Run polls until ctx is cancelled.
func (c *Completer) Run(ctx context.Context) {
	ticker := time.NewTicker(c.interval)
	defer ticker.Stop()
	for {
		// A full batch was handled: more may be waiting. Any failure waits
		// for the next tick instead, so a processor outage is not hammered.
		for c.RunOnce(ctx) == c.batch {
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// RunOnce handles up to one batch of expired keys, then one batch of the
// sweep, and returns how many keys it finished. It takes keys over one at a time, right before
// resuming each: a lease taken for a whole batch up front could run out
// while earlier keys are still being worked on, and another completer
// would take it over.
func (c *Completer) RunOnce(ctx context.Context) int {
	finished := c.resumeExpired(ctx)
	if _, err := c.svc.Sweep(ctx, c.batch); err != nil && ctx.Err() == nil {
		c.svc.log.WarnContext(ctx, "completer: sweep", slog.Any("error", err))
	}
	return finished
}

// resumeExpired takes over and resumes up to one batch of expired keys and
// returns how many it finished.
func (c *Completer) resumeExpired(ctx context.Context) int {
	log := c.svc.log
	finished := 0
	for range c.batch {
		leases, err := c.svc.store.TakeOverExpired(ctx, resumable, 1)
		if err != nil {
			if ctx.Err() == nil {
				completerFailuresTotal.Inc()
				log.WarnContext(ctx, "completer: take over expired keys", slog.Any("error", err))
			}
			return finished
		}
		if len(leases) == 0 {
			return finished
		}
		l := &leases[0]
		attrs := []any{slog.String("endpoint", l.Endpoint), slog.String("tenant_id", l.TenantID.String()), slog.String("resource_id", l.ResourceID.String())}
		// A trace of its own (tracing.go); a payment's is linked to the
		// trace that created it once its row is read (linkPayment).
		jobCtx, span := startJob(ctx, spanComplete, nil)
		if span.IsRecording() {
			tracing.Idempotency(span, l.Endpoint, l.Key)
		}
		res, err := c.svc.resume(jobCtx, l, nil)
		switch {
		case isWaitingToSettle(err):
			// The key is held until its next look: go on with the others.
			completerWaitingTotal.Inc()
			log.InfoContext(jobCtx, "completer: outcome not settled yet", append(attrs, slog.Any("error", err))...)
			endJob(span, "waiting", false)
			continue
		case err != nil:
			// The key was released; waiting for the next tick is the backoff.
			completerFailuresTotal.Inc()
			log.WarnContext(jobCtx, "completer: resume failed; will retry", append(attrs, slog.Any("error", err))...)
			endJob(span, "failed", true)
			return finished
		}
		log.InfoContext(jobCtx, "completer: finished", append(attrs, slog.Int("status", res.Status))...)
		endJob(span, "finished", false)
		completerFinishedTotal.Inc()
		finished++
	}
	return finished
}

// isWaitingToSettle reports whether err says only that an earlier call may
// still land: nothing is wrong with the processor.
func isWaitingToSettle(err error) bool { return errors.Is(err, errSettling) }
