package tracing_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemref/payments/internal/tracing"
)

func TestEnabled(t *testing.T) {
	for _, tt := range []struct {
		name string
		env  map[string]string
		want bool
	}{
		{"NothingSet", nil, false},
		{"Endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, true},
		{"TracesEndpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, true},
		{"ExporterOTLP", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{"ExporterNone", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, false},
		{"SDKDisabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, false},
		{"ServiceNameAlone", map[string]string{"OTEL_SERVICE_NAME": "payments"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tracing.Enabled(func(k string) string { return tt.env[k] }); got != tt.want {
				t.Errorf("Enabled = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSetupRefusesAProtocolItCannotSpeak(t *testing.T) {
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
	if _, err := tracing.Setup(context.Background(), func(k string) string { return env[k] }, "test"); err == nil {
		t.Fatal("Setup with OTEL_EXPORTER_OTLP_PROTOCOL=grpc succeeded, want an error naming the variable")
	}
}

// A traceparent travels through a row (Traceparent, WithTraceparent) and
// through NATS headers whatever the case of the header's name: the W3C
// name is lower-case, and a publisher that canonicalises sends
// Traceparent (nats.go#1968). Mutation: make NATSHeader.Get an exact
// match and the Canonical case fails.
func TestTraceContextCrossesRowsAndMessages(t *testing.T) {
	otel.SetTextMapPropagator(propagation.TraceContext{})
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	defer span.End()
	want := span.SpanContext()

	row := tracing.Traceparent(ctx)
	if row == "" {
		t.Fatal("Traceparent of a sampled span is empty")
	}
	if got := trace.SpanContextFromContext(tracing.WithTraceparent(context.Background(), row)); got.TraceID() != want.TraceID() || got.SpanID() != want.SpanID() || !got.IsRemote() {
		t.Errorf("WithTraceparent(%q) = %v, want the span %v as a remote parent", row, got, want)
	}
	if got := tracing.Traceparent(context.Background()); got != "" {
		t.Errorf("Traceparent without a span = %q, want empty", got)
	}
	if got := tracing.WithTraceparent(context.Background(), "garbage"); trace.SpanContextFromContext(got).IsValid() {
		t.Error("a malformed traceparent gave a valid parent")
	}

	h := nats.Header{}
	tracing.InjectNATS(ctx, h)
	if h.Get("traceparent") != row {
		t.Fatalf("InjectNATS wrote %v, want traceparent %q", h, row)
	}
	for name, header := range map[string]nats.Header{
		"LowerCase": {"traceparent": {row}},
		"Canonical": {"Traceparent": {row}},
		"UpperCase": {"TRACEPARENT": {row}},
	} {
		t.Run(name, func(t *testing.T) {
			if got := trace.SpanContextFromContext(tracing.ExtractNATS(context.Background(), header)); got.TraceID() != want.TraceID() {
				t.Errorf("ExtractNATS(%v) continued trace %s, want %s", header, got.TraceID(), want.TraceID())
			}
		})
	}
}

func TestKeyHashIsSHA256Hex(t *testing.T) {
	// printf %s 'order-1001' | sha256sum
	if got, want := tracing.KeyHash("order-1001"), "50ac93f41009bb5828fbeb9b39ca5129a5888ba493196a343d69c38b2df5a412"; got != want {
		t.Errorf("KeyHash = %q, want %q", got, want)
	}
}

// A row written for an operation by another trace (the processor's
// webhook finishing a payment) carries the operation's trace; one written
// in the operation's own trace keeps its more precise parent.
func TestInTraceKeepsTheOperationsTrace(t *testing.T) {
	otel.SetTextMapPropagator(propagation.TraceContext{})
	tp := sdktrace.NewTracerProvider()
	opCtx, op := tp.Tracer("test").Start(context.Background(), "payment request")
	defer op.End()
	stored := tracing.Traceparent(opCtx)

	childCtx, child := tp.Tracer("test").Start(opCtx, "finish")
	defer child.End()
	if got := trace.SpanContextFromContext(tracing.InTrace(childCtx, stored)); got.SpanID() != child.SpanContext().SpanID() {
		t.Errorf("in the operation's own trace InTrace moved the parent to %s, want the current span %s", got.SpanID(), child.SpanContext().SpanID())
	}
	webhookCtx, webhook := tp.Tracer("test").Start(context.Background(), "webhook")
	defer webhook.End()
	if got := trace.SpanContextFromContext(tracing.InTrace(webhookCtx, stored)); got.TraceID() != op.SpanContext().TraceID() || got.SpanID() != op.SpanContext().SpanID() {
		t.Errorf("from another trace InTrace gave %s/%s, want the operation's %s/%s", got.TraceID(), got.SpanID(), op.SpanContext().TraceID(), op.SpanContext().SpanID())
	}
	if got := tracing.InTrace(webhookCtx, "garbage"); trace.SpanContextFromContext(got).SpanID() != webhook.SpanContext().SpanID() {
		t.Error("a malformed stored traceparent replaced the current span")
	}
}
