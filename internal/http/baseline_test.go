//go:build !loadtest

package httpapi_test

import (
	"net/http"
	"testing"
)

// The load benchmark's baseline (baseline_loadtest.go) creates orders
// without an idempotency key; it must not exist in the normal build.
func TestBaselineRouteIsNotInTheNormalBuild(t *testing.T) {
	t.Parallel()
	e := setup(t)
	res := e.do(t, http.MethodPost, "/v1/_baseline/orders", e.a.Key, []byte(orderBody("base-1")))
	wantProblem(t, res, http.StatusNotFound, "not_found")
}
