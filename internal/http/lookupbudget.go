package httpapi

import (
	"strconv"
	"time"
)

// DefaultAuthLookups is each client's budget of failed API key lookups
// (R5): a burst of 20, then 2 a second. Keys that authenticate cost nothing
// from it, so it binds only a client that keeps sending keys nobody knows.
var DefaultAuthLookups = RateLimit{Rate: 2, Burst: 20}

// DefaultAuthLookupsTotal is the process's budget of failed API key lookups
// from every client together: a burst of 100, then 20 a second.
var DefaultAuthLookupsTotal = RateLimit{Rate: 20, Burst: 100}

// suspectFor is how long a client that sent a key nobody knows stays
// suspect: while the total budget is spent, a suspect client's lookups are
// refused, a clean client's are not.
const suspectFor = 10 * time.Minute

// lookupBudget bounds the database lookups of API keys that find no tenant
// (R5), so a flood of made-up keys costs no query each. A lookup is charged
// only when it finds no tenant; before each lookup:
//
//   - a client (see internal/clientaddr: the address behind a trusted proxy,
//     or the peer) with no token of its own left is refused;
//   - once the total budget is spent too, a client that sent an unknown key
//     in the last suspectFor is refused. A client that has not is still
//     looked up.
//
// The second rule bounds the flood as a whole: spread over 50 addresses a
// per-client budget alone costs 50 bursts, and an IPv6 client has a budget
// per /64. Past the total, each new address costs one lookup and is then
// suspect. It never starves a tenant's valid key: a client that sends only
// keys that authenticate is never suspect, so its lookups go through
// whatever the flood, after a restart, a new tenant or AUTH_CACHE_TTL. What
// it costs a real client: one that sent a wrong key (a typo, a revoked key)
// is refused for a while during a flood from elsewhere, with Retry-After.
type lookupBudget struct {
	perClient *limiter[string]
	total     *limiter[struct{}]
}

func newLookupBudget(perClient, total RateLimit) *lookupBudget {
	return &lookupBudget{perClient: newLimiter[string](perClient), total: newLimiter[struct{}](total)}
}

// refuse reports whether the client's next lookup must be refused before
// any query, and how long until it may be tried.
func (b *lookupBudget) refuse(client string) (*authThrottledError, bool) {
	if empty, wait := b.perClient.empty(client); empty {
		return &authThrottledError{retryAfter: max(ceilSeconds(wait), 1), total: false}, true
	}
	if empty, wait := b.total.empty(struct{}{}); empty && b.perClient.takenWithin(client, suspectFor) {
		return &authThrottledError{retryAfter: max(ceilSeconds(wait), 1), total: true}, true
	}
	return nil, false
}

// failed charges a lookup that found no tenant to the client and to the
// total.
func (b *lookupBudget) failed(client string) {
	b.perClient.take(client)
	b.total.take(struct{}{})
}

// authThrottledError: the client, or every client together, used up the
// budget of key lookups; answered 429 before any query.
type authThrottledError struct {
	retryAfter int64
	total      bool
}

func (e *authThrottledError) Error() string {
	who := "from this client"
	if e.total {
		who = "from every client, and this one sent unknown keys too"
	}
	return "too many unknown API keys looked up " + who + "; retry in " + strconv.FormatInt(e.retryAfter, 10) + "s"
}
