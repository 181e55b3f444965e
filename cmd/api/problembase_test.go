package main

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/idemref/payments/internal/tooling/testdb"
)

// PROBLEM_BASE_URL points every problem's type at a deployment's own
// documentation: the server's answers carry it, as set.
func TestProblemBaseURLIsTheDeployments(t *testing.T) {
	t.Parallel()
	_, url := testdb.NewPool(t)
	api := startServer(t, url, "PROBLEM_BASE_URL=https://docs.example.org/problems#")
	res, err := http.Get(api.base + "/v1/orders")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var p struct{ Type, Code string }
	if err := json.NewDecoder(res.Body).Decode(&p); err != nil {
		t.Fatal(err)
	}
	if p.Code != "unauthorized" || p.Type != "https://docs.example.org/problems#unauthorized" {
		t.Errorf("problem %+v, want type https://docs.example.org/problems#unauthorized", p)
	}
}
