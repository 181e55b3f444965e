package httpapi

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
)

// RateLimit is the per-tenant token bucket (R1): each tenant may send Burst
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

// limiter holds one bucket per tenant that sent a request. Tenants are
// authenticated first, so the map is bounded by the number of tenants.
type limiter struct {
	rate, burst float64
	now         func() time.Time

	mu      sync.Mutex
	buckets map[uuid.UUID]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

func newLimiter(cfg RateLimit) *limiter {
	return &limiter{rate: cfg.Rate, burst: float64(max(cfg.Burst, 1)), now: time.Now, buckets: map[uuid.UUID]*bucket{}}
}

// take takes one token from tenant's bucket. It returns whether it got one,
// the whole tokens left, and how long until the next token.
func (l *limiter) take(tenant uuid.UUID) (ok bool, remaining int, next time.Duration) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b, found := l.buckets[tenant]
	if !found {
		b = &bucket{tokens: l.burst, at: now}
		l.buckets[tenant] = b
	}
	b.tokens = math.Min(l.burst, b.tokens+now.Sub(b.at).Seconds()*l.rate)
	b.at = now
	if b.tokens >= 1 {
		b.tokens--
		ok = true
	}
	if b.tokens < 1 {
		next = time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
	}
	return ok, int(b.tokens), next
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
	window := int64(math.Ceil(l.burst / l.rate))
	policy := fmt.Sprintf(`"tenant";q=%d;w=%d`, int64(l.burst), window)
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
