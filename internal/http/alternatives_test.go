package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/client/api"
	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/events"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/orders"
)

// The two alternatives to idempotency keys (N2), with their rows. See
// docs/alternatives.md.

func decodeCustomer(t *testing.T, res response) api.Customer {
	t.Helper()
	var c api.Customer
	if err := json.Unmarshal(res.body, &c); err != nil {
		t.Fatalf("decode customer: %v; body: %s", err, res.body)
	}
	return c
}

func (e *bundle) countCustomers(t *testing.T) int {
	t.Helper()
	return e.count(t, "SELECT count(*) FROM customers")
}

func TestPutCustomer(t *testing.T) {
	t.Parallel()
	e := setup(t)
	put := func(t *testing.T, apiKey, id, body string) response {
		t.Helper()
		return e.do(t, http.MethodPut, "/v1/customers/"+id, apiKey, []byte(body))
	}

	t.Run("RetryTargetsTheSameRow", func(t *testing.T) {
		id := uuid.NewString()
		first := put(t, e.a.Key, id, customerBody("Ada"))
		wantStatus(t, first, http.StatusCreated)
		if loc := first.header.Get("Location"); loc != "/v1/customers/"+id {
			t.Errorf("Location = %q", loc)
		}
		retry := put(t, e.a.Key, id, customerBody("Ada"))
		wantStatus(t, retry, http.StatusOK)
		// The same state, the row untouched: updated_at did not move.
		if a, b := decodeCustomer(t, first), decodeCustomer(t, retry); a != b {
			t.Errorf("retry changed the customer:\nfirst: %+v\nretry: %+v", a, b)
		}
		if n := e.count(t, "SELECT count(*) FROM customers WHERE tenant_id = $1 AND id = $2", e.a.ID, id); n != 1 {
			t.Errorf("customers with id %s = %d, want 1", id, n)
		}
		// Not a key in sight: the id is the key.
		if n := e.count(t, "SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1", e.a.ID); n != 0 {
			t.Errorf("idempotency_keys rows = %d, want 0", n)
		}
	})

	t.Run("ReplacesTheWholeResource", func(t *testing.T) {
		id := uuid.NewString()
		first := decodeCustomer(t, put(t, e.a.Key, id, customerBody("Ada")))
		res := put(t, e.a.Key, id, `{"name":"Ada King","email":"ada@example.org"}`)
		wantStatus(t, res, http.StatusOK)
		var name, email string
		if err := e.pool.QueryRow(t.Context(), "SELECT name, email FROM customers WHERE tenant_id = $1 AND id = $2", e.a.ID, id).Scan(&name, &email); err != nil {
			t.Fatal(err)
		}
		if name != "Ada King" || email != "ada@example.org" {
			t.Errorf("row = %s <%s>, want the replacement", name, email)
		}
		if got := decodeCustomer(t, res); !got.CreatedAt.Equal(first.CreatedAt) || got.UpdatedAt.Equal(first.UpdatedAt) {
			t.Errorf("replace: created_at %s → %s, updated_at %s → %s; want created_at kept and updated_at moved",
				first.CreatedAt, got.CreatedAt, first.UpdatedAt, got.UpdatedAt)
		}
	})

	t.Run("ConcurrentPutsMakeOneRow", func(t *testing.T) {
		id := uuid.NewString()
		const n = 8
		statuses := make(chan int, n)
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				res, err := e.send(t.Context(), http.MethodPut, "/v1/customers/"+id, e.a.Key, []byte(customerBody("Grace")))
				if err != nil {
					t.Error(err)
					return
				}
				statuses <- res.status
			})
		}
		wg.Wait()
		close(statuses)
		created := 0
		for s := range statuses {
			if s == http.StatusCreated {
				created++
			} else if s != http.StatusOK {
				t.Errorf("status %d", s)
			}
		}
		if created != 1 {
			t.Errorf("%d of %d PUTs answered 201, want exactly 1", created, n)
		}
		if got := e.count(t, "SELECT count(*) FROM customers WHERE id = $1", id); got != 1 {
			t.Errorf("customers with id %s = %d, want 1", id, got)
		}
	})

	t.Run("TenantsHaveTheirOwnIDs", func(t *testing.T) {
		id := uuid.NewString()
		wantStatus(t, put(t, e.a.Key, id, customerBody("Ada")), http.StatusCreated)
		wantStatus(t, put(t, e.b.Key, id, customerBody("Bob")), http.StatusCreated)
		wantProblem(t, e.get(t, e.b.Key, "/v1/customers/"+uuid.NewString()), http.StatusNotFound, httpapi.CodeNotFound)
		var name string
		if err := e.pool.QueryRow(t.Context(), "SELECT name FROM customers WHERE tenant_id = $1 AND id = $2", e.a.ID, id).Scan(&name); err != nil || name != "Ada" {
			t.Errorf("tenant a's customer = %q, %v; want Ada, untouched by tenant b", name, err)
		}
	})

	t.Run("InvalidWritesNothing", func(t *testing.T) {
		before := e.countCustomers(t)
		p := wantProblem(t, put(t, e.a.Key, "not-a-uuid", customerBody("Ada")), http.StatusBadRequest, httpapi.CodeValidationFailed)
		if len(deref(p.Errors)) != 1 || deref(p.Errors)[0].Field != "id" {
			t.Errorf("errors = %+v, want one on id", deref(p.Errors))
		}
		wantProblem(t, put(t, e.a.Key, uuid.NewString(), `{"name":"Ada"}`), http.StatusBadRequest, httpapi.CodeValidationFailed)
		if got := e.countCustomers(t); got != before {
			t.Errorf("customers = %d, want %d", got, before)
		}
	})
}

