package tenants

import (
	"context"
	"crypto/sha256"
	"errors"
	"time"

	"github.com/google/uuid"
	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/idemref/payments/internal/db/dbsqlc"
)

// maxCachedKeys bounds each of the cache's two lists (keys that
// authenticated, keys that did not): past it the least recently used key
// gives way, so memory stays bounded whatever a flood of made-up keys does,
// and the keys in use stay.
const maxCachedKeys = 10_000

// Cache remembers, for ttl, which keys authenticated and which did not,
// so a busy tenant (or a tenant flooding past its rate limit) costs one
// database lookup per key and ttl instead of one per request, and so does
// a client repeating a wrong or revoked key. A flood of ever new
// made-up keys misses it every time: the lookup budgets in front of it
// (internal/http) bound that. The price: a revoked key keeps working for
// up to ttl in each process, which is the revocation bound operators are
// given (AUTH_CACHE_TTL, docs/operations.md): an entry expires ttl after
// the lookup that made it, however often it is read since, so a key in
// constant use is looked up again, and found revoked, within ttl (plus
// the one lookup that may be in flight at the revocation). A key is never
// refused because of the negative entries: keys are random secrets, so no
// key is tried before it exists.
//
// Each list is an LRU (golang-lru) whose entries carry their own expiry,
// checked when read: the library's expirable LRU would do the same with a
// goroutine per cache that never stops.
type Cache struct {
	q   dbsqlc.DBTX
	ttl time.Duration
	now func() time.Time

	known   *lru.Cache[[sha256.Size]byte, cached]
	unknown *lru.Cache[[sha256.Size]byte, time.Time] // until when the key is known not to authenticate
}

type cached struct {
	tenant  uuid.UUID
	expires time.Time
}

// NewCache returns a cache over q; a ttl of zero or less caches nothing.
func NewCache(q dbsqlc.DBTX, ttl time.Duration) *Cache {
	known, _ := lru.New[[sha256.Size]byte, cached](maxCachedKeys)
	unknown, _ := lru.New[[sha256.Size]byte, time.Time](maxCachedKeys)
	return &Cache{q: q, ttl: ttl, now: time.Now, known: known, unknown: unknown}
}

// Cached answers from the cache alone: the tenant of a key that
// authenticated, ErrUnauthenticated for one that did not, or found false
// when only the database can tell. Entries are keyed by the key's hash,
// never the key.
func (c *Cache) Cached(key string) (tenant uuid.UUID, found bool, err error) {
	if c.ttl <= 0 {
		return uuid.Nil, false, nil
	}
	h := sha256.Sum256([]byte(key))
	now := c.now()
	if e, ok := c.known.Get(h); ok && now.Before(e.expires) {
		return e.tenant, true, nil
	}
	if until, ok := c.unknown.Get(h); ok && now.Before(until) {
		return uuid.Nil, true, ErrUnauthenticated
	}
	return uuid.Nil, false, nil
}

// Authenticate is Authenticate, answered from the cache while the key's
// entry is fresh.
func (c *Cache) Authenticate(ctx context.Context, key string) (uuid.UUID, error) {
	if id, found, err := c.Cached(key); found {
		return id, err
	}
	id, err := Authenticate(ctx, c.q, key)
	if c.ttl <= 0 || (err != nil && !errors.Is(err, ErrUnauthenticated)) {
		// Caching nothing, or the lookup itself failed: nothing learnt.
		return id, err
	}
	h := sha256.Sum256([]byte(key))
	until := c.now().Add(c.ttl)
	if err != nil {
		c.unknown.Add(h, until)
		return id, err
	}
	c.unknown.Remove(h)
	c.known.Add(h, cached{tenant: id, expires: until})
	return id, nil
}
