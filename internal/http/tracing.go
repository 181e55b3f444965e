package httpapi

import (
	"context"
	"net/http"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Traces of the public listener (X3). When tracing is on (tracingOn),
// every request but the probes is a server span, otelhttp's: it continues
// the trace of an incoming traceparent (the global propagator, set by
// tracing.Setup), and its context is the request's, so every span under
// it (idempotency, the processor call, the statements) and every log line
// written with it (the access line, "request failed") belong to it. The
// admin listener is not traced.
//
// otelhttp records no header and no body: the attributes are the method,
// scheme, server address and port, the peer and client address, the user
// agent, url.path, the protocol, the status and the sizes. One path holds a
// secret, GET /v1/idempotency-keys/{key}: its url.path is replaced by the
// route (nameSpan). The idempotency attributes are idem's (traceOutcome).

// traced wraps the public handler in the server span. The span is named
// by the method at first, the route being unknown until chi has routed
// the request: nameSpan renames it. The result still lists the routes
// (chi.Routes), for whoever walks them (the contract test).
func traced(r chi.Router) http.Handler {
	return tracedRoutes{
		Handler: otelhttp.NewHandler(r, "http.server",
			otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method }),
			// The probes answer every few seconds, a trace each would bury
			// the requests.
			otelhttp.WithFilter(func(r *http.Request) bool {
				return tracingOn() && r.URL.Path != "/healthz" && r.URL.Path != "/readyz"
			}),
		),
		routeTree: r,
	}
}

// untraced is the global tracer provider as the process starts:
// OpenTelemetry's default, which records nothing until a provider is
// installed (tracing.Setup installs one when traces are asked for).
var untraced = otel.GetTracerProvider()

// tracingOn reports whether a tracer provider that may record is
// installed. Without one, otelhttp's server span would record nothing and
// its wrapping of the request (attributes, response writer, body) would
// still cost every request a few microseconds and some 30 allocations:
// the request is served unwrapped instead (free when off), and an
// incoming traceparent is then not continued either.
func tracingOn() bool {
	tp := otel.GetTracerProvider()
	if _, ok := tp.(noop.TracerProvider); ok {
		return false
	}
	return tp != untraced
}

// tracedRoutes serves through Handler, the traced router, and lists the
// router's routes.
type tracedRoutes struct {
	http.Handler
	routeTree
}

// routeTree is chi.Routes under a name that is not one of its methods.
type routeTree = chi.Routes

// nameSpan names the request's span after its route template, as
// OpenTelemetry's HTTP conventions ask ("POST /v1/payments",
// "GET /v1/orders/{id}"), never after the path, and sets http.route. An
// unmatched request keeps the method alone. A path that carries a key
// (a path parameter named key) is recorded as its route.
func nameSpan(ctx context.Context, method, route string) {
	span := trace.SpanFromContext(ctx)
	if route == "" || !span.IsRecording() {
		return
	}
	span.SetName(method + " " + route)
	span.SetAttributes(semconv.HTTPRoute(route))
	if rctx := chi.RouteContext(ctx); rctx != nil && rctx.URLParam("key") != "" {
		span.SetAttributes(semconv.URLPath(route))
	}
}
