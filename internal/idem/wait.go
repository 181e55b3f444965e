package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemref/payments/internal/db/dbsqlc"
)

// Waiting for the first attempt (L7).
//
// Without a preference, a duplicate that finds its key's first attempt in
// flight gets ErrKeyInUse (409 with Retry-After) and polls around it
// itself. A client that sends `Prefer: wait=N` (RFC 7240) asks the server
// to do that polling for it: Waiters.Wait keeps the duplicate until the
// first attempt's answer is recorded, and replays it, or until N seconds
// (at most WaitLimits.Max) have passed, and then answers the 409 of today.
//
// How it learns the answer: by reading the key's row, with backoff
// (pollBackoff), through the pool. Not LISTEN/NOTIFY: a session LISTEN
// does not survive a pooler in transaction mode (PgBouncer), and the
// first attempt runs, as often as not, in another API process, so nothing
// in this process could tell the waiter. A poll is one primary-key read
// (IdemKeyGet) on a pooled connection that goes back to the pool at once:
// a waiter holds no connection, and no lock, between polls. Its cost is
// the number of polls: 5 in the first second, then one a second, so a
// wait of N seconds costs at most N + 4 reads, and W waiters about W
// reads a second once they have waited a second.
//
// Waiters are a resource (each one a goroutine, a request's timer and an
// open client connection), so they are bounded per tenant and per process
// (WaitLimits); past either bound the duplicate is answered at once with
// ErrWaitRefused, the 409 it would have had without the preference.

// WaitLimits bounds the waiting of duplicates.
type WaitLimits struct {
	// Max caps the wait a client may ask for; zero turns waiting off.
	Max time.Duration
	// PerTenant and PerProcess bound the duplicates that wait at once.
	PerTenant, PerProcess int
}

// ErrWaitRefused: the duplicate asked to wait, but as many duplicates as
// the bounds allow are waiting already. It is ErrKeyInUse (errors.Is), so
// the client gets the 409 it would have had without asking.
var ErrWaitRefused = fmt.Errorf("%w; no more requests may wait for it now", ErrKeyInUse)

// Waiters keeps the duplicates that wait, within WaitLimits.
type Waiters struct {
	store  *Store
	limits WaitLimits

	mu        sync.Mutex
	total     int
	perTenant map[uuid.UUID]int
}

// NewWaiters returns the waiters of store's keys, bounded by limits.
func NewWaiters(store *Store, limits WaitLimits) *Waiters {
	return &Waiters{store: store, limits: limits, perTenant: map[uuid.UUID]int{}}
}

// Limits returns the bounds w enforces.
func (w *Waiters) Limits() WaitLimits { return w.limits }

// Outcomes of idempotency_waits_total.
const (
	waitReplayed = "replayed" // the first attempt's answer, replayed
	waitRan      = "ran"      // the first attempt gave the key up: this request ran
	waitTimedOut = "timed_out"
	waitRefused  = "refused"
)

var (
	waitersGauge = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idempotency_waiters",
		Help: "Duplicates waiting, under Prefer: wait, for the first attempt of their key in this process.",
	})
	waitsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idempotency_waits_total",
		Help: "Duplicates that asked to wait (Prefer: wait) for the first attempt of their key, by endpoint and outcome: replayed (its answer, recorded meanwhile), ran (the first attempt gave the key up, and this request ran), timed_out (409 after the wait), refused (409 at once: as many wait already as the bounds allow).",
	}, []string{"endpoint", "outcome"})
)

func init() { prometheus.MustRegister(waitersGauge, waitsTotal) }

