package repocheck

import (
	"slices"
	"testing"

	httpapi "github.com/idemref/payments/internal/http"
)

// The contract's list of idempotent endpoints (the key-status endpoint's
// `endpoint` parameter, from which the client's enum is generated) is the
// route table's: a fork that adds an endpoint to httpapi.Endpoints and not to
// openapi.yaml, or the other way round, fails here.
func TestContractListsTheIdempotentEndpoints(t *testing.T) {
	doc := loadOpenAPI(t)
	op := doc.Paths.Find("/v1/idempotency-keys/{key}").Get
	param := op.Parameters.GetByInAndName("query", "endpoint")
	if param == nil {
		t.Fatal("GET /v1/idempotency-keys/{key} has no endpoint query parameter")
	}
	var contract []string
	for _, v := range param.Schema.Value.Enum {
		contract = append(contract, v.(string))
	}
	var table []string
	for _, e := range httpapi.Endpoints {
		table = append(table, e.String())
	}
	slices.Sort(contract)
	slices.Sort(table)
	if !slices.Equal(contract, table) {
		t.Errorf("openapi.yaml's endpoint enum = %q, httpapi.Endpoints = %q", contract, table)
	}
}
