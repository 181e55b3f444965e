package payments

import (
	"context"
	"log/slog"
	"time"
)

// Completer finishes payments and refunds whose client went away: it takes
// over keys whose lease expired at a recovery point short of finished and
// resumes them, using only what is in the database. The recorded response is
// the one the client would have got, so a late retry replays it.
//
// Any number of processes may run a Completer: the takeover skips rows
// another completer holds (FOR UPDATE SKIP LOCKED) and bumps the lease
// generation, which fences off any attempt still running elsewhere.
type Completer struct {
	svc      *Service
	interval time.Duration
	batch    int
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
		// A full batch finished: more may be waiting. Any failure waits for
		// the next tick instead, so a processor outage is not hammered.
		for c.RunOnce(ctx) == c.batch {
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// RunOnce finishes up to one batch of expired keys and returns how many it
// finished. It takes keys over one at a time, right before resuming each:
// a lease taken for a whole batch up front could run out while earlier keys
// are still being worked on, and another completer would take it over.
func (c *Completer) RunOnce(ctx context.Context) int {
	log := c.svc.log
	finished := 0
	for range c.batch {
		leases, err := c.svc.store.TakeOverExpired(ctx, []string{EndpointPay, EndpointRefund}, 1)
		if err != nil {
			if ctx.Err() == nil {
				log.WarnContext(ctx, "completer: take over expired keys", slog.Any("error", err))
			}
			return finished
		}
		if len(leases) == 0 {
			return finished
		}
		l := &leases[0]
		attrs := []any{slog.String("endpoint", l.Endpoint), slog.String("tenant_id", l.TenantID.String()), slog.String("resource_id", l.ResourceID.String())}
		res, err := c.svc.resume(ctx, l)
		if err != nil {
			// The key was released; waiting for the next tick is the backoff.
			log.WarnContext(ctx, "completer: resume failed; will retry", append(attrs, slog.Any("error", err))...)
			return finished
		}
		log.InfoContext(ctx, "completer: finished", append(attrs, slog.Int("status", res.Status))...)
		finished++
	}
	return finished
}
