package client

import "sync"

// Budget is a client's retry budget: a token bucket shared by every
// operation of one Client. A retry spends RetryCost tokens; an answer the
// server gave (any status that is not retried) puts Refill tokens back, up
// to Capacity. First attempts are never charged. So while the server is
// healthy the bucket stays full, and during an outage the whole client adds
// at most about Capacity/RetryCost retries to its callers' first attempts,
// instead of multiplying its load by the number of attempts per operation.
type Budget struct {
	mu       sync.Mutex
	tokens   float64
	capacity float64
	cost     float64
	refill   float64
}

// Default budget: ten retries in reserve, and one retry earned back per
// ten answered requests.
const (
	DefaultBudgetCapacity = 10
	DefaultRetryCost      = 1
	DefaultBudgetRefill   = 0.1
)

// NewBudget returns a full bucket. Values not above zero take the defaults.
func NewBudget(capacity, retryCost, refill float64) *Budget {
	if capacity <= 0 {
		capacity = DefaultBudgetCapacity
	}
	if retryCost <= 0 {
		retryCost = DefaultRetryCost
	}
	if refill <= 0 {
		refill = DefaultBudgetRefill
	}
	return &Budget{tokens: capacity, capacity: capacity, cost: retryCost, refill: refill}
}

// take spends one retry's tokens; false means the budget is exhausted and
// the retry must not be sent.
func (b *Budget) take() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tokens < b.cost {
		return false
	}
	b.tokens -= b.cost
	return true
}

// answered earns tokens back: the server answered without asking for a
// retry.
func (b *Budget) answered() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens = min(b.capacity, b.tokens+b.refill)
}

// Tokens reports the tokens left, for metrics and tests.
func (b *Budget) Tokens() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tokens
}
