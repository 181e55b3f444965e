// Package tracing owns OpenTelemetry for the service (X3–X5): the tracer
// provider, configured by OpenTelemetry's own environment variables and
// off, at no cost, when none asks for it; the propagation of a trace
// through HTTP, the outbox and NATS headers; the attributes that put an
// idempotency outcome on a span; and the trace and span ids on every log
// line written while serving a request.
//
// Nothing here names a key, an API key or a body: the attributes carry a
// key's hash only (KeyHash), never the key.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of every span this module makes.
const ScopeName = "github.com/idemref/payments"

// DefaultServiceName is service.name when OTEL_SERVICE_NAME is unset.
const DefaultServiceName = "payments-api"

// Tracer is the module's tracer, from the global provider: a no-op until
// Setup installed one.
func Tracer() trace.Tracer { return otel.Tracer(ScopeName) }

// Enabled says whether the environment asks for traces: an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) or
// OTEL_TRACES_EXPORTER=otlp, and neither OTEL_SDK_DISABLED=true nor
// OTEL_TRACES_EXPORTER=none. The SDK's exporter would otherwise send to
// localhost:4318 by default; a service that was not told where to send
// traces sends none.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch strings.ToLower(getenv("OTEL_TRACES_EXPORTER")) {
	case "none":
		return false
	case "otlp":
		return true
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// SecretVariables are the variables of OpenTelemetry's exporter that may
// carry a credential: headers such as Authorization=Bearer..., and
// endpoint URLs, which may hold a password. Setup checks them itself
// (checkExporterEnv), so that no error or log line shows their values
// (R8).
var SecretVariables = []string{
	"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
	"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
}

// Setup installs the propagator (W3C trace context and baggage) always,
// and, when Enabled, a tracer provider exporting over OTLP/HTTP as the
// OTEL_EXPORTER_OTLP_* variables say, sampling as OTEL_TRACES_SAMPLER
// says (the SDK reads both), named by OTEL_SERVICE_NAME (default
// payments-api) with version as service.version. Its shutdown flushes
// what is buffered; call it after the server and the workers stopped.
// Disabled, the global provider stays the no-op one: a span costs an
// interface call.
func Setup(ctx context.Context, getenv func(string) string, version string) (shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	if !Enabled(getenv) {
		return func(context.Context) error { return nil }, nil
	}
	if p := getenv("OTEL_EXPORTER_OTLP_PROTOCOL"); p != "" && p != "http/protobuf" {
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: this build exports traces over http/protobuf only", p)
	}
	if err := checkExporterEnv(getenv); err != nil {
		return nil, err
	}
	exporter, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	attrs := []resource.Option{resource.WithAttributes(semconv.ServiceVersion(version))}
	if getenv("OTEL_SERVICE_NAME") == "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceName(DefaultServiceName)))
	}
	res, err := resource.New(ctx, append(attrs, resource.WithFromEnv(), resource.WithTelemetrySDK())...)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// checkExporterEnv checks SecretVariables before the SDK reads them: the
// SDK logs a header or a URL it cannot parse with its value, to stderr,
// and goes on without it. Its error names the variable and what is wrong,
// never the value.
func checkExporterEnv(getenv func(string) string) error {
	for _, name := range SecretVariables {
		v := getenv(name)
		if v == "" {
			continue
		}
		err := checkEndpoint(v)
		if strings.HasSuffix(name, "_HEADERS") {
			err = checkHeaders(v)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

func checkEndpoint(v string) error {
	if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("want the collector's URL, such as http://127.0.0.1:4318, a user or password in it percent-encoded")
	}
	return nil
}

// checkHeaders checks key=value pairs, comma-separated, as the SDK reads
// them: the key a header name, the value percent-decoded.
func checkHeaders(v string) error {
	for i, pair := range strings.Split(v, ",") {
		key, value, ok := strings.Cut(pair, "=")
		if !ok {
			return fmt.Errorf("entry %d has no '=': want comma-separated key=value pairs, such as Authorization=Bearer%%20<token>", i+1)
		}
		if !isHeaderName(strings.TrimSpace(key)) {
			return fmt.Errorf("entry %d's key is not a header name", i+1)
		}
		if _, err := url.PathUnescape(value); err != nil {
			return fmt.Errorf("entry %d's value is not percent-encoded right: a %% starts two hex digits (a %% itself is %%25)", i+1)
		}
	}
	return nil
}

// isHeaderName: a token of RFC 9110, as the SDK requires.
func isHeaderName(key string) bool {
	return key != "" && !strings.ContainsFunc(key, func(r rune) bool {
		tokenChar := 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r)
		return !tokenChar
	})
}
