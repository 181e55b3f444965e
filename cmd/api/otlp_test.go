package main

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tracing"
)

// otlpReceiver is an OTLP/HTTP trace receiver, the part of a collector
// that a service talks to: it decodes each export as the protobuf the
// service sent and keeps it.
type otlpReceiver struct {
	url string

	mu       sync.Mutex
	requests int
	spans    []receivedSpan
}

// receivedSpan is one span with the resource it came from.
type receivedSpan struct {
	resource *commonpb.KeyValueList // the resource's attributes
	span     *tracepb.Span
}

// startOTLPReceiver serves /v1/traces on ln, or on a free port when ln is
// nil.
func startOTLPReceiver(t *testing.T, ln net.Listener) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(r.serveHTTP))
	if ln != nil {
		srv.Listener.Close()
		srv.Listener = ln
	}
	srv.Start()
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

func (r *otlpReceiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.Error(w, "only POST /v1/traces", http.StatusNotFound)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var export collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &export); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.requests++
	for _, rs := range export.GetResourceSpans() {
		res := &commonpb.KeyValueList{Values: rs.GetResource().GetAttributes()}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, receivedSpan{res, s})
			}
		}
	}
	r.mu.Unlock()
	out, err := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// received returns the exports and the spans received so far.
func (r *otlpReceiver) received() (requests int, spans []receivedSpan) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests, append([]receivedSpan(nil), r.spans...)
}

// spanAttr returns the value of attribute key among attrs, as a string
// (strings as themselves, other values as their proto text), and whether
// it is there.
func spanAttr(attrs []*commonpb.KeyValue, key string) (string, bool) {
	for _, kv := range attrs {
		if kv.GetKey() == key {
			return anyValueString(kv.GetValue()), true
		}
	}
	return "", false
}

func anyValueString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	}
	return v.String()
}

// everyText is every string a span puts in front of whoever reads the
// traces: its name, its resource's, its own, its events' and its links'
// attributes, and its status message.
func (s receivedSpan) everyText() []string {
	texts := []string{s.span.GetName(), s.span.GetStatus().GetMessage()}
	add := func(attrs []*commonpb.KeyValue) {
		for _, kv := range attrs {
			texts = append(texts, kv.GetKey()+"="+anyValueString(kv.GetValue()))
		}
	}
	add(s.resource.GetValues())
	add(s.span.GetAttributes())
	for _, e := range s.span.GetEvents() {
		texts = append(texts, e.GetName())
		add(e.GetAttributes())
	}
	for _, l := range s.span.GetLinks() {
		add(l.GetAttributes())
	}
	return texts
}

