package tenants

import (
	"context"
	"crypto/sha256"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/idemref/payments/internal/db/dbsqlc"
)

// maxCachedKeys bounds the cache; past it the cache starts over empty.
const maxCachedKeys = 10_000

// Cache remembers keys that authenticated for ttl, so a busy tenant (or a
// tenant flooding past its rate limit) costs one database lookup per key
// and ttl instead of one per request. Only successes are cached: an
// unknown or revoked key is looked up every time. The price: a revoked key
// keeps working for up to ttl in each process.
type Cache struct {
	q   dbsqlc.DBTX
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex
	entries map[[sha256.Size]byte]cached
}

type cached struct {
	tenant  uuid.UUID
	expires time.Time
}

// NewCache returns a cache over q; a ttl of zero or less caches nothing.
func NewCache(q dbsqlc.DBTX, ttl time.Duration) *Cache {
	return &Cache{q: q, ttl: ttl, now: time.Now, entries: map[[sha256.Size]byte]cached{}}
}

// Authenticate is Authenticate, answered from the cache while the key's
// entry is fresh. Entries are keyed by the key's hash, never the key.
func (c *Cache) Authenticate(ctx context.Context, key string) (uuid.UUID, error) {
	if c.ttl <= 0 {
		return Authenticate(ctx, c.q, key)
	}
	h := sha256.Sum256([]byte(key))
	now := c.now()
	c.mu.Lock()
	e, ok := c.entries[h]
	c.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.tenant, nil
	}
	id, err := Authenticate(ctx, c.q, key)
	if err != nil {
		return id, err
	}
	c.mu.Lock()
	if len(c.entries) >= maxCachedKeys {
		clear(c.entries)
	}
	c.entries[h] = cached{tenant: id, expires: now.Add(c.ttl)}
	c.mu.Unlock()
	return id, nil
}
