package tracing

import (
	"crypto/sha256"
	"encoding/hex"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// The idempotency vocabulary: the attributes a span carries about the key
// it served. OpenTelemetry has no convention for them; these are named
// once, here, and documented in docs/operations.md ("Traces") for others
// to adopt. None of them holds a key, an API key or a body.
const (
	// AttrOutcome is what became of the request under its key, the same
	// values as the idempotency_requests_total metric's outcome label:
	// executed, replayed, in_progress, mismatch (the key reused with
	// another request), result_expired, budget_exceeded,
	// conflicting_write, released_transient, takeover, failed.
	AttrOutcome = attribute.Key("idempotency.outcome")
	// AttrReplayed is true when the answer was a stored response.
	AttrReplayed = attribute.Key("idempotency.replayed")
	// AttrEndpoint is the key's scope: method and route template, such as
	// "POST /v1/orders".
	AttrEndpoint = attribute.Key("idempotency.endpoint")
	// AttrKeyHash is KeyHash of the Idempotency-Key: enough to find the
	// traces of one key the client names, never the key.
	AttrKeyHash = attribute.Key("idempotency.key_hash")
	// AttrProcessorKeyHash is KeyHash of the key derived for a processor
	// call (never the key: it is the processor's dedup handle).
	AttrProcessorKeyHash = attribute.Key("processor.idempotency_key_hash")
)

// KeyHash is the hex SHA-256 of a key, what the attributes carry in its
// place: printf %s "$KEY" | sha256sum finds it. A key is the client's
// secret handle on an operation; its hash names it without handing it to
// whoever reads the traces.
func KeyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// Idempotency puts the key's scope on span: its endpoint and the hash of
// key.
func Idempotency(span trace.Span, endpoint, key string) {
	span.SetAttributes(AttrEndpoint.String(endpoint), AttrKeyHash.String(KeyHash(key)))
}

// Outcome puts the outcome under the key on span.
func Outcome(span trace.Span, outcome string, replayed bool) {
	span.SetAttributes(AttrOutcome.String(outcome), AttrReplayed.Bool(replayed))
}
