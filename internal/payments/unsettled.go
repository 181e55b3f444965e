package payments

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/processor"
)

// Unknown outcomes (S6).
//
// A processor call without a final answer (a timeout, a lost response, a
// 5xx, a 409 for a same-key call still running) may have executed, or may
// still execute: processors keep working on a call whose caller gave up.
// So after one, nothing is final and nothing is sent again until the call
// can no longer land: a lookup finds it, or the settle window has passed
// since it was sent with nothing found. Against a processor that
// deduplicates, a resend with the derived key would be harmless; against
// one that ignores keys it is a second charge, and against either a
// resend answered 409 tells nothing. The window makes one rule safe for
// both.

// pollInterval bounds how long a key waits between two lookups while the
// settle window runs: the lease is held that long, so the completer moves
// on to other keys and a client retry meanwhile gets 409 with Retry-After.
const pollInterval = time.Second

// errSettling marks a step that waits for its settle window: nothing is
// wrong with the processor, an earlier call may just still land.
var errSettling = errors.New("waiting for the settle window")

// processorCall is one call of a step that must execute at most once: a
// charge, a refund.
type processorCall[T any] struct {
	// fresh: this attempt committed the mark for the call itself and has
	// not sent it; nothing else can be in flight.
	fresh bool
	// sentAt is when the latest earlier call that may still land was sent
	// (nil: none), and unsettled how much longer it may land.
	sentAt    *time.Time
	unsettled time.Duration

	// lookup asks the processor for what earlier calls did; nil when it
	// finds nothing.
	lookup func(ctx context.Context) (*T, error)
	// mark commits, fenced, that a call may be in flight from now on.
	mark func(ctx context.Context) error
	// unmark commits, fenced, that the call did not execute: the window
	// goes back to sentAt.
	unmark func(ctx context.Context, previous *time.Time) error
	// send makes the call. It returns the final outcome, or an error that
	// processor.ClassOf classifies.
	send func(ctx context.Context) (T, error)
}

// settle runs c so that at most one execution can result. It returns the
// final outcome or a *RetryError.
func settle[T any](ctx context.Context, log *slog.Logger, c processorCall[T]) (T, error) {
	var zero T
	if !c.fresh {
		if c.sentAt != nil {
			found, err := c.lookup(ctx)
			if err != nil {
				return zero, lookupFailed(err)
			}
			if found != nil {
				return *found, nil
			}
			if c.unsettled > 0 {
				// Nothing yet, but the earlier call may still land.
				return zero, &RetryError{
					Err:        fmt.Errorf("%w: %w: the call sent at %s may still land for %s", ErrOutcomeUnknown, errSettling, c.sentAt.UTC().Format(time.RFC3339), c.unsettled.Round(time.Millisecond)),
					RetryAfter: min(c.unsettled, pollInterval),
				}
			}
		}
		// The earlier call can no longer land and did not: send again.
		if err := c.mark(ctx); err != nil {
			return zero, err
		}
	}
	out, err := c.send(ctx)
	switch processor.ClassOf(err) {
	case processor.ClassFinal:
		return out, err
	case processor.ClassNotExecuted:
		// This call cannot land; only the one before it (if any) may.
		previous := c.sentAt
		if c.fresh {
			previous = nil // a fresh mark is the first of its step
		}
		if uerr := c.unmark(ctx, previous); uerr != nil {
			// The mark stays: the next attempt waits out a window it did
			// not need to. Safe, only slower.
			log.WarnContext(ctx, "unmark a call that did not execute", slog.Any("error", uerr))
		}
		return zero, &RetryError{Err: fmt.Errorf("%w: %w", ErrProcessorUnavailable, err), RetryAfter: processor.RetryAfterOf(err)}
	default:
		return zero, &RetryError{Err: fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)}
	}
}

// stayAt commits write as one more phase of l at its current recovery
// point: fenced by the lease generation, renewing the lease.
func (s *Service) stayAt(ctx context.Context, l *idem.Lease, write func(context.Context, pgx.Tx) error) error {
	point := l.RecoveryPoint
	_, err := s.store.Phase(ctx, l, func(ctx context.Context, tx pgx.Tx) (idem.Step, error) {
		return idem.Step{RecoveryPoint: point}, write(ctx, tx)
	})
	return err
}

// lookupFailed: a lookup without an answer settles nothing.
func lookupFailed(err error) error {
	return &RetryError{Err: fmt.Errorf("%w: the lookup failed: %w", ErrOutcomeUnknown, err), RetryAfter: processor.RetryAfterOf(err)}
}

// seconds converts a database interval in seconds.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
