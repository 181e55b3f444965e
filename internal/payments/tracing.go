package payments

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemref/payments/internal/tracing"
)

// Traces of the work done on a payment after its request (X3). A payment
// row keeps the traceparent of the request that created it
// (payments.trace_parent, NULL when it was not traced). The completer
// and the sweep work on it long after that trace ended, on behalf of no
// request: each payment they take up is a trace of its own, a new root
// (spanComplete, spanSweep), linked to the payment's first trace, so that
// one leads to the other. A client's retry that resumes a payment links
// its own span the same way (linkPayment).
const (
	spanComplete    = "payments.complete"
	spanSweep       = "payments.sweep"
	spanSweepRefund = "payments.sweep_refund"
)

// attrResult is what the completer or the sweep made of one payment or
// refund: finished, waiting or failed (the completer), done or retry (the
// sweep).
const attrResult = attribute.Key("payments.result")

// linkOf is the link to the span traceparent names; false when there is
// none.
func linkOf(traceparent *string) (trace.Link, bool) {
	if traceparent == nil {
		return trace.Link{}, false
	}
	sc := trace.SpanContextFromContext(tracing.WithTraceparent(context.Background(), *traceparent))
	return trace.Link{SpanContext: sc}, sc.IsValid()
}

// startJob starts the root span of the work on one payment or refund,
// linked to the trace traceparent names (nil: none).
func startJob(ctx context.Context, name string, traceparent *string) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{trace.WithNewRoot()}
	if link, ok := linkOf(traceparent); ok {
		opts = append(opts, trace.WithLinks(link))
	}
	return tracing.Tracer().Start(ctx, name, opts...)
}

// endJob ends a job's span with its result; failed marks it an error.
func endJob(span trace.Span, result string, failed bool) {
	if span.IsRecording() {
		span.SetAttributes(attrResult.String(result))
		if failed {
			span.SetStatus(codes.Error, result)
		}
	}
	span.End()
}

// linkPayment links the span of ctx (a resumed attempt: the completer's,
// or a client's retry) to the trace that created the payment, unless it
// is that trace.
func linkPayment(ctx context.Context, traceparent *string) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	if link, ok := linkOf(traceparent); ok && link.SpanContext.TraceID() != span.SpanContext().TraceID() {
		span.AddLink(link)
	}
}
