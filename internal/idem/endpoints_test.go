package idem

import (
	"net/http"
	"strings"
	"testing"
)

// TestEndpoints checks the table's own rules: each endpoint is listed once,
// under a method that can carry a key, with a route template of this API.
func TestEndpoints(t *testing.T) {
	seen := map[string]bool{}
	for _, e := range Endpoints {
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
	}
}

func TestEndpointString(t *testing.T) {
	if got, want := CreateRefund.String(), "POST /v1/payments/{id}/refunds"; got != want {
		t.Errorf("CreateRefund.String() = %q, want %q", got, want)
	}
}
