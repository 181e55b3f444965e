// Package apispec embeds the API's contract, openapi.yaml, at the module's
// root, beside the file it comes from.
//
// The module is a reference payments REST API that demonstrates idempotency
// keys done right: every mutating request carries an Idempotency-Key, the key
// claim, the business write and the recorded response commit in one
// transaction, and retries of the same request are answered by replaying the
// recorded response byte for byte. Start reading at internal/idem/doc.go.
//
// The package's name is not the last element of its import path (the
// module's), so importers name it explicitly, as goimports writes it:
//
//	import apispec "github.com/idemref/payments"
package apispec

import _ "embed"

// OpenAPI is the OpenAPI 3.1 description of the API (openapi.yaml), served
// unauthenticated at GET /openapi.yaml. It is the authoritative statement of
// the idempotency contract: key scope, request fingerprinting, which outcomes
// are recorded and replayed, retention and lock-timeout behaviour.
//
//go:embed openapi.yaml
var OpenAPI []byte
