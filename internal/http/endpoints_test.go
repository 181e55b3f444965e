package httpapi_test

import (
	"net/http"
	"net/url"
	"regexp"
	"testing"

	"github.com/google/uuid"

	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
)

// routeParam is a path parameter of a route template, such as {id}.
var routeParam = regexp.MustCompile(`\{[^/}]+\}`)

// pathOf fills every parameter of a route template with a fresh UUID, the
// form every path parameter of this API takes.
func pathOf(route string) string {
	return routeParam.ReplaceAllStringFunc(route, func(string) string { return uuid.NewString() })
}

// Every endpoint of idem.Endpoints is routed, at its method and route, to a
// handler that scopes keys by the endpoint's name: a request without a key
// is rejected as one (not 404 or 405), and counted under that name. A route
// renamed in the router or in the table alone fails here.
//
// The counters are process-wide, so this test does not call t.Parallel():
// the deltas it measures are its own.
func TestIdempotentRoutesFollowTable(t *testing.T) {
	e := setup(t)
	before := e.scrape(t)
	for _, ep := range idem.Endpoints {
		res := e.do(t, ep.Method, pathOf(ep.Route), e.a.Key, []byte(`{}`))
		wantProblem(t, res, http.StatusBadRequest, httpapi.CodeKeyMissing)
	}
	after := e.scrape(t)
	for _, ep := range idem.Endpoints {
		sample := `idempotency_requests_total{endpoint="` + ep.String() + `",outcome="rejected_before_claim"}`
		if got := after[sample] - before[sample]; got != 1 {
			t.Errorf("%s counted %v rejections, want 1: its handler scopes keys by another name", ep, got)
		}
	}
}

// The key-status lookup (E4) accepts exactly the names of idem.Endpoints:
// an unknown key under each is 404, and a route that takes no key is 400.
func TestKeyStatusAcceptsTableEndpoints(t *testing.T) {
	t.Parallel()
	e := setup(t)
	lookup := func(endpoint string) response {
		return e.get(t, e.a.Key, "/v1/idempotency-keys/unknown?endpoint="+url.QueryEscape(endpoint))
	}
	for _, ep := range idem.Endpoints {
		if res := lookup(ep.String()); res.status != http.StatusNotFound {
			t.Errorf("status of an unknown key of %s = %d, want 404; body: %s", ep, res.status, res.body)
		}
	}
	if res := lookup("GET /v1/orders"); res.status != http.StatusBadRequest {
		t.Errorf("status under GET /v1/orders = %d, want 400; body: %s", res.status, res.body)
	}
}
