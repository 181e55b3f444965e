package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemref/payments/internal/config"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/processorsim"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
	"github.com/idemref/payments/internal/tracing"
)

// X3: one payment is one trace, from the client's request through the key
// claim, the processor call, the outbox, the relay's publish to NATS and
// the orders consumer's update of the order, which continues the trace the
// relay carried in the message's headers. serve runs in this process, so
// the SDK's in-memory recorder sees every span. No attribute of any span
// holds the Idempotency-Key, the API key or a value of the body.
// Mutation: stop outbox.Write from storing the traceparent and the consumer's
// span starts a trace of its own: the tree breaks in two.
func TestOnePaymentIsOneTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	// As run does for every command: the propagator (the provider stays
	// the recorder's, the variables being unset).
	if _, err := tracing.Setup(t.Context(), func(string) string { return "" }, "test"); err != nil {
		t.Fatal(err)
	}

	pool, dbURL := testdb.NewPool(t)
	_, apiKey, err := tenants.Create(t.Context(), pool, "traced")
	if err != nil {
		t.Fatal(err)
	}
	sim, err := processorsim.Start("127.0.0.1:0", processorsim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Shutdown(context.Background()) })
	env := map[string]string{
		"DATABASE_URL": dbURL, "NATS_URL": natsURLFor(t, dbURL), "PROCESSOR_URL": sim.URL(),
		"ADDR": "127.0.0.1:0", "SHUTDOWN_GRACE": "0", "LOG_LEVEL": "warn",
	}
	cfg, err := config.Load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	addrs := make(chan string, 1)
	served := make(chan error, 1)
	go func() {
		served <- serve(ctx, cfg, testkit.Logger(t), func(addr, _ string) { addrs <- addr })
	}()
	var base string
	select {
	case addr := <-addrs:
		base = "http://" + addr
	case err := <-served:
		t.Fatalf("serve: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not listen within 30s")
	}
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})

	const payKey = "trace-pay-key-7f3a"
	reference := "trace-ref-5521"
	order, err := post(base, apiKey, "/v1/orders", "trace-order-key-19c2",
		`{"reference":"`+reference+`","customer_id":"cus_trace","amount":1250,"currency":"EUR"}`)
	if err != nil || order.status != http.StatusCreated {
		t.Fatalf("create order: %v %d %s", err, order.status, order.body)
	}
	var o struct{ ID string }
	if err := json.Unmarshal([]byte(order.body), &o); err != nil {
		t.Fatal(err)
	}

	// The client's own span: the payment's trace is the one it starts.
	clientCtx, clientSpan := tp.Tracer("test client").Start(context.Background(), "client pays")
	body := `{"order_id":"` + o.ID + `","amount":1250,"currency":"EUR","payment_method":"pm_card_visa"}`
	req, err := http.NewRequestWithContext(clientCtx, http.MethodPost, base+"/v1/payments", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", payKey)
	otel.GetTextMapPropagator().Inject(clientCtx, propagation.HeaderCarrier(req.Header))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	clientSpan.End()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("pay: %d", res.StatusCode)
	}
	traceID := clientSpan.SpanContext().TraceID()

	// The consumer applies the event a moment after the 201.
	deadline := time.Now().Add(20 * time.Second)
	for count(t, pool, `SELECT count(*) FROM orders WHERE id = $1 AND status = 'paid'`, o.ID) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the order was not marked paid within 20s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	var consumed sdktrace.ReadOnlySpan
	for consumed == nil {
		for _, s := range rec.Ended() {
			if s.Name() == "consume payment.succeeded" {
				consumed = s
			}
		}
		if consumed == nil {
			if time.Now().After(deadline) {
				t.Fatal("no consume payment.succeeded span ended within 20s")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	spans := rec.Ended()
	inTrace := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		if s.SpanContext().TraceID() == traceID {
			inTrace[s.SpanContext().SpanID()] = s
		}
	}
	// One tree: the client's span is the only root, every other span's
	// parent is a span of the same trace.
	for _, s := range inTrace {
		if s.SpanContext().SpanID() == clientSpan.SpanContext().SpanID() {
			continue
		}
		if _, ok := inTrace[s.Parent().SpanID()]; !ok {
			t.Errorf("span %q has parent %s, which is not a span of the payment's trace", s.Name(), s.Parent().SpanID())
		}
	}
	for _, want := range []string{"POST /v1/payments", "idempotency.begin", "processor.charge", "outbox.publish payments.events.payment.succeeded", "consume payment.succeeded"} {
		found := false
		for _, s := range inTrace {
			found = found || s.Name() == want || strings.HasPrefix(s.Name(), want)
		}
		if !found {
			t.Errorf("the payment's trace has no span %q", want)
		}
	}
	checkDocumentedSpans(t, inTrace)
	if consumed.SpanContext().TraceID() != traceID {
		t.Errorf("the consumer's span is in trace %s, not the payment's %s: the trace broke at the broker", consumed.SpanContext().TraceID(), traceID)
	}
	t.Logf("the payment's trace %s:\n%s", traceID, renderTree(inTrace, clientSpan.SpanContext().SpanID()))

	// No span of the whole run carries a key, the API key or a body value.
	secret := strings.SplitN(apiKey, "_", 3)[2] // sk_<tenant>_<secret>; the secret may hold "_" itself
	for _, s := range spans {
		for _, a := range s.Attributes() {
			v := a.Value.String()
			for _, forbidden := range []string{payKey, "trace-order-key-19c2", apiKey, secret, reference, "cus_trace", "pm_card_visa"} {
				if strings.Contains(v, forbidden) {
					t.Errorf("span %q attribute %s = %q holds %q", s.Name(), a.Key, v, forbidden)
				}
			}
		}
	}
	// The key is named by its hash.
	hashed := false
	for _, s := range inTrace {
		for _, a := range s.Attributes() {
			hashed = hashed || (a.Key == tracing.AttrKeyHash && a.Value.AsString() == tracing.KeyHash(payKey))
		}
	}
	if !hashed {
		t.Errorf("no span of the payment's trace has %s = the key's hash", tracing.AttrKeyHash)
	}
}

// checkDocumentedSpans: every span docs/operations.md's tree of a
// payment names is a span of the trace (a name ending in "..." is a
// prefix), so that the tree cannot drift from what the code records.
func checkDocumentedSpans(t *testing.T, spans map[trace.SpanID]sdktrace.ReadOnlySpan) {
	t.Helper()
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, tree, ok := strings.Cut(string(doc), "```\nPOST /v1/payments ")
	if !ok {
		t.Fatal("docs/operations.md has no tree of a payment's trace (a ``` block starting with POST /v1/payments)")
	}
	tree, _, _ = strings.Cut("POST /v1/payments "+tree, "```")
	names := 0
	for line := range strings.Lines(tree) {
		name, _, _ := strings.Cut(strings.TrimLeft(line, "│├└─ "), "   ")
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		names++
		prefix, isPrefix := strings.CutSuffix(name, "...")
		prefix = strings.TrimSpace(prefix)
		found := false
		for _, s := range spans {
			found = found || s.Name() == name || (isPrefix && strings.HasPrefix(s.Name(), prefix))
		}
		if !found {
			t.Errorf("docs/operations.md's trace names a span %q, which the payment's trace does not have", name)
		}
	}
	if names < 10 {
		t.Errorf("read %d span names from docs/operations.md's tree: the tree's format changed", names)
	}
}

// renderTree draws the spans under root, children in the order they
// started, with the idempotency and processor attributes.
func renderTree(spans map[trace.SpanID]sdktrace.ReadOnlySpan, root trace.SpanID) string {
	children := map[trace.SpanID][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		children[s.Parent().SpanID()] = append(children[s.Parent().SpanID()], s)
	}
	var b strings.Builder
	var walk func(id trace.SpanID, depth int)
	walk = func(id trace.SpanID, depth int) {
		s := spans[id]
		var attrs []string
		for _, a := range s.Attributes() {
			if k := string(a.Key); strings.HasPrefix(k, "idempotency.") || strings.HasPrefix(k, "processor.") || k == "http.route" {
				attrs = append(attrs, fmt.Sprintf("%s=%s", k, a.Value.String()))
			}
		}
		fmt.Fprintf(&b, "%s%s %s\n", strings.Repeat("  ", depth+1), s.Name(), strings.Join(attrs, " "))
		kids := children[id]
		slices.SortFunc(kids, func(x, y sdktrace.ReadOnlySpan) int { return x.StartTime().Compare(y.StartTime()) })
		for _, k := range kids {
			walk(k.SpanContext().SpanID(), depth+1)
		}
	}
	walk(root, 0)
	return b.String()
}
