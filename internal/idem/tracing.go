package idem

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemref/payments/internal/tracing"
)

// Spans of the idempotency layer (X3, X4). Execute is one span with a
// child per step; Begin one with its claim, its first phase and its
// record; each Phase one with its record; all of them under the span of
// the request (or job) only, never as roots (startSpan). The outcome
// under the key (idempotency_requests_total's outcome label), the replay
// flag, the endpoint and the key's hash go on the layer's span and on the
// span the caller ran in (the HTTP server span), so that a search by
// idempotency.outcome or idempotency.key_hash finds the request itself.
// No span holds a key: only tracing.KeyHash of it.
const (
	spanExecute = "idempotency.execute"
	// spanLookup: step 1's read of the key (and a lost race's).
	spanLookup = "idempotency.lookup"
	// spanRun: the request's own work (in a multi-step claim, in its savepoint).
	spanRun = "idempotency.run"
	// spanRecord: the statement that records the key, COMMIT with it.
	spanRecord = "idempotency.record"
	spanBegin  = "idempotency.begin"
	// spanClaim: a multi-step key's claim, or the takeover of an existing
	// one.
	spanClaim = "idempotency.claim"
	spanPhase = "idempotency.phase"
)

// attrRecoveryPoint is the recovery point a phase starts from.
const attrRecoveryPoint = attribute.Key("idempotency.recovery_point")

// startSpan starts a span of the layer under the span of ctx, when that
// one records. A request that is not traced (tracing off, or not sampled)
// pays a context lookup and no more: the span of ctx, which records
// nothing, stands in (its End does nothing), where a span started on the
// global no-op tracer would cost a few hundred nanoseconds and allocations
// each, four or five times a request.
func startSpan(ctx context.Context, name string) (context.Context, trace.Span) {
	if parent := trace.SpanFromContext(ctx); !parent.IsRecording() {
		return ctx, parent
	}
	return tracing.Tracer().Start(ctx, name)
}

// traceOutcome puts the outcome under c's key on span, the layer's own,
// and on caller, the span the request ran in; the key is hashed once, and
// only when one of them records. A failure of ours (failed, or a
// transient one) marks span as an error; a refusal the client caused (in
// progress, mismatch, ...) does not.
func traceOutcome(caller, span trace.Span, c Claim, outcome string, replayed bool) {
	if !span.IsRecording() && !caller.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{
		tracing.AttrEndpoint.String(c.Endpoint),
		tracing.AttrKeyHash.String(tracing.KeyHash(c.Key)),
		tracing.AttrOutcome.String(outcome),
		tracing.AttrReplayed.Bool(replayed),
	}
	span.SetAttributes(attrs...)
	caller.SetAttributes(attrs...)
	if outcome == outcomeFailed || outcome == outcomeReleasedTransient {
		span.SetStatus(codes.Error, outcome)
	}
}
