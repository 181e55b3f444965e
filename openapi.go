// Package apispec embeds the API's contract, openapi.yaml, and the README's
// configuration table at the module's root, beside the files they come from.
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

import (
	_ "embed"
	"strings"
)

// OpenAPI is the OpenAPI 3.1 description of the API (openapi.yaml), served
// unauthenticated at GET /openapi.yaml. It is the authoritative statement of
// the idempotency contract: key scope, request fingerprinting, which outcomes
// are recorded and replayed, retention and lock-timeout behaviour.
//
//go:embed openapi.yaml
var OpenAPI []byte

//go:embed README.md
var readme string

// Configuration is the README's configuration table, every environment
// variable with its default and meaning: `api help` prints it, so the help
// and the README cannot disagree.
func Configuration() string {
	_, rest, ok := strings.Cut(readme, "\n## Configuration\n")
	if !ok {
		return ""
	}
	section, _, _ := strings.Cut(rest, "\n## ")
	return strings.TrimSpace(section) + "\n"
}
