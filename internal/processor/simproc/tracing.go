package simproc

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/tracing"
)

// Traces of the processor calls (X3). Each call of the Client is a span
// (spanCharge, ...) with the hash of the key it sends
// (tracing.AttrProcessorKeyHash, never the key) and the class of the
// answer (attrOutcome: final, not_executed, outcome_unknown; processor.ClassOf). Under
// it, each HTTP request is a client span, which sends the trace on to the
// processor in traceparent (clientSpans).

// Span names of the calls.
const (
	spanCharge            = "processor.charge"
	spanRefund            = "processor.refund"
	spanChargesByKey      = "processor.charges_by_key"
	spanChargesByMetadata = "processor.charges_by_metadata"
	spanRefundsByCharge   = "processor.refunds_by_charge"
)

// attrOutcome is the class of the call's answer (S6).
const attrOutcome = attribute.Key("processor.outcome")

// startCall starts the span of one call under the span of ctx, when that
// one records (as idem's spans: an untraced call pays a context lookup,
// the non-recording span of ctx standing in); key is the idempotency key
// the call sends or looks up ("" for none).
func startCall(ctx context.Context, name, key string) (context.Context, trace.Span) {
	if parent := trace.SpanFromContext(ctx); !parent.IsRecording() {
		return ctx, parent
	}
	ctx, span := tracing.Tracer().Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal))
	if key != "" && span.IsRecording() {
		span.SetAttributes(tracing.AttrProcessorKeyHash.String(tracing.KeyHash(key)))
	}
	return ctx, span
}

// endCall ends the span of a call that returned err, with the class of
// its answer; an answer that is not final is an error of the span (its
// description is the class: an error's text may hold a URL, and with it a
// key).
func endCall(span trace.Span, err error) {
	if span.IsRecording() {
		class := processor.ClassOf(err)
		span.SetAttributes(attrOutcome.String(class.String()))
		if class != processor.ClassFinal {
			span.SetStatus(codes.Error, class.String())
		}
	}
	span.End()
}

// clientSpans is the transport of the client: base (nil:
// http.DefaultTransport) with an HTTP client span around each request, by
// OpenTelemetry's HTTP client conventions, whose context goes to the
// processor in traceparent (the global propagator).
//
// It is not otelhttp's transport, which wraps the request body to count
// its bytes: net/http then no longer knows the body is in memory and
// sends the headers and the body in two writes, where it sends a small
// request in one. A charge cut between the two reaches the processor
// without its body (TestPaymentSurvivesCrashBetweenSteps in cmd/api kills
// the API at that moment). This one leaves the body alone, and holds
// exactly the attributes below: no header, no body, and url.full with the
// keys of a lookup replaced by "REDACTED", as the conventions name a
// redacted value.
type clientSpans struct{ base http.RoundTripper }

func (t clientSpans) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.base
	if base == nil {
		base = http.DefaultTransport
	}
	parent := trace.SpanFromContext(req.Context())
	if !parent.SpanContext().IsValid() {
		return base.RoundTrip(req)
	}
	if !parent.IsRecording() {
		// Not sampled: the processor hears so, and no span is made.
		req = req.Clone(req.Context())
		otel.GetTextMapPropagator().Inject(req.Context(), propagation.HeaderCarrier(req.Header))
		return base.RoundTrip(req)
	}
	attrs := []attribute.KeyValue{
		semconv.HTTPRequestMethodKey.String(req.Method),
		semconv.URLFull(redactedURL(req.URL)),
		semconv.ServerAddress(req.URL.Hostname()),
	}
	if port, err := strconv.Atoi(req.URL.Port()); err == nil {
		attrs = append(attrs, semconv.ServerPort(port))
	}
	ctx, span := tracing.Tracer().Start(req.Context(), req.Method, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	defer span.End()
	// A copy: a RoundTripper must not change the request it is given. The
	// body is the same reader, and GetBody stays nil (client.go, post).
	req = req.Clone(ctx)
	otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(req.Header))
	res, err := base.RoundTrip(req)
	if err != nil {
		// No description: a transport error may name the URL.
		span.SetStatus(codes.Error, "")
		return res, err
	}
	span.SetAttributes(semconv.HTTPResponseStatusCode(res.StatusCode))
	if res.StatusCode >= 400 {
		span.SetStatus(codes.Error, "")
	}
	return res, nil
}

// secretParams are the query parameters whose values no span may hold.
var secretParams = []string{"idempotency_key"}

// redactedURL is u as a span may hold it: without user information, and
// the value of every secret parameter replaced by "REDACTED".
func redactedURL(u *url.URL) string {
	shown := *u
	shown.User = nil
	if shown.RawQuery != "" {
		q := shown.Query()
		for _, p := range secretParams {
			if q.Has(p) {
				q.Set(p, "REDACTED")
			}
		}
		shown.RawQuery = q.Encode()
	}
	return shown.String()
}
