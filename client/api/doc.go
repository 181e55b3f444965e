// Package api is generated from openapi.yaml by oapi-codegen (see
// oapi-codegen.yaml; `make generate` writes it, `make verify` fails when it
// is stale): the request and response types of the /v1 API and one method
// per operation, without retries. Use package client, which wraps it with
// the idempotency keys and the retry policy the server expects.
package api
