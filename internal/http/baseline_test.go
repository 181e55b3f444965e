//go:build !loadtest

package httpapi_test

import (
	"net/http"
	"testing"

	"github.com/idemref/payments/internal/idem"
)

// The load benchmark's routes (loadtestRoutes: the baselines of
// baseline_loadtest.go create without an idempotency key, the claim-first
// peer of claimfirst_loadtest.go) must not exist in the normal build.
func TestLoadtestRoutesAreNotInTheNormalBuild(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	order := e.newOrder(t, e.a, "base-pay")
	for _, c := range []struct{ name, path, body string }{
		{"BaselineOrders", "/v1/_baseline/orders", orderBody("base-1")},
		{"BaselinePayments", "/v1/_baseline/payments", payBody(order.Id.String(), cardVisa)},
		{"ClaimFirstOrders", "/v1/_claimfirst/orders", orderBody("base-2")},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := e.do(t, http.MethodPost, c.path, e.a.Key, []byte(c.body), withHeader(idem.HeaderName, "key-"+c.name))
			wantProblem(t, res, http.StatusNotFound, "not_found")
		})
	}
}
