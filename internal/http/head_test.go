package httpapi_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/idemref/payments/client/api"
)

// RFC 9110 section 9.3.2: every GET route answers HEAD with the status and
// headers a GET would get, and no body; a 405 lists HEAD wherever it lists
// GET.
func TestEveryGetRouteAnswersHead(t *testing.T) {
	e := setup(t, withProcessor())
	o := decodeOrder(t, e.post(t, e.a.Key, "head-order", orderBody("head-1")))
	pay := e.pay(t, e.a.Key, "head-pay", payBody(o.Id.String(), cardVisa))
	var paid api.Payment
	if err := json.Unmarshal(pay.body, &paid); err != nil || paid.Id == (api.Uuid{}) {
		t.Fatalf("payment = %d %s: %v", pay.status, pay.body, err)
	}
	for _, path := range []string{
		"/healthz", "/readyz", "/openapi.yaml", "/docs",
		"/v1/orders", "/v1/orders/" + o.Id.String(), "/v1/payments", "/v1/payments/" + paid.Id.String(),
		"/v1/idempotency-keys/head-order?endpoint=POST%20/v1/orders",
		"/v1/orders/00000000-0000-4000-8000-000000000000", // a 404 is a 404 for HEAD too
	} {
		get := e.do(t, http.MethodGet, path, e.a.Key, nil)
		head := e.do(t, http.MethodHead, path, e.a.Key, nil)
		if head.status != get.status || len(head.body) != 0 {
			t.Errorf("HEAD %s = %d with %d body bytes; GET = %d: want GET's status and no body", path, head.status, len(head.body), get.status)
		}
		for _, h := range []string{"Content-Type", "Cache-Control", "ETag", "X-Content-Type-Options"} {
			if head.header.Get(h) != get.header.Get(h) {
				t.Errorf("HEAD %s: %s = %q, GET's = %q", path, h, head.header.Get(h), get.header.Get(h))
			}
		}
	}
	res := e.do(t, http.MethodDelete, "/v1/orders/"+o.Id.String(), e.a.Key, nil)
	if allow := res.header.Get("Allow"); res.status != http.StatusMethodNotAllowed || !strings.Contains(allow, "GET, HEAD") {
		t.Errorf("DELETE /v1/orders/{id} = %d, Allow %q; want 405 listing GET, HEAD", res.status, allow)
	}
}
