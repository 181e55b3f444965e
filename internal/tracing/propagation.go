package tracing

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Traceparent is the W3C traceparent of the span in ctx, for a row that
// carries the trace past a commit (the outbox), or "" when ctx has no
// sampled span. Only traceparent is kept: tracestate is vendor data a row
// need not hold.
func Traceparent(ctx context.Context) string {
	carrier := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, carrier)
	return carrier.Get("traceparent")
}

// WithTraceparent returns ctx continuing the trace traceparent names, as
// the remote parent of the spans started from it; ctx unchanged when
// traceparent is "" or malformed.
func WithTraceparent(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return otel.GetTextMapPropagator().Extract(ctx, propagation.MapCarrier{"traceparent": traceparent})
}

// NATSHeader carries trace context in a NATS message's headers. NATS
// header names are case-sensitive (nats.Header.Get matches exactly), and
// W3C trace context names are lower-case on the wire, while a publisher
// that canonicalises (Go's http.Header, some clients and bridges) sends
// Traceparent (nats.go#1968): Get matches any case, as W3C asks of a
// receiver, and Set writes the lower-case name.
type NATSHeader nats.Header

var _ propagation.TextMapCarrier = NATSHeader{}

// Get returns the first value of key, whatever the case of its name.
func (h NATSHeader) Get(key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	for name, v := range h {
		if len(v) > 0 && strings.EqualFold(name, key) {
			return v[0]
		}
	}
	return ""
}

// Set sets key, lower-case as the propagator gives it.
func (h NATSHeader) Set(key, value string) { h[key] = []string{value} }

// Keys lists the header names.
func (h NATSHeader) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// InjectNATS writes the trace context of ctx into a message's headers.
func InjectNATS(ctx context.Context, h nats.Header) {
	otel.GetTextMapPropagator().Inject(ctx, NATSHeader(h))
}

// ExtractNATS returns ctx continuing the trace a message's headers carry.
func ExtractNATS(ctx context.Context, h nats.Header) context.Context {
	return otel.GetTextMapPropagator().Extract(ctx, NATSHeader(h))
}

// InTrace returns ctx when its span already belongs to the trace
// traceparent names, and otherwise ctx with traceparent as the remote
// parent: what a row written on behalf of a traced operation carries when
// the writer is not that operation's request (a payment finished by the
// processor's webhook, a trace of its own, or by the completer), so that
// what follows from the row stays in the operation's trace.
func InTrace(ctx context.Context, traceparent string) context.Context {
	stored := trace.SpanContextFromContext(WithTraceparent(context.Background(), traceparent))
	if !stored.IsValid() || trace.SpanContextFromContext(ctx).TraceID() == stored.TraceID() {
		return ctx
	}
	return WithTraceparent(ctx, traceparent)
}
