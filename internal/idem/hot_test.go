package idem

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestRecordIsHeapOnly: recording the response of a one-transaction key is
// a HOT update (migration 000012): no index of idempotency_keys names a
// column the record changes, and the page has room for the recorded
// version. A record that was not HOT would write a new entry in each index
// for every request, the primary key's included.
//
// The counts come from pg_stat_user_tables, which a backend reports when it
// exits, so the requests run on a pool of their own that is closed before
// the counts are read.
func TestRecordIsHeapOnly(t *testing.T) {
	t.Parallel()
	h := setup(t)
	pool, err := pgxpool.New(t.Context(), h.url)
	if err != nil {
		t.Fatal(err)
	}
	store := NewStore(pool, Config{})
	// A body the size of an order's, so the recorded version is several
	// times the claimed one, as in production.
	body := fmt.Sprintf(`{"id":"t_1","description":%q}`, strings.Repeat("x", 500))
	const n = 60
	var calls atomic.Int32
	for i := range n {
		c := h.claim(t, fmt.Sprintf("hot-%d", i), fmt.Sprintf(`{"i":%d}`, i))
		if _, _, err := store.Execute(t.Context(), c, insertExec(&calls, h.tenant, fmt.Sprint(i), created(body))); err != nil {
			t.Fatal(err)
		}
	}
	pool.Close()
	if calls.Load() != n {
		t.Fatalf("%d executions, want %d", calls.Load(), n)
	}

	var updates, hot int64
	deadline := time.Now().Add(15 * time.Second)
	for {
		if err := h.pool.QueryRow(t.Context(), `
			SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'idempotency_keys'`).Scan(&updates, &hot); err != nil {
			t.Fatal(err)
		}
		if updates >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if updates != n {
		t.Fatalf("idempotency_keys saw %d updates, want one record per request (%d)", updates, n)
	}
	if hot != updates {
		t.Errorf("%d of %d records were HOT updates, want all of them", hot, updates)
	}
}
