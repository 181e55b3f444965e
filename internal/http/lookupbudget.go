package httpapi

import (
	"container/list"
	"context"
	"strconv"
	"sync"
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

// DefaultLookupClients bounds the clients a process remembers for the
// lookup budget: those with a lookup under way and those suspect.
const DefaultLookupClients = 100_000

// lookupBudget bounds the database lookups of API keys that find no tenant
// so a flood of made-up keys costs no query each. Each lookup is
// charged before it runs, and given back if the key authenticates (or the
// lookup itself failed), so keys that authenticate cost nothing from it.
// Before each lookup:
//
//   - a client (see internal/clientaddr: the address behind a trusted proxy,
//     or the peer) with no token of its own left is refused;
//   - once the total budget is spent too, a client that sent an unknown key
//     in the last suspectFor is refused. A client that has not is still
//     looked up.
//
// A client's lookups run one at a time: the others wait for their turn, so
// requests in flight at once cannot each find the last token, and a
// client's first lookup past the total is its only one until it is known to
// fail. Waiting, not refusing, is what keeps a tenant's concurrent requests
// with a valid key from being refused for each other's lookups.
//
// The second rule bounds the flood as a whole: spread over 50 addresses a
// per-client budget alone costs 50 bursts, and an IPv6 client has a budget
// per /64. Past the total, each new address costs one lookup and is then
// suspect. It never starves a tenant's valid key: a client that sends only
// keys that authenticate is never suspect, so its lookups go through
// whatever the flood, after a restart, a new tenant or AUTH_CACHE_TTL. What
// it costs a real client: one that sent a wrong key (a typo, a revoked key)
// is refused for a while during a flood from elsewhere, with Retry-After.
//
// A suspect client is remembered for its whole suspectFor, whatever the
// flood: forgetting it early would make it clean again, and worth another
// lookup past the total. Memory is bounded instead by maxClients: while
// that many are remembered, every client not among them is one client,
// the overflow, with one budget and one turn between them all.
type lookupBudget struct {
	perClient, total RateLimit
	maxClients       int

	mu       sync.Mutex
	spent    tokenBucket // the total's
	clients  map[string]*lookupClient
	suspects list.List     // of *lookupClient, in the order they last failed
	overflow *lookupClient // every client past maxClients
}

// lookupClient is one client's share of the budget.
type lookupClient struct {
	key     string
	bucket  tokenBucket
	failed  time.Time     // the last lookup that found no tenant
	suspect *list.Element // in lookupBudget.suspects; nil: not suspect
	users   int           // requests holding or waiting for the turn
	turn    chan struct{} // held by the one lookup under way; nil while no user
}

func newLookupBudget(perClient, total RateLimit, maxClients int) *lookupBudget {
	return &lookupBudget{perClient: perClient, total: total, maxClients: maxClients,
		clients: map[string]*lookupClient{}, overflow: &lookupClient{}}
}

// lookupTurn is a client's one lookup under way, charged to its budget.
type lookupTurn struct {
	b     *lookupBudget
	c     *lookupClient
	total bool // a token of the total was taken too
}

// begin waits for the client's turn to look a key up and charges the
// lookup, or refuses it before any query (*authThrottledError), or gives up
// when ctx ends. The caller ends the turn.
func (b *lookupBudget) begin(ctx context.Context, client string) (*lookupTurn, error) {
	c := b.join(client)
	select {
	case c.turn <- struct{}{}:
	case <-ctx.Done():
		b.leave(c)
		return nil, ctx.Err()
	}
	t, err := b.charge(c)
	if err != nil {
		<-c.turn
		b.leave(c)
		return nil, err
	}
	return t, nil
}

// join finds the client's share (or the overflow) and queues the request
// for its turn. It refuses nothing: with a lookup of the client under way,
// only that lookup's outcome tells whether the client has a token left.
func (b *lookupBudget) join(client string) *lookupClient {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.forgetLocked(now)
	c, found := b.clients[client]
	if !found {
		c = b.overflow
		if len(b.clients) < b.maxClients {
			c = &lookupClient{key: client}
			b.clients[client] = c
		}
	}
	if c.users == 0 {
		c.turn = make(chan struct{}, 1)
	}
	c.users++
	return c
}

// charge takes the lookup's tokens once it is the client's turn, or
// refuses it: the client has no token of its own left, or the total is
// spent and the client is suspect. Past the total a clean client is looked
// up without a token of it: once, since its next lookup waits for this
// one's outcome, and a failure makes it suspect.
func (b *lookupBudget) charge(c *lookupClient) (*lookupTurn, error) {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if wait, ok := c.bucket.take(b.perClient, now); !ok {
		return nil, &authThrottledError{retryAfter: max(ceilSeconds(wait), 1)}
	}
	wait, total := b.spent.take(b.total, now)
	if !total && c.suspect != nil {
		c.bucket.giveBack()
		return nil, &authThrottledError{retryAfter: max(ceilSeconds(wait), 1), total: true}
	}
	return &lookupTurn{b: b, c: c, total: total}, nil
}

// end ends the turn: a lookup that found no tenant stays charged and makes
// the client suspect; any other outcome gives its tokens back.
func (t *lookupTurn) end(foundNoTenant bool) {
	b, c := t.b, t.c
	b.mu.Lock()
	if foundNoTenant {
		c.failed = time.Now()
		if c.suspect == nil {
			c.suspect = b.suspects.PushBack(c)
		} else {
			b.suspects.MoveToBack(c.suspect)
		}
	} else {
		c.bucket.giveBack()
		if t.total {
			b.spent.giveBack()
		}
	}
	b.mu.Unlock()
	<-c.turn
	b.leave(c)
}

// leave drops a request from the client's queue; a client no request uses
// is forgotten unless it is suspect.
func (b *lookupBudget) leave(c *lookupClient) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c.users--
	if c.users == 0 {
		c.turn = nil
		if c.suspect == nil && c != b.overflow {
			delete(b.clients, c.key)
		}
	}
}

// forgetLocked ends the suspicion of the clients whose last unknown key is
// suspectFor old: the oldest first, so the cost is one step per client
// forgotten.
func (b *lookupBudget) forgetLocked(now time.Time) {
	for e := b.suspects.Front(); e != nil; e = b.suspects.Front() {
		c := e.Value.(*lookupClient)
		if now.Sub(c.failed) < suspectFor {
			return
		}
		b.suspects.Remove(e)
		c.suspect = nil
		if c.users == 0 && c != b.overflow {
			delete(b.clients, c.key)
		}
	}
}

// tokenBucket is a token bucket kept as the tokens it is short of full at
// a time, so that its zero value is full.
type tokenBucket struct {
	short float64
	at    time.Time
}

// take takes a token if a whole one is there; else it reports how long
// until there is one.
func (tb *tokenBucket) take(cfg RateLimit, now time.Time) (time.Duration, bool) {
	tb.short = max(0, tb.short-cfg.Rate*now.Sub(tb.at).Seconds())
	tb.at = now
	if missing := tb.short + 1 - float64(cfg.Burst); missing > 0 {
		return time.Duration(missing / cfg.Rate * float64(time.Second)), false
	}
	tb.short++
	return 0, true
}

// giveBack returns a token taken, up to a full bucket.
func (tb *tokenBucket) giveBack() { tb.short = max(0, tb.short-1) }

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