// Wait answers a duplicate that got ErrKeyInUse from run (its first try)
// and asked to wait until until: it polls the key's row until the first
// attempt's answer is recorded and replays it (replayed = true), or runs
// the request again, by run, when the first attempt gave the key up (its
// lease lapsed or was released). Past until, or when the request's context
// ends, the answer is ErrKeyInUse; past the bounds, ErrWaitRefused at once.
func (w *Waiters) Wait(ctx context.Context, c Claim, until time.Time, run func() (Response, bool, error)) (res Response, replayed bool, err error) {
	if !w.admit(c.TenantID) {
		waitsTotal.WithLabelValues(c.Endpoint, waitRefused).Inc()
		return Response{}, false, ErrWaitRefused
	}
	defer w.leave(c.TenantID)
	outcome := waitTimedOut
	defer func() { waitsTotal.WithLabelValues(c.Endpoint, outcome).Inc() }()
	for delay := pollBackoff(0); ; delay = pollBackoff(delay) {
		left := time.Until(until)
		if left <= 0 {
			return Response{}, false, ErrKeyInUse
		}
		// The last poll comes as the wait ends, not a backoff before.
		select {
		case <-ctx.Done():
			return Response{}, false, ErrKeyInUse
		case <-time.After(min(delay, left)):
		}
		res, found, err := w.store.peek(ctx, c)
		switch {
		case errors.Is(err, errKeyFree):
			res, replayed, err = run()
			if errors.Is(err, ErrKeyInUse) {
				continue // another duplicate took it first: wait for that one
			}
			outcome = waitRan
			return res, replayed, err
		case err != nil:
			return Response{}, false, err
		case found:
			outcome = waitReplayed
			return res, true, nil
		}
	}
}

// pollBackoff is the delay before the next poll: 50 ms, doubling, at most
// a second.
func pollBackoff(last time.Duration) time.Duration {
	if last <= 0 {
		return 50 * time.Millisecond
	}
	return min(2*last, time.Second)
}

func (w *Waiters) admit(tenant uuid.UUID) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.total >= w.limits.PerProcess || w.perTenant[tenant] >= w.limits.PerTenant {
		return false
	}
	w.total++
	w.perTenant[tenant]++
	waitersGauge.Inc()
	return true
}

func (w *Waiters) leave(tenant uuid.UUID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.total--
	if w.perTenant[tenant]--; w.perTenant[tenant] <= 0 {
		delete(w.perTenant, tenant)
	}
	waitersGauge.Dec()
}

// errKeyFree: the first attempt gave the key up, so the waiter may run
// the request itself.
var errKeyFree = errors.New("idem: the key's first attempt gave it up")

// peek is one poll of a waiter: the key's row, read on a pooled
// connection that is released at once. found: its answer is recorded,
// and res is it. errKeyFree: a multi-step key whose lease lapsed (the
// first attempt died, or released it after a transient failure), or a
// key past its retention, which the request may now take over or claim
// afresh. A key with no row is still in flight: the one-transaction path
// writes its row only as it commits (doc.go), and a first attempt rolled
// back leaves the waiter to its 409 at the end of the wait.
func (s *Store) peek(ctx context.Context, c Claim) (res Response, found bool, err error) {
	row, err := dbsqlc.New(s.pool).IdemKeyGet(ctx, dbsqlc.IdemKeyGetParams{TenantID: c.TenantID, Endpoint: c.Endpoint, IdemKey: c.Key})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Response{}, false, nil
	case err != nil:
		return Response{}, false, s.wrap(err)
	case row.Forgotten:
		return Response{}, false, errKeyFree
	}
	stored, err := settled(row.IdempotencyKey, row.ResultExpired, c)
	switch {
	case err != nil:
		return Response{}, false, err
	case stored != nil:
		replayAgeSeconds.Observe(time.Since(row.IdempotencyKey.CreatedAt).Seconds())
		return *stored, true, nil
	}
	if lu := row.IdempotencyKey.LockedUntil; lu != nil && time.Now().After(*lu) {
		return Response{}, false, errKeyFree
	}
	return Response{}, false, nil
}

// Config returns the settings s enforces, its defaults applied: the rules
// document (GET /v1/idempotency) states them.
func (s *Store) Config() Config { return s.cfg }
