package idem

// Endpoint is a route that takes an Idempotency-Key. A key is scoped by its
// endpoint: one key sent to two endpoints is two keys.
//
// The pattern declares no endpoint. A domain package declares those whose
// keys it runs outside HTTP (in the example, internal/payments the payment
// and the refund, which its completer resumes), and the edge lists every
// one in the table that the router and the key-status lookup read
// (Endpoints in internal/http).
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
