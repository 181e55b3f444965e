package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// What tracing costs a create (X3): a third API process, the same binary
// and settings as the load API, runs with OpenTelemetry on, every request
// sampled (OTEL_TRACES_SAMPLER=always_on), exporting over OTLP/HTTP to a
// sink in this process; its creates run in the same rounds as the untraced
// ones, and the ratio is taken round by round.

// tracedEnv is what the traced API runs with, on top of the load API's
// settings. The batch processor keeps the SDK's defaults (batches of 512,
// a queue of 2048) but for its schedule delay: under load a batch fills
// and leaves long before the default 5 s, and 200 ms lets the benchmark
// see the last spans of a run arrive before the next run starts.
func tracedEnv(sinkURL string) []string {
	return []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + sinkURL,
		"OTEL_TRACES_SAMPLER=always_on",
		"OTEL_SERVICE_NAME=payments-loadtest",
		"OTEL_BSP_SCHEDULE_DELAY=200",
	}
}

// untracedEnv clears OpenTelemetry's variables for the untraced APIs: the
// benchmark's "tracing off" is the service's default, whatever the shell
// that runs it has set.
var untracedEnv = []string{
	"OTEL_SDK_DISABLED=", "OTEL_TRACES_EXPORTER=", "OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=",
}

// spanSink is an OTLP/HTTP trace receiver that reads and discards what it
// is sent, counting the spans and the server spans of POST /v1/orders: the
// benchmark checks with them that the traced API traced and the untraced
// one did not.
type spanSink struct {
	srv *http.Server
	url string

	mu          sync.Mutex
	spans       int
	createSpans int // server spans named "POST /v1/orders"
	badExports  int
	names       map[string]bool // the first few span names seen, for an error message
}

func startSpanSink() (*spanSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &spanSink{url: "http://" + ln.Addr().String(), names: map[string]bool{}}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serveHTTP), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *spanSink) serveHTTP(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	var export collectortrace.ExportTraceServiceRequest
	if err == nil && r.URL.Path == "/v1/traces" {
		err = proto.Unmarshal(b, &export)
	}
	if err != nil || r.URL.Path != "/v1/traces" {
		s.mu.Lock()
		s.badExports++
		s.mu.Unlock()
		http.Error(w, "want an OTLP/HTTP protobuf export on /v1/traces", http.StatusBadRequest)
		return
	}
	spans, creates := 0, 0
	for _, rs := range export.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				spans++
				if sp.GetKind() == tracepb.Span_SPAN_KIND_SERVER && sp.GetName() == "POST /v1/orders" {
					creates++
				}
				s.mu.Lock()
				if len(s.names) < 30 {
					s.names[fmt.Sprintf("%q (%s)", sp.GetName(), sp.GetKind())] = true
				}
				s.mu.Unlock()
			}
		}
	}
	s.mu.Lock()
	s.spans += spans
	s.createSpans += creates
	s.mu.Unlock()
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// sinkCounts is what the sink received up to a moment.
type sinkCounts struct{ spans, createSpans, badExports int }

func (s *spanSink) counts() sinkCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sinkCounts{s.spans, s.createSpans, s.badExports}
}

// settle waits until the sink holds want server spans of creates, or
// their count has not moved for quiet (the SDK dropped some: its queue
// was full), at most limit. Spans of the traced API's background jobs do
// not count: they arrive whatever the load.
func (s *spanSink) settle(ctx context.Context, want int, quiet, limit time.Duration) {
	deadline := time.Now().Add(limit)
	last, since := -1, time.Now()
	for time.Now().Before(deadline) && ctx.Err() == nil {
		n := s.counts().createSpans
		if n >= want {
			return
		}
		if n != last {
			last, since = n, time.Now()
		} else if time.Since(since) >= quiet {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *spanSink) close() { _ = s.srv.Close() }

// tracedRun is one traced or untraced create run's spans.
type tracedRun struct {
	spans, createSpans int
}

// withSpans runs fn, waits for the traced API's last spans and returns
// what the sink received meanwhile, failing when a traced run sent no
// span for its creates or an untraced one sent any.
func (s *spanSink) withSpans(ctx context.Context, name string, traced bool, fn func() (outcome, error)) (outcome, tracedRun, error) {
	before := s.counts()
	out, err := fn()
	if err != nil {
		return out, tracedRun{}, err
	}
	if traced {
		// A batch leaves every 200 ms at the latest (tracedEnv).
		s.settle(ctx, before.createSpans+out.ok, time.Second, 15*time.Second)
	}
	after := s.counts()
	run := tracedRun{spans: after.spans - before.spans, createSpans: after.createSpans - before.createSpans}
	switch {
	case after.badExports != before.badExports:
		return out, run, fmt.Errorf("%s: the span sink refused %d export(s) it could not decode", name, after.badExports-before.badExports)
	case traced && run.createSpans == 0:
		s.mu.Lock()
		names := slices.Sorted(maps.Keys(s.names))
		s.mu.Unlock()
		return out, run, fmt.Errorf("%s: the traced API answered %d creates and the sink received no server span \"POST /v1/orders\" (%d spans in all, named %s)", name, out.ok, run.spans, strings.Join(names, ", "))
	case !traced && run.createSpans != 0:
		return out, run, fmt.Errorf("%s: tracing is off, yet the sink received %d server spans \"POST /v1/orders\" during the run", name, run.createSpans)
	}
	return out, run, nil
}
