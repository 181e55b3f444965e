package httpapi_test

import "github.com/getkin/kin-openapi/openapi3filter"

// GET /openapi.yaml answers YAML text, declared in openapi.yaml as
// `type: string` (as Prism, which validates the raw text, requires).
// kin-openapi would decode application/yaml into a mapping and compare
// that with the schema, so the contract tests read it as text, like the
// docs page and its script (textBody, contract_test.go).
func init() {
	openapi3filter.RegisterBodyDecoder("application/yaml", textBody)
}
