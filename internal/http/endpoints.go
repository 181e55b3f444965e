package httpapi

import (
	"net/http"

	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/payments"
)

// createOrderEndpoint is POST /v1/orders. It runs in one transaction, so
// nothing outside this package scopes a key by it, and internal/orders,
// which knows nothing of HTTP or keys, does not declare it.
var createOrderEndpoint = idem.Endpoint{Method: http.MethodPost, Route: "/v1/orders"}

// Endpoints is every idempotent endpoint, the one table that the router,
// the key-status lookup and the tests (this package's, the client's, the
// contract's) read, so that an endpoint renamed or added in one place
// cannot leave keys scoped by a name the others do not know. A fork lists
// its own here. The multi-step ones are the domain's: internal/payments
// declares them, because its completer resumes their keys.
var Endpoints = []idem.Endpoint{createOrderEndpoint, payments.CreatePayment, payments.CreateRefund}
