package httpapi_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/google/uuid"

	httpapi "github.com/idemref/payments/internal/http"
)

// ageKey moves the key's horizons (E3) into the past: the result's TTL,
// and with keyGone the key's retention too.
func (e *env) ageKey(t *testing.T, tenantID uuid.UUID, endpoint, key string, keyGone bool) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), `UPDATE idempotency_keys SET
		    expires_at = now() - interval '1 second',
		    retain_until = CASE WHEN $4 THEN now() - interval '1 second' ELSE retain_until END
		 WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3`, tenantID, endpoint, key, keyGone); err != nil {
		t.Fatal(err)
	}
}

// E3: an order's key past its TTL answers 409 idempotency_result_expired
// with the order it created, not a replay and not a second order; past the
// key's retention the request runs again and the natural-key backstop (N1)
// stops the duplicate order.
func TestOrderKeyAcrossTheTwoHorizons(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const key = "order-expiring"
	body := orderBody("inv-expiring")
	first := e.post(t, e.a.Key, key, body)
	wantStatus(t, first, http.StatusCreated)
	o := decodeOrder(t, first)
	e.wantRows(t, 1, 1)

	e.ageKey(t, e.a.ID, endpointOrders, key, false)
	res := e.post(t, e.a.Key, key, body)
	p := wantProblem(t, res, http.StatusConflict, httpapi.CodeResultExpired)
	if p.Resource != "/v1/orders/"+o.ID || p.OriginalStatus != http.StatusCreated {
		t.Errorf("resource %q, original_status %d; want /v1/orders/%s and 201", p.Resource, p.OriginalStatus, o.ID)
	}
	if res.header.Get(httpapi.ReplayedHeader) != "" {
		t.Error("a result_expired answer must not be marked as a replay")
	}
	e.wantRows(t, 1, 1)
	wantProblem(t, e.post(t, e.a.Key, key, orderBody("inv-other")), http.StatusUnprocessableEntity, httpapi.CodeKeyReused)

	e.ageKey(t, e.a.ID, endpointOrders, key, true)
	again := wantProblem(t, e.post(t, e.a.Key, key, body), http.StatusConflict, httpapi.CodeReferenceExists)
	if again.OrderID != o.ID {
		t.Errorf("order_id = %q, want the existing order %s", again.OrderID, o.ID)
	}
	e.wantRows(t, 1, 1) // the key row was claimed over, not added
	if n := e.countOrdersWithReference(t, e.a.ID, "inv-expiring"); n != 1 {
		t.Errorf("orders = %d, want 1", n)
	}
}

// E3 for a multi-step key: a payment whose result expired answers 409
// idempotency_result_expired naming the payment, and charges nothing.
func TestPaymentKeyResultExpired(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	o := e.newOrder(t, e.a, "inv-1")
	const key = "pay-expiring"
	body := payBody(o.ID, cardVisa)
	first := e.pay(t, e.a.Key, key, body)
	wantStatus(t, first, http.StatusCreated)
	p := decodePayment(t, first)
	calls := len(e.sim.Calls())

	e.ageKey(t, e.a.ID, endpointPayments, key, false)
	got := wantProblem(t, e.pay(t, e.a.Key, key, body), http.StatusConflict, httpapi.CodeResultExpired)
	if got.Resource != "/v1/payments/"+p.ID || got.OriginalStatus != http.StatusCreated {
		t.Errorf("resource %q, original_status %d; want /v1/payments/%s and 201", got.Resource, got.OriginalStatus, p.ID)
	}
	if n := len(e.sim.Calls()); n != calls {
		t.Errorf("processor calls = %d, want %d: nothing may run again", n, calls)
	}
	if n := e.netCharged(o.ID); n != orderAmount {
		t.Errorf("net charged = %d, want %d", n, orderAmount)
	}
}
