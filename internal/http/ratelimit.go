package httpapi

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RateLimit is the per-tenant token bucket: each tenant may send Burst
// requests at once and Rate per second after that. A zero Rate turns it off.
//
// It is applied after authentication, so the bucket is the tenant's and not
// the client's address, and before the idempotency layer, as at Stripe: a
// 429 claims nothing and records nothing, so a retry with the same key runs
// normally. The buckets live in this process: behind N API processes a
// tenant gets up to N times the rate (a shared limit needs a shared
// counter, in PostgreSQL or Redis, on every request).
type RateLimit struct {
	Rate  float64
	Burst int
}

// Defaults, generous: they stop one tenant from starving the others on a
// small machine, not ordinary traffic.
const (
	DefaultRateLimit = 100 // requests per second and tenant
	DefaultRateBurst = 200
)

// limiter holds one token bucket (golang.org/x/time/rate) per tenant that
// sent a request (authenticated first, so the map is bounded by the number
// of tenants, and by maxBuckets).
type limiter[K comparable] struct {
	limit rate.Limit
	burst int
	now   func() time.Time

	mu      sync.Mutex
	buckets map[K]*rate.Limiter
}

// maxBuckets bounds a limiter's map. Past it, buckets that refilled are
// dropped (a full bucket and no bucket mean the same), and if that is not
// enough the map starts over: memory stays bounded.
const maxBuckets = 100_000

func newLimiter[K comparable](cfg RateLimit) *limiter[K] {
	return &limiter[K]{limit: rate.Limit(cfg.Rate), burst: max(cfg.Burst, 1), now: time.Now, buckets: map[K]*rate.Limiter{}}
}

// take takes one token from key's bucket. It returns whether it got one,
// the whole tokens left, and how long until the next token.
func (l *limiter[K]) take(key K) (ok bool, remaining int, next time.Duration) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b, found := l.buckets[key]
	if !found {
		if len(l.buckets) >= maxBuckets {
			l.pruneLocked(now)
		}
		b = rate.NewLimiter(l.limit, l.burst)
		l.buckets[key] = b
	}
	ok = b.AllowN(now, 1)
	tokens := b.TokensAt(now)
	return ok, int(tokens), l.untilOne(tokens)
}

// untilOne is how long a bucket holding tokens takes to hold one whole
// token: 0 if it does.
func (l *limiter[K]) untilOne(tokens float64) time.Duration {
	if tokens >= 1 {
		return 0
	}
	return time.Duration((1 - tokens) / float64(l.limit) * float64(time.Second))
}

func (l *limiter[K]) pruneLocked(now time.Time) {
	for k, b := range l.buckets {
		if b.TokensAt(now) >= float64(l.burst) {
			delete(l.buckets, k)
		}
	}
	if len(l.buckets) >= maxBuckets {
		clear(l.buckets)
	}
}

// rateLimit answers 429 once the tenant's bucket is empty. Every answer
// carries the RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers: the quota q (the burst) over the
// window w (seconds to refill it), the tokens r left, and t, the seconds
// until the next one.
func (a *api) rateLimit(next http.Handler) http.Handler {
	if a.limiter == nil {
		return next
	}
	l := a.limiter
	window := int64(math.Ceil(float64(l.burst) / float64(l.limit)))
	policy := fmt.Sprintf(`"tenant";q=%d;w=%d`, l.burst, window)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ok, remaining, wait := l.take(tenantFrom(r.Context()))
		secs := ceilSeconds(wait)
		w.Header().Set("RateLimit-Policy", policy)
		w.Header().Set("RateLimit", fmt.Sprintf(`"tenant";r=%d;t=%d`, remaining, secs))
		if !ok {
			writeError(w, r, &rateLimitedError{retryAfter: max(secs, 1)})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// rateLimitedError is a request refused by the tenant's rate limit.
type rateLimitedError struct{ retryAfter int64 }

func (e *rateLimitedError) Error() string {
	return "rate limit exceeded; retry in " + strconv.FormatInt(e.retryAfter, 10) + "s"
}

func ceilSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}
