package httpapi_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemref/payments/client/api"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/tooling/processorsim"
)

// ageKey moves the key's horizons into the past: the result's TTL,
// and with keyGone the key's retention too.
func (e *bundle) ageKey(t *testing.T, tenantID uuid.UUID, endpoint, key string, keyGone bool) {
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
	expires, err := http.ParseTime(first.header.Get("Idempotency-Expires"))
	if err != nil {
		t.Fatalf("Idempotency-Expires = %q: %v", first.header.Get("Idempotency-Expires"), err)
	}
	if d := time.Until(expires); d < 23*time.Hour || d > 25*time.Hour {
		t.Errorf("Idempotency-Expires is %s away, want the 24 h TTL", d)
	}
	if got := e.post(t, e.a.Key, key, body).header.Get("Idempotency-Expires"); got != first.header.Get("Idempotency-Expires") {
		t.Errorf("replay's Idempotency-Expires = %q, want the first answer's %q", got, first.header.Get("Idempotency-Expires"))
	}

	e.ageKey(t, e.a.ID, endpointOrders, key, false)
	res := e.post(t, e.a.Key, key, body)
	p := wantProblem(t, res, http.StatusConflict, httpapi.CodeResultExpired)
	if deref(p.Resource) != "/v1/orders/"+o.Id.String() || deref(p.OriginalStatus) != http.StatusCreated {
		t.Errorf("resource %q, original_status %d; want /v1/orders/%s and 201", deref(p.Resource), deref(p.OriginalStatus), o.Id.String())
	}
	if res.header.Get(httpapi.ReplayedHeader) != "" {
		t.Error("a result_expired answer must not be marked as a replay")
	}
	e.wantRows(t, 1, 1)
	wantProblem(t, e.post(t, e.a.Key, key, orderBody("inv-other")), http.StatusUnprocessableEntity, httpapi.CodeKeyReused)

	e.ageKey(t, e.a.ID, endpointOrders, key, true)
	again := wantProblem(t, e.post(t, e.a.Key, key, body), http.StatusConflict, httpapi.CodeReferenceExists)
	if idString(again.OrderId) != o.Id.String() {
		t.Errorf("order_id = %q, want the existing order %s", idString(again.OrderId), o.Id.String())
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
	body := payBody(o.Id.String(), cardVisa)
	first := e.pay(t, e.a.Key, key, body)
	wantStatus(t, first, http.StatusCreated)
	p := decodePayment(t, first)
	calls := len(e.sim.Calls())

	e.ageKey(t, e.a.ID, endpointPayments, key, false)
	got := wantProblem(t, e.pay(t, e.a.Key, key, body), http.StatusConflict, httpapi.CodeResultExpired)
	if deref(got.Resource) != "/v1/payments/"+p.Id.String() || deref(got.OriginalStatus) != http.StatusCreated {
		t.Errorf("resource %q, original_status %d; want /v1/payments/%s and 201", deref(got.Resource), deref(got.OriginalStatus), p.Id.String())
	}
	if n := len(e.sim.Calls()); n != calls {
		t.Errorf("processor calls = %d, want %d: nothing may run again", n, calls)
	}
	if n := e.netCharged(o.Id.String()); n != orderAmount {
		t.Errorf("net charged = %d, want %d", n, orderAmount)
	}
}

func statusPath(key, endpoint string) string {
	return "/v1/idempotency-keys/" + url.PathEscape(key) + "?endpoint=" + url.QueryEscape(endpoint)
}

// E4: a client asks what became of its key: in progress (with the
// recovery point and the payment), completed (status and resource),
// result expired; never the body. Another tenant's key, a forgotten key
// and an unknown one are 404; an endpoint that takes no keys is 400.
func TestKeyStatus(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	const orderKey = "status/order?1" // a slash and a question mark, path-escaped
	created := e.post(t, e.a.Key, orderKey, orderBody("inv-status"))
	wantStatus(t, created, http.StatusCreated)
	o := decodeOrder(t, created)

	get := func(t *testing.T, apiKey, key, endpoint string) (response, api.IdempotencyKeyStatus) {
		t.Helper()
		res := e.get(t, apiKey, statusPath(key, endpoint))
		var st api.IdempotencyKeyStatus
		if res.status == http.StatusOK {
			decodeJSON(t, res, &st)
			if res.header.Get("Cache-Control") != "no-store" {
				t.Errorf("Cache-Control = %q, want no-store", res.header.Get("Cache-Control"))
			}
		}
		return res, st
	}

	t.Run("Completed", func(t *testing.T) {
		res, st := get(t, e.a.Key, orderKey, endpointOrders)
		wantStatus(t, res, http.StatusOK)
		if st.Key != orderKey || st.Endpoint != endpointOrders || st.State != "completed" ||
			st.ResponseStatus == nil || *st.ResponseStatus != 201 || st.Resource == nil || *st.Resource != "/v1/orders/"+o.Id.String() ||
			st.CompletedAt == nil || st.ExpiresAt.IsZero() || st.RetainUntil.IsZero() {
			t.Errorf("status = %+v", st)
		}
		if strings.Contains(string(res.body), "inv-status") {
			t.Errorf("the status shows the stored body: %s", res.body)
		}
	})

	t.Run("InProgressPayment", func(t *testing.T) {
		po := e.newOrder(t, e.a, "inv-pay")
		e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultServerError})
		wantStatus(t, e.pay(t, e.a.Key, "pay-status", payBody(po.Id.String(), cardVisa)), http.StatusServiceUnavailable)
		row := e.onePayment(t, po.Id.String())
		res, st := get(t, e.a.Key, "pay-status", endpointPayments)
		wantStatus(t, res, http.StatusOK)
		if st.State != "in_progress" || st.RecoveryPoint == nil || *st.RecoveryPoint != "charge_sent" ||
			st.ResponseStatus != nil || st.Resource == nil || *st.Resource != "/v1/payments/"+row.ID || st.CompletedAt != nil {
			t.Errorf("status = %+v", st)
		}
	})

	t.Run("OtherTenantUnknownAndBadEndpoint", func(t *testing.T) {
		res, _ := get(t, e.b.Key, orderKey, endpointOrders)
		wantProblem(t, res, http.StatusNotFound, httpapi.CodeNotFound)
		res, _ = get(t, e.a.Key, "never-used", endpointOrders)
		wantProblem(t, res, http.StatusNotFound, httpapi.CodeNotFound)
		res, _ = get(t, e.a.Key, orderKey, "POST /v1/orders/{id}")
		wantProblem(t, res, http.StatusBadRequest, httpapi.CodeInvalidQuery)
		res, _ = get(t, e.a.Key, orderKey, endpointPayments) // same key, other endpoint (K2)
		wantProblem(t, res, http.StatusNotFound, httpapi.CodeNotFound)
	})

	t.Run("ResultExpiredThenForgotten", func(t *testing.T) {
		e.ageKey(t, e.a.ID, endpointOrders, orderKey, false)
		res, st := get(t, e.a.Key, orderKey, endpointOrders)
		wantStatus(t, res, http.StatusOK)
		if st.State != "result_expired" || st.Resource == nil || *st.Resource != "/v1/orders/"+o.Id.String() {
			t.Errorf("status = %+v, want result_expired with the order", st)
		}
		e.ageKey(t, e.a.ID, endpointOrders, orderKey, true)
		res, _ = get(t, e.a.Key, orderKey, endpointOrders)
		wantProblem(t, res, http.StatusNotFound, httpapi.CodeNotFound)
	})
}