func TestConditionalOrderUpdate(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	patch := func(t *testing.T, id, ifMatch, body string) response {
		t.Helper()
		var opts []reqOption
		if ifMatch != "" {
			opts = append(opts, withHeader("If-Match", ifMatch))
		}
		return e.do(t, http.MethodPatch, "/v1/orders/"+id, e.a.Key, []byte(body), opts...)
	}
	description := func(t *testing.T, id string) string {
		t.Helper()
		var d string
		if err := e.pool.QueryRow(t.Context(), "SELECT description FROM orders WHERE id = $1", id).Scan(&d); err != nil {
			t.Fatal(err)
		}
		return d
	}

	t.Run("AppliesOnlyToTheVersionRead", func(t *testing.T) {
		o := e.newOrder(t, e.a, "inv-patch-1")
		read := e.get(t, e.a.Key, "/v1/orders/"+o.Id.String())
		etag := read.header.Get("ETag")
		res := patch(t, o.Id.String(), etag, `{"description":"corrected","metadata":{"po":"77"}}`)
		wantStatus(t, res, http.StatusOK)
		if got := decodeOrder(t, res); got.Description != "corrected" || got.Metadata["po"] != "77" || len(got.Metadata) != 1 {
			t.Errorf("patched order = %+v", got)
		}
		if res.header.Get("ETag") == etag || res.header.Get("ETag") != e.get(t, e.a.Key, "/v1/orders/"+o.Id.String()).header.Get("ETag") {
			t.Error("the ETag after the PATCH must be new, and the one GET shows")
		}
		// The retry of the same PATCH (its answer lost) is refused: the
		// order is no longer the version it names. The change applied once.
		wantProblem(t, patch(t, o.Id.String(), etag, `{"description":"corrected","metadata":{"po":"77"}}`), http.StatusPreconditionFailed, httpapi.CodePreconditionFailed)
		if d := description(t, o.Id.String()); d != "corrected" {
			t.Errorf("description = %q", d)
		}
	})

	t.Run("LostUpdateIsPrevented", func(t *testing.T) {
		o := e.newOrder(t, e.a, "inv-patch-2")
		etag := e.get(t, e.a.Key, "/v1/orders/"+o.Id.String()).header.Get("ETag")
		// Two writers read the same version and race: exactly one wins.
		bodies := []string{`{"description":"writer one"}`, `{"description":"writer two"}`}
		statuses := make([]int, len(bodies))
		var wg sync.WaitGroup
		for i, body := range bodies {
			wg.Go(func() {
				res, err := e.send(t.Context(), http.MethodPatch, "/v1/orders/"+o.Id.String(), e.a.Key, []byte(body), withHeader("If-Match", etag))
				if err != nil {
					t.Error(err)
					return
				}
				statuses[i] = res.status
			})
		}
		wg.Wait()
		won := map[int]int{}
		for _, s := range statuses {
			won[s]++
		}
		if won[http.StatusOK] != 1 || won[http.StatusPreconditionFailed] != 1 {
			t.Fatalf("statuses = %v, want one 200 and one 412", statuses)
		}
		winner := bodies[0]
		if statuses[1] == http.StatusOK {
			winner = bodies[1]
		}
		if d := description(t, o.Id.String()); `{"description":"`+d+`"}` != winner {
			t.Errorf("description = %q, want the winner's %s", d, winner)
		}
	})

	t.Run("CheckAndWriteAreOneStep", func(t *testing.T) {
		o := e.newOrder(t, e.a, "inv-patch-6")
		etag := e.get(t, e.a.Key, "/v1/orders/"+o.Id.String()).header.Get("ETag")
		// Another writer holds the row, its change not yet committed.
		other, err := e.pool.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = other.Rollback(context.Background()) }()
		if _, err := other.Exec(t.Context(), "UPDATE orders SET description = 'other writer' WHERE id = $1", o.Id.String()); err != nil {
			t.Fatal(err)
		}
		done := make(chan response, 1)
		go func() {
			res, err := e.send(t.Context(), http.MethodPatch, "/v1/orders/"+o.Id.String(), e.a.Key, []byte(`{"description":"mine"}`), withHeader("If-Match", etag))
			if err != nil {
				t.Error(err)
			}
			done <- res
		}()
		// Commit the other change only once the PATCH waits on the row.
		deadline := time.Now().Add(5 * time.Second)
		for e.count(t, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'") == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the PATCH never waited on the row lock: it compared the ETag without holding the row")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := other.Commit(t.Context()); err != nil {
			t.Fatal(err)
		}
		// The PATCH compared against the committed change, not the version
		// it read before waiting: 412, and the other writer's change stays.
		wantProblem(t, <-done, http.StatusPreconditionFailed, httpapi.CodePreconditionFailed)
		if d := description(t, o.Id.String()); d != "other writer" {
			t.Errorf("description = %q: the other writer's change was lost", d)
		}
	})

	t.Run("PaymentChangesTheETag", func(t *testing.T) {
		o := e.newOrder(t, e.a, "inv-patch-3")
		etag := e.get(t, e.a.Key, "/v1/orders/"+o.Id.String()).header.Get("ETag")
		wantStatus(t, e.do(t, http.MethodPost, "/v1/payments", e.a.Key, []byte(payBody(o.Id.String(), cardVisa)), withHeader("Idempotency-Key", "pay-patch-3")), http.StatusCreated)
		// The order follows its payment through the outbox and the orders
		// consumer; apply the payment's event as the consumer does.
		var payload []byte
		if err := e.pool.QueryRow(t.Context(), `
			SELECT payload FROM outbox WHERE event_type = 'payment.succeeded'
			  AND convert_from(payload, 'UTF8')::jsonb #>> '{data,order_id}' = $1`, o.Id.String()).Scan(&payload); err != nil {
			t.Fatal(err)
		}
		var ev events.Envelope
		if err := json.Unmarshal(payload, &ev); err != nil {
			t.Fatal(err)
		}
		if err := db.WithTx(t.Context(), e.pool, func(ctx context.Context, tx pgx.Tx) error { return orders.ApplyEvent(ctx, tx, ev) }); err != nil {
			t.Fatal(err)
		}
		wantProblem(t, patch(t, o.Id.String(), etag, `{"description":"too late"}`), http.StatusPreconditionFailed, httpapi.CodePreconditionFailed)
		if d := description(t, o.Id.String()); d != "" {
			t.Errorf("description = %q, want unchanged", d)
		}
	})

	t.Run("MissingOrWeakIfMatchWritesNothing", func(t *testing.T) {
		o := e.newOrder(t, e.a, "inv-patch-4")
		etag := e.get(t, e.a.Key, "/v1/orders/"+o.Id.String()).header.Get("ETag")
		wantProblem(t, patch(t, o.Id.String(), "", `{"description":"x"}`), http.StatusPreconditionRequired, httpapi.CodePreconditionRequired)
		// A weak tag never matches (strong comparison), even the current
		// ETag marked weak, and the answer says so rather than claiming
		// the order changed.
		weak := wantProblem(t, patch(t, o.Id.String(), "W/"+etag, `{"description":"x"}`), http.StatusPreconditionFailed, httpapi.CodePreconditionFailed)
		if !strings.Contains(deref(weak.Detail), "weak tag") || strings.Contains(deref(weak.Detail), "changed") {
			t.Errorf("412 detail for a weak tag = %q, want it to say that weak tags cannot match", deref(weak.Detail))
		}
		if d := description(t, o.Id.String()); d != "" {
			t.Errorf("description = %q, want unchanged", d)
		}
		// One of several tags matching is enough; "*" matches any order.
		wantStatus(t, patch(t, o.Id.String(), `"stale", `+etag, `{"description":"listed"}`), http.StatusOK)
		wantStatus(t, patch(t, o.Id.String(), "*", `{"metadata":null}`), http.StatusOK)
		if d := description(t, o.Id.String()); d != "listed" {
			t.Errorf("description = %q, want listed (metadata null leaves it)", d)
		}
	})

	t.Run("OtherTenantsOrderIsNotFound", func(t *testing.T) {
		o := e.newOrder(t, e.a, "inv-patch-5")
		res := e.do(t, http.MethodPatch, "/v1/orders/"+o.Id.String(), e.b.Key, []byte(`{"description":"x"}`), withHeader("If-Match", "*"))
		wantProblem(t, res, http.StatusNotFound, httpapi.CodeNotFound)
		if d := description(t, o.Id.String()); d != "" {
			t.Errorf("description = %q, want unchanged", d)
		}
	})
}