// X3, X4 end to end: the real `api serve`, told by OpenTelemetry's own
// variables where a collector listens, exports an order's create and its
// replay over OTLP/HTTP: one server span per request, named by the route
// template, carrying the outcome under the key and the key's hash, as the
// idempotency layer's span beneath it does; no span holds the key, the
// API key or a body value; the request's log line carries the trace's id.
func TestOTLPExportsIdempotencyOutcomes(t *testing.T) {
	t.Parallel()
	_, dbURL := testdb.NewPool(t)
	receiver := startOTLPReceiver(t, nil)
	srv := startServer(t, dbURL,
		"OTEL_SDK_DISABLED=", "OTEL_TRACES_EXPORTER=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=", "OTEL_EXPORTER_OTLP_PROTOCOL=",
		"OTEL_EXPORTER_OTLP_ENDPOINT="+receiver.url,
		"OTEL_SERVICE_NAME=payments-e2e",
		"OTEL_BSP_SCHEDULE_DELAY=100", // ms: the spans arrive within the test's patience
	)
	apiKey := runTenantCreate(t, dbURL, "otlp")
	idemKey := "otlp-key-" + randomHexString(t)
	reference := "otlp-ref-" + randomHexString(t)
	body := `{"reference":"` + reference + `","customer_id":"otlp-cus-5e0d1f","amount":4321,"currency":"EUR","description":"otlp-desc-8b2c7a"}`
	first, err := postOrder(srv.base, apiKey, idemKey, body)
	if err != nil || first.status != http.StatusCreated {
		t.Fatalf("create = %d %s, %v; want 201", first.status, first.body, err)
	}
	replay, err := postOrder(srv.base, apiKey, idemKey, body)
	if err != nil || replay.status != http.StatusCreated || replay.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay = %d replayed=%q %s, %v; want a replayed 201", replay.status, replay.header.Get("Idempotent-Replayed"), replay.body, err)
	}

	// The server spans of the two requests, each with the outcome under
	// the key (a search by idempotency.outcome finds the request itself)
	// and the idempotency layer's span beneath it.
	type orderTrace struct {
		server   receivedSpan
		outcome  string // idempotency.outcome of the server span
		replayed string // idempotency.replayed
		keyHash  string // idempotency.key_hash
		endpoint string // idempotency.endpoint
		layer    string // the outcome on the trace's idempotency.execute span
	}
	collect := func(spans []receivedSpan) []orderTrace {
		var traces []orderTrace
		for _, s := range spans {
			if s.span.GetKind() != tracepb.Span_SPAN_KIND_SERVER || s.span.GetName() != "POST /v1/orders" {
				continue
			}
			ot := orderTrace{server: s}
			attrs := s.span.GetAttributes()
			ot.outcome, _ = spanAttr(attrs, string(tracing.AttrOutcome))
			ot.replayed, _ = spanAttr(attrs, string(tracing.AttrReplayed))
			ot.keyHash, _ = spanAttr(attrs, string(tracing.AttrKeyHash))
			ot.endpoint, _ = spanAttr(attrs, string(tracing.AttrEndpoint))
			for _, o := range spans {
				if o.span.GetName() == "idempotency.execute" && bytes.Equal(o.span.GetTraceId(), s.span.GetTraceId()) {
					ot.layer, _ = spanAttr(o.span.GetAttributes(), string(tracing.AttrOutcome))
				}
			}
			traces = append(traces, ot)
		}
		return traces
	}
	var traces []orderTrace
	var spans []receivedSpan
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, spans = receiver.received()
		traces = collect(spans)
		outcomes := map[string]bool{}
		for _, ot := range traces {
			outcomes[ot.outcome] = true
		}
		if outcomes["executed"] && outcomes["replayed"] {
			break
		}
		if time.Now().After(deadline) {
			var names []string
			for _, s := range spans {
				names = append(names, fmt.Sprintf("%s (%s)", s.span.GetName(), s.span.GetKind()))
			}
			t.Fatalf("within 10 s the receiver got no server span \"POST /v1/orders\" with idempotency.outcome executed and one with replayed; it got %d span(s): %s",
				len(spans), strings.Join(names, ", "))
		}
		time.Sleep(100 * time.Millisecond)
	}

	for _, ot := range traces {
		if name, _ := spanAttr(ot.server.resource.GetValues(), "service.name"); name != "payments-e2e" {
			t.Errorf("resource service.name = %q, want payments-e2e (OTEL_SERVICE_NAME)", name)
		}
		wantReplayed := fmt.Sprint(ot.outcome == "replayed")
		if ot.replayed != wantReplayed {
			t.Errorf("trace with idempotency.outcome %s: idempotency.replayed = %q, want %s", ot.outcome, ot.replayed, wantReplayed)
		}
		if ot.keyHash != tracing.KeyHash(idemKey) {
			t.Errorf("trace with idempotency.outcome %s: idempotency.key_hash = %q, want the key's SHA-256 %s", ot.outcome, ot.keyHash, tracing.KeyHash(idemKey))
		}
		if ot.endpoint != "POST /v1/orders" {
			t.Errorf("trace with idempotency.outcome %s: idempotency.endpoint = %q, want POST /v1/orders", ot.outcome, ot.endpoint)
		}
		if ot.layer != ot.outcome {
			t.Errorf("trace with idempotency.outcome %s: its idempotency.execute span has outcome %q, want the same", ot.outcome, ot.layer)
		}
	}

	// X4: nothing the client sent as a secret or a body value is in any
	// span of the run.
	secrets := []string{idemKey, apiKey, strings.SplitN(apiKey, "_", 3)[2], reference, "otlp-cus-5e0d1f", "otlp-desc-8b2c7a"}
	for _, s := range spans {
		for _, text := range s.everyText() {
			for _, secret := range secrets {
				if strings.Contains(text, secret) {
					t.Errorf("span %q holds %q: %s", s.span.GetName(), secret, text)
				}
			}
		}
	}

	// X4: the request's log line names its trace and span.
	traceIDs := map[string]bool{}
	for _, ot := range traces {
		traceIDs[hex.EncodeToString(ot.server.span.GetTraceId())] = true
	}
	logged := 0
	for _, line := range srv.logLines() {
		var entry struct {
			Msg, Route string
			TraceID    string `json:"trace_id"`
			SpanID     string `json:"span_id"`
		}
		if json.Unmarshal([]byte(line), &entry) != nil || entry.Msg != "request" || entry.Route != "/v1/orders" {
			continue
		}
		if !traceIDs[entry.TraceID] || entry.SpanID == "" {
			t.Errorf("request log line with trace_id %q span_id %q, want one of the server spans' traces %v: %s", entry.TraceID, entry.SpanID, traceIDs, line)
		}
		logged++
	}
	if logged != 2 {
		t.Errorf("%d request log lines for /v1/orders, want 2", logged)
	}
}

