package httpapi_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	apispec "github.com/idemref/payments"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/logging"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/tooling/processorsim"
	"github.com/idemref/payments/internal/tracing"
)

// Traces (X3, X4): one request is one tree of spans under its server span,
// named by its route; the idempotency outcome, the endpoint and the key's
// hash are on the idempotency span and on the server span; the processor
// call's span has the hash of the derived key; and no span holds a key, an
// API key or a body value.
//
// The tracer provider is global, so these tests never run in parallel:
// the parallel tests of the package wait until they are done.

// installTracer makes an in-memory tracer provider the global one, with
// the propagator tracing.Setup installs, until the test ends. It must be
// called before setup, which builds the handler, the processor client and
// the pool that take the provider.
func installTracer(t *testing.T) *tracetest.SpanRecorder {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prevProvider, prevPropagator := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	// No OTEL_* variable: Setup installs the propagator and no provider.
	if _, err := tracing.Setup(t.Context(), func(string) string { return "" }, "test"); err != nil {
		t.Fatal(err)
	}
	otel.SetTracerProvider(tp)
	t.Cleanup(func() {
		otel.SetTracerProvider(prevProvider)
		otel.SetTextMapPropagator(prevPropagator)
		_ = tp.Shutdown(context.Background())
	})
	return rec
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// attr returns the value of span's attribute key, "" when it has none.
func attr(span sdktrace.ReadOnlySpan, key attribute.Key) string {
	for _, kv := range span.Attributes() {
		if kv.Key == key {
			return kv.Value.String()
		}
	}
	return ""
}

// trees groups spans by trace id.
func trees(spans []sdktrace.ReadOnlySpan) map[trace.TraceID][]sdktrace.ReadOnlySpan {
	out := map[trace.TraceID][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		out[s.SpanContext().TraceID()] = append(out[s.SpanContext().TraceID()], s)
	}
	return out
}

// requestTree checks that tree is one request's spans: one root, a
// server span, and every other span's parent in the tree. It returns the
// root.
func requestTree(t *testing.T, tree []sdktrace.ReadOnlySpan) sdktrace.ReadOnlySpan {
	t.Helper()
	ids := map[trace.SpanID]bool{}
	for _, s := range tree {
		ids[s.SpanContext().SpanID()] = true
	}
	var roots []sdktrace.ReadOnlySpan
	for _, s := range tree {
		if !ids[s.Parent().SpanID()] {
			roots = append(roots, s)
		}
	}
	if len(roots) != 1 {
		names := make([]string, len(roots))
		for i, r := range roots {
			names[i] = r.Name()
		}
		t.Fatalf("trace %s has %d roots %q, want the server span alone", tree[0].SpanContext().TraceID(), len(roots), names)
	}
	root := roots[0]
	if root.SpanKind() != trace.SpanKindServer {
		t.Fatalf("the root of trace %s is %q, kind %v; want the server span", root.SpanContext().TraceID(), root.Name(), root.SpanKind())
	}
	return root
}

// find returns the spans of tree named name.
func find(tree []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tree {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// one returns the one span of tree named name.
func one(t *testing.T, tree []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	found := find(tree, name)
	if len(found) != 1 {
		t.Fatalf("%d spans %q in trace %s, want 1", len(found), name, tree[0].SpanContext().TraceID())
	}
	return found[0]
}

// descends reports whether s is below ancestor in tree.
func descends(tree []sdktrace.ReadOnlySpan, s, ancestor sdktrace.ReadOnlySpan) bool {
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, x := range tree {
		byID[x.SpanContext().SpanID()] = x
	}
	for p, ok := byID[s.Parent().SpanID()]; ok; p, ok = byID[p.Parent().SpanID()] {
		if p.SpanContext().SpanID() == ancestor.SpanContext().SpanID() {
			return true
		}
	}
	return false
}

// wantOutcome checks the idempotency attributes of span.
func wantOutcome(t *testing.T, span sdktrace.ReadOnlySpan, endpoint, key, outcome string, replayed bool) {
	t.Helper()
	want := map[attribute.Key]string{
		tracing.AttrEndpoint: endpoint,
		tracing.AttrKeyHash:  sha256Hex(key),
		tracing.AttrOutcome:  outcome,
		tracing.AttrReplayed: map[bool]string{true: "true", false: "false"}[replayed],
	}
	for k, v := range want {
		if got := attr(span, k); got != v {
			t.Errorf("span %q: %s = %q, want %q", span.Name(), k, got, v)
		}
	}
}

// TestTraces: an order created and replayed (the replay continuing a
// client's trace), a payment, and a key's status, each its own trace.
func TestTraces(t *testing.T) {
	rec := installTracer(t)
	e := setup(t, withProcessor())

	const (
		orderKey = "trace-order-key-5f1c9a"
		badKey   = "trace-bad-key-a71d20"
		payKey   = "trace-pay-key-d04e77"
		ref      = "trace-ref-secret-83b2"
		// The client's trace the replay continues.
		clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
		clientSpan  = "00f067aa0ba902b7"
	)
	first := e.post(t, e.a.Key, orderKey, orderBody(ref))
	wantStatus(t, first, http.StatusCreated)
	replay := e.post(t, e.a.Key, orderKey, orderBody(ref), withHeader("traceparent", "00-"+clientTrace+"-"+clientSpan+"-01"))
	wantReplay(t, first, replay)
	o := decodeOrder(t, first)
	pay := e.pay(t, e.a.Key, payKey, payBody(o.Id.String(), cardVisa))
	wantStatus(t, pay, http.StatusCreated)
	wantStatus(t, e.get(t, e.a.Key, "/v1/idempotency-keys/"+orderKey+"?endpoint="+url.QueryEscape(endpointOrders)), http.StatusOK)
	// A body that does not parse: rejected before its key is claimed.
	wantStatus(t, e.post(t, e.a.Key, badKey, `{"reference":"`+ref), http.StatusBadRequest)
	e.srv.Close() // waits for the handlers: every server span has ended

	var chargeKey string
	if err := e.pool.QueryRow(t.Context(), "SELECT charge_key FROM payments WHERE order_id = $1", o.Id).Scan(&chargeKey); err != nil {
		t.Fatal(err)
	}

	spans := rec.Ended()
	byTrace := trees(spans)
	var servers []sdktrace.ReadOnlySpan
	for _, tree := range byTrace {
		servers = append(servers, requestTree(t, tree))
	}
	if len(servers) != 5 {
		t.Fatalf("%d traces, want 5 (one per request)", len(servers))
	}
	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range servers {
		byName[s.Name()] = append(byName[s.Name()], s)
	}
	orders, payments, status := byName["POST /v1/orders"], byName["POST /v1/payments"], byName["GET /v1/idempotency-keys/{key}"]
	if len(orders) != 3 || len(payments) != 1 || len(status) != 1 {
		t.Fatalf("server spans %v, want POST /v1/orders three times, POST /v1/payments and GET /v1/idempotency-keys/{key} once", keys(byName))
	}

	// The order: executed, then replayed, on the server span and on the
	// idempotency span, which is the server span's descendant.
	for _, server := range orders {
		tree := byTrace[server.SpanContext().TraceID()]
		if attr(server, tracing.AttrKeyHash) == sha256Hex(badKey) {
			// Rejected: no idempotency span, the outcome on the request's.
			wantOutcome(t, server, endpointOrders, badKey, "rejected_before_claim", false)
			if n := len(find(tree, "idempotency.execute")); n != 0 {
				t.Errorf("%d idempotency.execute spans for a request rejected before its claim", n)
			}
			continue
		}
		outcome, replayed := "executed", false
		if server.SpanContext().TraceID().String() == clientTrace {
			outcome, replayed = "replayed", true
			if server.Parent().SpanID().String() != clientSpan || !server.Parent().IsRemote() {
				t.Errorf("the replay's server span has parent %v, want the client's span %s", server.Parent(), clientSpan)
			}
		}
		if got := attr(server, "http.route"); got != "/v1/orders" {
			t.Errorf("http.route = %q, want /v1/orders", got)
		}
		execute := one(t, tree, "idempotency.execute")
		wantOutcome(t, execute, endpointOrders, orderKey, outcome, replayed)
		wantOutcome(t, server, endpointOrders, orderKey, outcome, replayed)
		one(t, tree, "idempotency.lookup")
		if !replayed {
			one(t, tree, "idempotency.run")
			one(t, tree, "idempotency.record")
		}
	}
	if byTrace[mustTraceID(t, clientTrace)] == nil {
		t.Errorf("no trace continues the client's %s", clientTrace)
	}

	// The payment: claimed and executed; its charge under the server span,
	// with the derived key's hash and the class of the answer, and the
	// HTTP call that took the trace on to the processor below it.
	server := payments[0]
	tree := byTrace[server.SpanContext().TraceID()]
	wantOutcome(t, one(t, tree, "idempotency.begin"), endpointPayments, payKey, "executed", false)
	wantOutcome(t, server, endpointPayments, payKey, "executed", false)
	charge := one(t, tree, "processor.charge")
	if !descends(tree, charge, server) {
		t.Error("processor.charge is not below the request's server span")
	}
	if got := attr(charge, tracing.AttrProcessorKeyHash); got != sha256Hex(chargeKey) {
		t.Errorf("processor.charge %s = %q, want the hash of the payment's charge key %q", tracing.AttrProcessorKeyHash, got, sha256Hex(chargeKey))
	}
	if got := attr(charge, "processor.outcome"); got != "final" {
		t.Errorf("processor.outcome = %q, want final", got)
	}
	sent := false
	for _, s := range tree {
		sent = sent || (s.SpanKind() == trace.SpanKindClient && s.Parent().SpanID() == charge.SpanContext().SpanID())
	}
	if !sent {
		t.Error("no HTTP client span below processor.charge: the call to the processor carried no trace")
	}
	if n := len(find(tree, "idempotency.phase")); n == 0 {
		t.Error("no idempotency.phase span in the payment's trace")
	}

	// The key's status: its path holds the key, the span the route.
	if got := attr(status[0], "url.path"); got != "/v1/idempotency-keys/{key}" {
		t.Errorf("url.path of the key status = %q, want the route", got)
	}

	// Nothing anywhere holds a secret or a body value.
	_, apiSecret, _ := strings.Cut(strings.TrimPrefix(e.a.Key, "sk_"), "_")
	secrets := map[string]string{
		"the order's Idempotency-Key": orderKey, "the payment's Idempotency-Key": payKey, "the rejected Idempotency-Key": badKey,
		"the derived charge key": chargeKey, "the API key": e.a.Key, "the API key's secret": apiSecret,
		"the order's reference": ref, "the payment method": cardVisa,
	}
	for _, s := range spans {
		for what, secret := range secrets {
			for where, v := range spanTexts(s) {
				if strings.Contains(v, secret) {
					t.Errorf("span %q, %s = %q holds %s", s.Name(), where, v, what)
				}
			}
		}
	}
}

// spanTexts is every text a span exports: its name, status, attributes,
// events and links, by where it is.
func spanTexts(s sdktrace.ReadOnlySpan) map[string]string {
	out := map[string]string{"name": s.Name(), "status": s.Status().Description}
	add := func(prefix string, attrs []attribute.KeyValue) {
		for _, kv := range attrs {
			out[prefix+string(kv.Key)] = kv.Value.String()
		}
	}
	add("attribute ", s.Attributes())
	for _, ev := range s.Events() {
		out["event "+ev.Name] = ev.Name
		add("event "+ev.Name+" ", ev.Attributes)
	}
	for _, l := range s.Links() {
		add("link ", l.Attributes)
	}
	return out
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func mustTraceID(t *testing.T, s string) trace.TraceID {
	t.Helper()
	id, err := trace.TraceIDFromHex(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestTraceIDsInLog: a request's access line carries the trace and span
// ids of its server span.
func TestTraceIDsInLog(t *testing.T) {
	rec := installTracer(t)
	e := setup(t)
	var buf lockedBuffer
	srv := httptest.NewServer(httpapi.NewHandler(httpapi.Config{
		Pool:           e.pool,
		Idem:           idem.NewStore(e.pool, idem.Config{}),
		Logger:         logging.New(&buf, slog.LevelInfo),
		RequestTimeout: 10 * time.Second,
		OpenAPI:        apispec.OpenAPI,
	}))
	defer srv.Close()

	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders", strings.NewReader(orderBody("log-trace")))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.a.Key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idem.HeaderName, "log-trace-key")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	wantStatus(t, response{status: res.StatusCode}, http.StatusCreated)
	srv.Close() // waits for the handler, and with it the access line

	var server sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindServer {
			server = s
		}
	}
	if server == nil {
		t.Fatal("no server span")
	}
	lines := buf.lines(t)
	if len(lines) != 1 || lines[0]["msg"] != "request" {
		t.Fatalf("log lines %v, want the access line alone", lines)
	}
	if got, want := lines[0]["trace_id"], server.SpanContext().TraceID().String(); got != want {
		t.Errorf("access line trace_id = %v, want the server span's %s", got, want)
	}
	if got, want := lines[0]["span_id"], server.SpanContext().SpanID().String(); got != want {
		t.Errorf("access line span_id = %v, want the server span's %s", got, want)
	}
}

// TestCompleterTraceLinksToPayment: the completer's work on an abandoned
// payment is a trace of its own, payments.complete, linked to the trace of
// the request that created the payment (its row's trace_parent), with its
// processor calls below it.
func TestCompleterTraceLinksToPayment(t *testing.T) {
	rec := installTracer(t)
	e := setup(t, withProcessor())
	o := e.newOrder(t, e.a, "trace-abandoned")
	const key = "trace-abandoned-key"
	e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultServerError})
	wantStatus(t, e.pay(t, e.a.Key, key, payBody(o.Id.String(), cardVisa)), http.StatusServiceUnavailable)
	e.passSettleWindow(t, e.a.ID, endpointPayments, key)
	if n := payments.NewCompleter(e.payments, time.Hour).RunOnce(t.Context()); n != 1 {
		t.Fatalf("the completer took over %d keys, want 1", n)
	}
	e.srv.Close()

	var request, complete sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "POST /v1/payments":
			request = s
		case "payments.complete":
			complete = s
		}
	}
	if request == nil || complete == nil {
		t.Fatalf("spans POST /v1/payments %v, payments.complete %v; want both", request, complete)
	}
	var stored string
	if err := e.pool.QueryRow(t.Context(), "SELECT coalesce(trace_parent, '') FROM payments WHERE order_id = $1", o.Id).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stored, request.SpanContext().TraceID().String()) {
		t.Errorf("payments.trace_parent = %q, want the request's trace %s", stored, request.SpanContext().TraceID())
	}
	if complete.Parent().IsValid() || complete.SpanContext().TraceID() == request.SpanContext().TraceID() {
		t.Errorf("payments.complete has parent %v in trace %s, want a new root", complete.Parent(), complete.SpanContext().TraceID())
	}
	linked := false
	for _, l := range complete.Links() {
		linked = linked || l.SpanContext.TraceID() == request.SpanContext().TraceID()
	}
	if !linked {
		t.Errorf("payments.complete links %v, want the request's trace %s", complete.Links(), request.SpanContext().TraceID())
	}
	if got := attr(complete, tracing.AttrKeyHash); got != sha256Hex(key) {
		t.Errorf("payments.complete %s = %q, want the key's hash", tracing.AttrKeyHash, got)
	}
	tree := trees(rec.Ended())[complete.SpanContext().TraceID()]
	if calls := append(find(tree, "processor.charges_by_key"), find(tree, "processor.charge")...); len(calls) == 0 {
		t.Error("no processor call in the completer's trace")
	}
}
