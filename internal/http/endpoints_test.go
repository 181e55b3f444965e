package httpapi_test

import (
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/payments"
)

// TestEndpoints checks the table's own rules: each endpoint is listed once,
// under a method that can carry a key, with a route template of this API;
// and its multi-step endpoints are those the completer resumes
// (payments.Endpoints), since a multi-step key nothing resumes would stay
// at its recovery point when its client goes away.
func TestEndpoints(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, e := range httpapi.Endpoints {
		name := e.String()
		if seen[name] {
			t.Errorf("%s is listed twice", name)
		}
		seen[name] = true
		switch e.Method {
		case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		default:
			t.Errorf("%s: method %q does not mutate, so it takes no key", name, e.Method)
		}
		if !strings.HasPrefix(e.Route, "/v1/") || strings.HasSuffix(e.Route, "/") {
			t.Errorf("%s: route %q is not a template under /v1 without a trailing slash", name, e.Route)
		}
		if e.MultiStep != slices.Contains(payments.Endpoints, e) {
			t.Errorf("%s: multi-step %v, but the completer resumes payments.Endpoints %v", name, e.MultiStep, payments.Endpoints)
		}
	}
	for _, e := range payments.Endpoints {
		if !slices.Contains(httpapi.Endpoints, e) {
			t.Errorf("the completer resumes %s, which the table does not route", e)
		}
	}
}

// routeParam is a path parameter of a route template, such as {id}.
var routeParam = regexp.MustCompile(`\{[^/}]+\}`)

// pathOf fills every parameter of a route template with a fresh UUID, the
// form every path parameter of this API takes.
func pathOf(route string) string {
	return routeParam.ReplaceAllStringFunc(route, func(string) string { return uuid.NewString() })
}

// Every endpoint of httpapi.Endpoints is routed, at its method and route, to a
// handler that scopes keys by the endpoint's name: a request without a key
// is rejected as one (not 404 or 405), and counted under that name. A route
// renamed in the router or in the table alone fails here.
//
// The counters are process-wide, so this test does not call t.Parallel():
// the deltas it measures are its own.
func TestIdempotentRoutesFollowTable(t *testing.T) {
	e := setup(t)
	before := e.scrape(t)
	for _, ep := range httpapi.Endpoints {
		res := e.do(t, ep.Method, pathOf(ep.Route), e.a.Key, []byte(`{}`))
		wantProblem(t, res, http.StatusBadRequest, httpapi.CodeKeyMissing)
	}
	after := e.scrape(t)
	for _, ep := range httpapi.Endpoints {
		sample := `idempotency_requests_total{endpoint="` + ep.String() + `",outcome="rejected_before_claim"}`
		if got := after[sample] - before[sample]; got != 1 {
			t.Errorf("%s counted %v rejections, want 1: its handler scopes keys by another name", ep, got)
		}
	}
}

// The key-status lookup (E4) accepts exactly the names of httpapi.Endpoints:
// an unknown key under each is 404, and a route that takes no key is 400.
func TestKeyStatusAcceptsTableEndpoints(t *testing.T) {
	t.Parallel()
	e := setup(t)
	lookup := func(endpoint string) response {
		return e.get(t, e.a.Key, "/v1/idempotency-keys/unknown?endpoint="+url.QueryEscape(endpoint))
	}
	for _, ep := range httpapi.Endpoints {
		if res := lookup(ep.String()); res.status != http.StatusNotFound {
			t.Errorf("status of an unknown key of %s = %d, want 404; body: %s", ep, res.status, res.body)
		}
	}
	if res := lookup("GET /v1/orders"); res.status != http.StatusBadRequest {
		t.Errorf("status under GET /v1/orders = %d, want 400; body: %s", res.status, res.body)
	}
}