// X3: free when off. Without OpenTelemetry's variables, with
// OTEL_SDK_DISABLED=true, or with OTEL_TRACES_EXPORTER=none, serve sends
// nothing while traffic flows, and its log lines carry no trace id. With
// the variables unset the receiver listens on OTLP/HTTP's default port
// (127.0.0.1:4318) when it is free, so a service that exported to the
// SDK's default endpoint regardless would be caught.
func TestOTLPOffSendsNothing(t *testing.T) {
	t.Parallel()
	_, dbURL := testdb.NewPool(t)
	unset := []string{"OTEL_SDK_DISABLED=", "OTEL_TRACES_EXPORTER=", "OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=", "OTEL_EXPORTER_OTLP_PROTOCOL="}
	tests := []struct {
		name string
		env  func(receiverURL string) []string
		port string // the receiver's port; "" for any
	}{
		{"Unset", func(string) []string { return nil }, "4318"},
		{"SDKDisabled", func(u string) []string { return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + u, "OTEL_SDK_DISABLED=true"} }, ""},
		{"ExporterNone", func(u string) []string {
			return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + u, "OTEL_TRACES_EXPORTER=none"}
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var ln net.Listener
			if tt.port != "" {
				if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", tt.port)); err == nil {
					ln = l
				} else {
					t.Logf("port %s is taken (%v): the receiver listens elsewhere, and only the log lines show that nothing is traced", tt.port, err)
				}
			}
			receiver := startOTLPReceiver(t, ln)
			env := slices.Concat(unset, []string{"OTEL_SERVICE_NAME=payments-e2e-off", "OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_TRACES_SAMPLER=always_on"}, tt.env(receiver.url))
			srv := startServer(t, dbURL, env...)
			apiKey := runTenantCreate(t, dbURL, "otlp-off-"+strings.ToLower(tt.name))
			idemKey := "otlp-off-" + randomHexString(t)
			body := `{"reference":"otlp-off-` + randomHexString(t) + `","customer_id":"cus_off","amount":100,"currency":"EUR"}`
			// Traffic for a second, well past the 100 ms batch delay a
			// working exporter would have flushed after.
			until := time.Now().Add(time.Second)
			for time.Now().Before(until) {
				res, err := postOrder(srv.base, apiKey, idemKey, body)
				if err != nil || res.status != http.StatusCreated {
					t.Fatalf("create = %d %s, %v; want 201", res.status, res.body, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			time.Sleep(300 * time.Millisecond)
			if requests, spans := receiver.received(); requests != 0 {
				t.Errorf("the receiver got %d export(s) (%d spans) from a service with tracing off", requests, len(spans))
			}
			for _, line := range srv.logLines() {
				if strings.Contains(line, `"trace_id"`) {
					t.Errorf("a log line carries a trace id with tracing off: %s", line)
					break
				}
			}
		})
	}
}

// logLines returns what the server logged so far, one JSON record a line.
func (p *serverProcess) logLines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Split(strings.TrimSpace(p.logs.String()), "\n")
}

