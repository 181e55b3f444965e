package idem

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/db/dbsqlc"
)

// The budget of live keys per tenant (R6).
//
// Every request with a new key leaves a row for KeyRetention, failures
// included: at the default rate limit one tenant could leave tens of
// gigabytes a day. So each tenant may hold at most Config.KeyBudget live
// key rows. A request with a new key past the budget is refused before its
// claim (ErrKeyBudgetExceeded; nothing recorded), while every key the
// tenant holds keeps working: replays, 409s and 422s, and the retries that
// resume a payment. The budget frees up as the reaper deletes keys past
// their retention.
//
// Counting a tenant's rows on every request would cost a scan each. The
// estimate is instead the tenant's row count at its last count (one
// index-only scan of its part of the primary key) plus the keys this
// process claimed since: it never undercounts this process's own claims,
// and rows deleted since only make it high. A tenant below its budget by
// the estimate costs nothing more than a map lookup; one at it is counted
// again (at most every budgetRecount) before anything is refused. Behind N
// processes a tenant can overshoot by what the other processes claimed
// since the last count, as the per-process rate limit can.
//
// What it counts is key rows, so a key whose request is still running is
// not counted: a one-transaction request writes its key's row as its
// transaction's last statement (Execute). Every such request has passed
// admit, and the overshoot they make is bounded: each holds one of the
// pool's connections from before its claim until its commit, and no longer
// than the request's deadline, and each came through the tenant's rate
// limit. So at most the pool's size per process, and at most the rate
// limit times the request timeout, are ever in flight past the budget.

// ErrKeyBudgetExceeded: the tenant holds as many live keys as its budget
// allows; a request with a new key is refused before any claim.
var ErrKeyBudgetExceeded = errors.New("this tenant holds as many live idempotency keys as its budget allows")

// DefaultKeyBudget is Config.KeyBudget's default: a million live keys per
// tenant, about 1 GB of key rows and their indexes (docs/bounds.md: the
// bytes of a row). At the default rate limit a tenant reaches it in under
// three hours of sustained creates; past it, keys age out at the pace they
// came in.
const DefaultKeyBudget = 1_000_000

// budgetRecount bounds how often a tenant at its budget is counted again.
const budgetRecount = 10 * time.Second

type keyBudget struct {
	pool  *pgxpool.Pool
	limit int64
	now   func() time.Time

	mu      sync.Mutex
	tenants map[uuid.UUID]*keyUsage // one per tenant that claimed: bounded by the tenants
}

type keyUsage struct {
	mu        sync.Mutex
	counted   int64     // the tenant's key rows at the last count
	claimed   int64     // keys this process claimed since
	countedAt time.Time // zero: never counted
}

func newKeyBudget(pool *pgxpool.Pool, limit int64) *keyBudget {
	return &keyBudget{pool: pool, limit: limit, now: time.Now, tenants: map[uuid.UUID]*keyUsage{}}
}

func (b *keyBudget) usage(tenant uuid.UUID) *keyUsage {
	b.mu.Lock()
	defer b.mu.Unlock()
	u, ok := b.tenants[tenant]
	if !ok {
		u = &keyUsage{}
		b.tenants[tenant] = u
	}
	return u
}

// below reports whether tenant is below its budget: by the estimate, and,
// when the estimate is at the budget, by a fresh count.
//
// The count runs without the tenant's lock held, so no request waits on
// another's query: two requests may both count, and the later result
// stands. A claim made while a count runs may be counted twice (in the
// count and in claimed) or, rarely, not at all; either way by one.
func (b *keyBudget) below(ctx context.Context, tenant uuid.UUID) (bool, error) {
	u := b.usage(tenant)
	now := b.now()
	u.mu.Lock()
	stale := u.countedAt.IsZero() || (u.counted+u.claimed >= b.limit && now.Sub(u.countedAt) >= budgetRecount)
	u.mu.Unlock()
	if stale {
		n, err := dbsqlc.New(b.pool).IdemKeyCountForTenant(ctx, tenant)
		if err != nil {
			return false, err
		}
		u.mu.Lock()
		if !u.countedAt.After(now) {
			u.counted, u.claimed, u.countedAt = n, 0, now
		}
		u.mu.Unlock()
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.counted+u.claimed < b.limit, nil
}

// add counts a key row this process just claimed for tenant.
func (b *keyBudget) add(tenant uuid.UUID) {
	u := b.usage(tenant)
	u.mu.Lock()
	u.claimed++
	u.mu.Unlock()
}

// admit lets c go on to its claim unless its tenant is at its budget and
// c's key is not one the tenant holds: then ErrKeyBudgetExceeded. A key
// past its retention is not held (claiming it would be a new key).
func (s *Store) admit(ctx context.Context, c Claim) error {
	if s.budget == nil {
		return nil
	}
	below, err := s.budget.below(ctx, c.TenantID)
	if err != nil || below {
		return err
	}
	_, err = dbsqlc.New(s.pool).IdemKeyHeld(ctx, dbsqlc.IdemKeyHeldParams{TenantID: c.TenantID, Endpoint: c.Endpoint, IdemKey: c.Key})
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrKeyBudgetExceeded
	}
	return err
}

// claimed counts a claim that made a key row.
func (s *Store) claimed(c Claim) {
	if s.budget != nil {
		s.budget.add(c.TenantID)
	}
}
