package simproc

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/tracing"
)

// TestClientTraces: each call is a span with the hash of its key and the
// class of its answer, over an HTTP client span that sends the trace to
// the processor; a key sent in a lookup's query reaches the processor and
// never a span (url.full says REDACTED). Not parallel: the tracer provider
// is global.
func TestClientTraces(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prevProvider, prevPropagator := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() {
		otel.SetTracerProvider(prevProvider)
		otel.SetTextMapPropagator(prevPropagator)
		_ = tp.Shutdown(context.Background())
	})

	const key = "derived-key-3c9e41"
	type seen struct{ query, traceparent string }
	seenc := make(chan seen, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seenc <- seen{r.URL.RawQuery, r.Header.Get("traceparent")}
		if r.Method == http.MethodGet {
			reply(200, `{"object":"list","data":[],"has_more":false}`)(w, r)
			return
		}
		reply(200, `{"id":"ch_1","object":"charge","amount":1000,"currency":"EUR","status":"succeeded"}`)(w, r)
	}))
	t.Cleanup(srv.Close)
	bodies := &bodyTypes{base: http.DefaultTransport}
	c := NewClientWithTransport(srv.URL, 0, bodies)

	ctx, parent := tp.Tracer("test").Start(context.Background(), "test")
	if _, err := c.ChargesByIdempotencyKey(ctx, key); err != nil {
		t.Fatal(err)
	}
	if got := <-seenc; !strings.Contains(got.query, "idempotency_key="+key) || !strings.Contains(got.traceparent, parent.SpanContext().TraceID().String()) {
		t.Errorf("the processor got query %q, traceparent %q; want the key, and the trace %s", got.query, got.traceparent, parent.SpanContext().TraceID())
	}
	if _, err := c.CreateCharge(ctx, processor.ChargeRequest{Amount: 1000, Currency: "EUR", PaymentMethod: "pm_card_visa"}, key); err != nil {
		t.Fatal(err)
	}
	<-seenc
	parent.End()

	calls := map[string]sdktrace.ReadOnlySpan{}
	var clients []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.String(), key) {
				t.Errorf("span %q: %s = %q holds the key", s.Name(), kv.Key, kv.Value.String())
			}
		}
		switch {
		case s.SpanKind() == trace.SpanKindClient:
			clients = append(clients, s)
		case strings.HasPrefix(s.Name(), "processor."):
			calls[s.Name()] = s
		}
	}
	for _, name := range []string{spanChargesByKey, spanCharge} {
		s, ok := calls[name]
		if !ok {
			t.Fatalf("no span %s among %v", name, rec.Ended())
		}
		want := map[string]string{string(tracing.AttrProcessorKeyHash): tracing.KeyHash(key), string(attrOutcome): "final"}
		for _, kv := range s.Attributes() {
			if w, ok := want[string(kv.Key)]; ok && kv.Value.String() == w {
				delete(want, string(kv.Key))
			}
		}
		if len(want) != 0 {
			t.Errorf("span %s lacks %v; has %v", name, want, s.Attributes())
		}
		if s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("span %s is not the caller's child", name)
		}
	}
	// The charge's body reaches the transport as sent: net/http knows it
	// is in memory and sends it with the headers, in one write.
	want, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader([]byte("{}")))
	if len(bodies.seen) != 1 || bodies.seen[0] != reflect.TypeOf(want.Body) {
		t.Errorf("request bodies reaching the transport: %v, want one %v", bodies.seen, reflect.TypeOf(want.Body))
	}
	if len(clients) != 2 {
		t.Fatalf("%d HTTP client spans, want 2", len(clients))
	}
	for _, s := range clients {
		for _, kv := range s.Attributes() {
			if kv.Key == "url.full" && s.Parent().SpanID() == calls[spanChargesByKey].SpanContext().SpanID() && !strings.Contains(kv.Value.String(), "idempotency_key=REDACTED") {
				t.Errorf("the lookup's url.full = %q, want its key REDACTED", kv.Value.String())
			}
		}
	}
}

// bodyTypes records the type of each request body base is given.
type bodyTypes struct {
	base http.RoundTripper
	seen []reflect.Type
}

func (b *bodyTypes) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		b.seen = append(b.seen, reflect.TypeOf(req.Body))
	}
	return b.base.RoundTrip(req)
}
