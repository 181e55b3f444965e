package idem

import "testing"

func TestEndpointString(t *testing.T) {
	e := Endpoint{Method: "POST", Route: "/v1/payments/{id}/refunds", MultiStep: true}
	if got, want := e.String(), "POST /v1/payments/{id}/refunds"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}