func randomHexString(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// make run traces every request without a collector: api dev installs a
// provider that samples and exports nothing, so each request's log line
// carries a trace id, and its banner says so; a payment's event, logged
// as it passes on the stream, carries the trace id of the request that
// wrote it.
func TestDevTracesEveryRequest(t *testing.T) {
	t.Parallel()
	_, dbURL := testdb.NewPool(t)
	cmd := exec.Command(apiBinary(t), "dev")
	cmd.Dir = t.TempDir() // .dev/ (the demo key, the ports) goes here
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "NATS_URL="+natsURLFor(t, dbURL), "ADDR=127.0.0.1:0",
		"OTEL_SDK_DISABLED=", "OTEL_TRACES_EXPORTER=", "OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=")
	var stdout, stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		stopProcess(cmd, exited, syscall.SIGINT)
		if t.Failed() {
			t.Logf("api dev printed:\n%s\nand logged:\n%s", stdout.String(), stderr.String())
		}
	})
	banner := regexp.MustCompile(`(?s)development mode\) on (http://\S+).*export API_KEY=(\S+).*Press Ctrl-C to stop\.`)
	var m []string
	for deadline := time.Now().Add(60 * time.Second); m == nil; {
		select {
		case <-exited:
			t.Fatal("api dev ended before its banner")
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("api dev printed no banner within 60 s")
		}
		m = banner.FindStringSubmatch(stdout.String())
	}
	want := "Traces: each request's log line carries its trace_id; with a trace viewer: OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 make run"
	if !strings.Contains(stdout.String(), want) {
		t.Errorf("the banner does not say %q", want)
	}
	base, apiKey := m[1], m[2]
	res, err := postOrder(base, apiKey, "dev-trace-"+randomHexString(t), `{"reference":"dev-trace-`+randomHexString(t)+`","customer_id":"cus_dev","amount":100,"currency":"EUR"}`)
	if err != nil || res.status != http.StatusCreated {
		t.Fatalf("create = %d %s, %v; want 201", res.status, res.body, err)
	}
	var order struct{ ID string }
	if err := json.Unmarshal(res.body, &order); err != nil {
		t.Fatal(err)
	}
	res, err = post(base, apiKey, "/v1/payments", "dev-trace-pay-"+randomHexString(t), `{"order_id":"`+order.ID+`","amount":100,"currency":"EUR","payment_method":"pm_card_visa"}`)
	if err != nil || res.status != http.StatusCreated {
		t.Fatalf("payment = %d %s, %v; want 201", res.status, res.body, err)
	}

	// Each request's access line has a trace id of its own, and the
	// payment's event, logged as it passes on the stream, the payment's.
	type logged struct {
		Msg, Route, Subject string
		TraceID             string `json:"trace_id"`
	}
	find := func(match func(logged) bool) (logged, bool) {
		for _, line := range strings.Split(stderr.String(), "\n") {
			var e logged
			if json.Unmarshal([]byte(line), &e) == nil && match(e) {
				return e, true
			}
		}
		return logged{}, false
	}
	valid := regexp.MustCompile(`^[0-9a-f]{32}$`)
	var orderLine, payLine, eventLine logged
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var ok [3]bool
		orderLine, ok[0] = find(func(e logged) bool { return e.Msg == "request" && e.Route == "/v1/orders" })
		payLine, ok[1] = find(func(e logged) bool { return e.Msg == "request" && e.Route == "/v1/payments" })
		eventLine, ok[2] = find(func(e logged) bool {
			return e.Msg == "event on the stream" && e.Subject == "payments.events.payment.succeeded"
		})
		if ok == [3]bool{true, true, true} {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("within 10 s: the order's access line %t, the payment's %t, its event's line %t; want all three", ok[0], ok[1], ok[2])
		}
	}
	for what, id := range map[string]string{"the order's access line": orderLine.TraceID, "the payment's access line": payLine.TraceID} {
		if !valid.MatchString(id) || id == strings.Repeat("0", 32) {
			t.Errorf("%s has trace_id %q, want a valid one", what, id)
		}
	}
	if orderLine.TraceID == payLine.TraceID {
		t.Errorf("the order's and the payment's requests share trace_id %s, want one trace each", payLine.TraceID)
	}
	// The event is written by whichever finishes the payment first: the
	// payment request, or the simulator's webhook for the charge, which
	// arrives while the request still runs and carries no traceparent
	// (neither does a real processor's), so it is a trace of its own.
	webhook := map[string]bool{}
	for _, line := range strings.Split(stderr.String(), "\n") {
		var e logged
		if json.Unmarshal([]byte(line), &e) == nil && e.Msg == "request" && e.Route == "/v1/webhooks/processor" {
			webhook[e.TraceID] = true
		}
	}
	if eventLine.TraceID != payLine.TraceID && !webhook[eventLine.TraceID] {
		t.Errorf("the payment's event is logged with trace_id %q, want the payment request's %q or a webhook's %v", eventLine.TraceID, payLine.TraceID, webhook)
	}
}
