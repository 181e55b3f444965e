package idem

import "net/http"

// Endpoint is a route that takes an Idempotency-Key. A key is scoped by its
// endpoint (K2): one key sent to two endpoints is two keys.
type Endpoint struct {
	Method string
	// Route is the route template, path parameters in braces, not a path:
	// every payment's refunds share one endpoint.
	Route string
	// MultiStep marks an endpoint that leaves the database (a processor
	// call) and so runs on leases (lease.go); the completer resumes its
	// keys when the client goes away.
	MultiStep bool
}

// String is the name a key is scoped by and the metrics' endpoint label,
// such as "POST /v1/orders".
func (e Endpoint) String() string { return e.Method + " " + e.Route }

// The example domain's idempotent endpoints. A fork lists its own here.
var (
	CreateOrder   = Endpoint{Method: http.MethodPost, Route: "/v1/orders"}
	CreatePayment = Endpoint{Method: http.MethodPost, Route: "/v1/payments", MultiStep: true}
	CreateRefund  = Endpoint{Method: http.MethodPost, Route: "/v1/payments/{id}/refunds", MultiStep: true}
)

// Endpoints is every idempotent endpoint, the one table that the router,
// the key-status lookup, the completer and the client's tests read, so
// that an endpoint renamed or added in one place cannot leave keys scoped
// by a name the others do not know.
var Endpoints = []Endpoint{CreateOrder, CreatePayment, CreateRefund}
