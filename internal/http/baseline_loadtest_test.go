//go:build loadtest

package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/idemref/payments/client/api"
	httpapi "github.com/idemref/payments/internal/http"
)

// The load benchmark's baseline creates the order as POST /v1/orders does,
// with the same authentication, validation and answer, and no key row.
func TestBaselineCreate(t *testing.T) {
	t.Parallel()
	e := setup(t)
	count := func(sql string) int {
		t.Helper()
		var n int
		if err := e.pool.QueryRow(context.Background(), sql, e.a.ID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	t.Run("CreatesTheOrderWithoutAKey", func(t *testing.T) {
		res := e.do(t, http.MethodPost, httpapi.BaselineOrdersPath, e.a.Key, []byte(orderBody("base-1")))
		if res.status != http.StatusCreated {
			t.Fatalf("status %d: %s", res.status, res.body)
		}
		var o api.Order
		if err := json.Unmarshal(res.body, &o); err != nil || o.Reference != "base-1" {
			t.Fatalf("body %s: %v", res.body, err)
		}
		if got, want := res.header.Get("Location"), "/v1/orders/"+o.Id.String(); got != want {
			t.Errorf("Location = %q, want %q", got, want)
		}
		if n := count(`SELECT count(*) FROM orders WHERE tenant_id = $1 AND reference = 'base-1'`); n != 1 {
			t.Errorf("orders = %d, want 1", n)
		}
		if n := count(`SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1`); n != 0 {
			t.Errorf("key rows = %d, want 0", n)
		}
		// The order is an ordinary order: the idempotent API reads it.
		if got := e.get(t, e.a.Key, "/v1/orders/"+o.Id.String()); got.status != http.StatusOK {
			t.Errorf("GET the baseline's order: %d %s", got.status, got.body)
		}
	})

	t.Run("AuthenticatesAndValidatesLikeTheRealCreate", func(t *testing.T) {
		if res := e.do(t, http.MethodPost, httpapi.BaselineOrdersPath, "", []byte(orderBody("base-2"))); res.status != http.StatusUnauthorized {
			t.Errorf("without an API key: %d, want 401", res.status)
		}
		bad := `{"reference":"base-3","customer_id":"cus_1","amount":-5,"currency":"EUR"}`
		if res := e.do(t, http.MethodPost, httpapi.BaselineOrdersPath, e.a.Key, []byte(bad)); res.status != http.StatusBadRequest {
			t.Errorf("negative amount: %d, want 400", res.status)
		}
		if res := e.do(t, http.MethodPost, httpapi.BaselineOrdersPath, e.a.Key, []byte(orderBody("base-1"))); res.status != http.StatusConflict {
			t.Errorf("a reference that exists: %d, want 409 (the backstop)", res.status)
		}
		if n := count(`SELECT count(*) FROM orders WHERE tenant_id = $1`); n != 1 {
			t.Errorf("orders = %d, want 1", n)
		}
	})
}

// The payment baseline pays an order as POST /v1/payments does, with the
// same checks, rows and answer, and no key row.
func TestBaselinePayment(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	count := func(sql string) int {
		t.Helper()
		var n int
		if err := e.pool.QueryRow(context.Background(), sql, e.a.ID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	created := e.post(t, e.a.Key, "bp-order", orderBody("bp-1"))
	var o api.Order
	if err := json.Unmarshal(created.body, &o); err != nil {
		t.Fatal(err)
	}

	t.Run("PaysTheOrderWithoutAKey", func(t *testing.T) {
		res := e.do(t, http.MethodPost, httpapi.BaselinePaymentsPath, e.a.Key, []byte(payBody(o.Id.String(), "pm_card_visa")))
		if res.status != http.StatusCreated {
			t.Fatalf("status %d: %s", res.status, res.body)
		}
		var p api.Payment
		if err := json.Unmarshal(res.body, &p); err != nil || p.Status != "succeeded" || p.OrderId != o.Id {
			t.Fatalf("body %s: %v", res.body, err)
		}
		if got, want := res.header.Get("Location"), "/v1/payments/"+p.Id.String(); got != want {
			t.Errorf("Location = %q, want %q", got, want)
		}
		if n := count(`SELECT count(*) FROM payments WHERE tenant_id = $1 AND status = 'succeeded' AND charge_id IS NOT NULL`); n != 1 {
			t.Errorf("succeeded payments = %d, want 1", n)
		}
		if n := count(`SELECT count(*) FROM outbox WHERE tenant_id = $1 AND event_type = 'payment.succeeded'`); n != 1 {
			t.Errorf("payment.succeeded events = %d, want 1", n)
		}
		if n := count(`SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1 AND endpoint <> 'POST /v1/orders'`); n != 0 {
			t.Errorf("key rows = %d, want 0", n)
		}
	})

	t.Run("ChecksLikeTheRealPayment", func(t *testing.T) {
		if res := e.do(t, http.MethodPost, httpapi.BaselinePaymentsPath, e.a.Key, []byte(payBody(o.Id.String(), "pm_card_visa"))); res.status != http.StatusConflict {
			t.Errorf("a second payment of the order: %d %s, want 409", res.status, res.body)
		}
		if res := e.do(t, http.MethodPost, httpapi.BaselinePaymentsPath, "", []byte(payBody(o.Id.String(), "pm_card_visa"))); res.status != http.StatusUnauthorized {
			t.Errorf("without an API key: %d, want 401", res.status)
		}
		if n := count(`SELECT count(*) FROM payments WHERE tenant_id = $1`); n != 1 {
			t.Errorf("payments = %d, want 1", n)
		}
	})
}
