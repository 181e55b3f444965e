package idem

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// R6: a tenant holds at most KeyBudget live keys. A new key past it is
// refused before any claim, with nothing written; every key the tenant
// holds keeps working; the budget frees up when old keys are deleted.
func TestKeyBudget(t *testing.T) {
	t.Parallel()
	h := setup(t)
	s := NewStore(h.pool, Config{KeyBudget: 3})
	clock := time.Now()
	s.budget.now = func() time.Time { return clock }
	var calls atomic.Int32

	for i := range 3 {
		key := fmt.Sprintf("k-%d", i)
		if _, _, err := s.Execute(t.Context(), h.claim(t, key, `{}`), insertExec(&calls, h.tenant, key, created(`{"i":1}`))); err != nil {
			t.Fatalf("key %d of a budget of 3: %v", i, err)
		}
	}
	// A fourth key: refused before its claim, nothing written, whatever
	// the request (a failure would have been recorded too).
	_, _, err := s.Execute(t.Context(), h.claim(t, "k-3", `{}`), notCalled(t))
	if !errors.Is(err, ErrKeyBudgetExceeded) {
		t.Fatalf("a fourth key = %v, want ErrKeyBudgetExceeded", err)
	}
	if rows := h.keyRows(t); len(rows) != 3 {
		t.Errorf("key rows = %d after the refusal, want 3", len(rows))
	}
	// Keys the tenant holds still work: a replay, and a 422 for another
	// request under a held key.
	res, replayed, err := s.Execute(t.Context(), h.claim(t, "k-0", `{}`), notCalled(t))
	if err != nil || !replayed || res.Status != http.StatusCreated {
		t.Errorf("replay of a held key at the budget = %d, replayed %v, %v; want the replay", res.Status, replayed, err)
	}
	if _, _, err := s.Execute(t.Context(), h.claim(t, "k-0", `{"other":1}`), notCalled(t)); !errors.Is(err, ErrKeyReused) {
		t.Errorf("another request under a held key = %v, want ErrKeyReused", err)
	}
	// A multi-step request with a new key is refused the same way.
	if _, err := s.Begin(t.Context(), h.claim(t, "m-new", `{}`), func(context.Context, pgx.Tx, Lease) (Step, error) {
		t.Error("the first phase ran past the budget")
		return Step{}, nil
	}); !errors.Is(err, ErrKeyBudgetExceeded) {
		t.Errorf("Begin with a new key at the budget = %v, want ErrKeyBudgetExceeded", err)
	}
	// Another tenant has a budget of its own.
	other := *h
	other.tenant = h.newTenant(t)
	if _, _, err := s.Execute(t.Context(), other.claim(t, "k-3", `{}`), insertExec(&calls, other.tenant, "o", created(`{}`))); err != nil {
		t.Errorf("another tenant's first key: %v", err)
	}

	// The reaper deletes two keys past their retention. Until the tenant
	// is counted again the estimate stands; after budgetRecount it is
	// counted, and new keys fit again.
	if _, err := h.pool.Exec(t.Context(), `DELETE FROM idempotency_keys WHERE tenant_id = $1 AND idem_key IN ('k-1', 'k-2')`, h.tenant); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Execute(t.Context(), h.claim(t, "k-4", `{}`), notCalled(t)); !errors.Is(err, ErrKeyBudgetExceeded) {
		t.Errorf("a new key before the recount = %v, want ErrKeyBudgetExceeded", err)
	}
	clock = clock.Add(budgetRecount)
	for _, key := range []string{"k-4", "k-5"} {
		if _, _, err := s.Execute(t.Context(), h.claim(t, key, `{}`), insertExec(&calls, h.tenant, key, created(`{}`))); err != nil {
			t.Errorf("new key %s after the recount: %v", key, err)
		}
	}
	if _, _, err := s.Execute(t.Context(), h.claim(t, "k-6", `{}`), notCalled(t)); !errors.Is(err, ErrKeyBudgetExceeded) {
		t.Errorf("a new key at the budget again = %v, want ErrKeyBudgetExceeded", err)
	}
	if got := calls.Load(); got != 6 {
		t.Errorf("executions = %d, want 6", got)
	}
}

// A negative budget turns it off.
func TestKeyBudgetOff(t *testing.T) {
	t.Parallel()
	h := setup(t)
	s := NewStore(h.pool, Config{KeyBudget: -1})
	if s.budget != nil {
		t.Fatal("a negative KeyBudget still built a budget")
	}
	var calls atomic.Int32
	for i := range 5 {
		key := fmt.Sprintf("k-%d", i)
		if _, _, err := s.Execute(t.Context(), h.claim(t, key, `{}`), insertExec(&calls, h.tenant, key, created(`{}`))); err != nil {
			t.Fatal(err)
		}
	}
}
