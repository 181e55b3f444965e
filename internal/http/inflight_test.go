package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// TestKeyStatusWhileTheRequestRuns: an order's key is recorded by the last
// statement of its transaction, so while the request still executes the
// key has no row and its status is 404. That 404 says so: its detail, and
// commit_window_seconds, how long after it was sent a request can still
// commit (the request timeout, plus a lock wait of the claim, plus a
// margin). Once the request finishes, the status is its record, and there
// is one order.
func TestKeyStatusWhileTheRequestRuns(t *testing.T) {
	t.Parallel()
	// The request waits on the test's lock for as long as the test holds
	// it: a lock timeout longer than the test.
	const waitOnLock = time.Minute
	e := setup(t, withLockTimeout(waitOnLock))
	ctx := context.Background()

	holder, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Rollback(context.Background()) })
	if _, err := holder.Exec(ctx, `
		INSERT INTO orders (tenant_id, id, reference, customer_id, amount, currency)
		VALUES ($1, gen_random_uuid(), 'inv-in-flight', 'cus_1', 2500, 'EUR')`, e.a.ID); err != nil {
		t.Fatal(err)
	}

	done := make(chan response, 1)
	go func() {
		res, err := e.send(t.Context(), http.MethodPost, "/v1/orders", e.a.Key, []byte(orderBody("inv-in-flight")),
			withHeader(idem.HeaderName, "in-flight"))
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	testkit.WaitFor(t, 30*time.Second, func() bool {
		return e.count(t, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'") > 0
	})

	res := e.get(t, e.a.Key, statusPath("in-flight", endpointOrders))
	p := wantProblem(t, res, http.StatusNotFound, "not_found")
	if p.Detail == nil || !strings.Contains(*p.Detail, "still") {
		t.Errorf("detail = %v, want it to say that a request under the key may still be running", p.Detail)
	}
	var members map[string]any
	if err := json.Unmarshal(res.body, &members); err != nil {
		t.Fatal(err)
	}
	window, ok := members["commit_window_seconds"].(float64)
	least := (requestTimeout + waitOnLock).Seconds()
	if !ok || window < least || window > least+5 {
		t.Errorf("commit_window_seconds = %v, want from %v (the request timeout plus a lock wait) to a few seconds more", members["commit_window_seconds"], least)
	}
	e.wantRows(t, 0, 0)

	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, <-done, http.StatusCreated)
	res = e.get(t, e.a.Key, statusPath("in-flight", endpointOrders))
	wantStatus(t, res, http.StatusOK)
	e.wantRows(t, 1, 1)
	e.wantKeyRecord(t, e.a.ID, "in-flight", http.StatusCreated)
}
