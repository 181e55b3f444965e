package logging_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemref/payments/internal/logging"
)

func TestDurationsAreMilliseconds(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logging.New(&buf, slog.LevelInfo).Info("done",
		slog.Duration("took", 5683*time.Millisecond), slog.Duration("wait_ms", 1500*time.Microsecond),
		slog.Group("retry", slog.Duration("after", 2*time.Second)), slog.Int("n", 3))
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	delete(got, "time")
	want := map[string]any{"level": "INFO", "msg": "done", "took_ms": 5683.0, "wait_ms": 1.5, "retry": map[string]any{"after_ms": 2000.0}, "n": 3.0}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("log line (-want +got):\n%s\n%s", diff, buf.String())
	}
}

// X4: a line logged with a traced request's context names its trace and
// span; one without a span names neither.
func TestLinesCarryTheTraceOfTheirContext(t *testing.T) {
	var buf bytes.Buffer
	logger := logging.New(&buf, slog.LevelInfo).With(slog.String("component", "test"))
	ctx, span := sdktrace.NewTracerProvider().Tracer("test").Start(context.Background(), "request")
	logger.InfoContext(ctx, "traced")
	span.End()
	logger.InfoContext(context.Background(), "untraced")

	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	if len(lines) != 2 {
		t.Fatalf("want 2 lines, got %q", buf.String())
	}
	var traced, untraced map[string]any
	if err := json.Unmarshal(lines[0], &traced); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(lines[1], &untraced); err != nil {
		t.Fatal(err)
	}
	if traced["trace_id"] != span.SpanContext().TraceID().String() || traced["span_id"] != span.SpanContext().SpanID().String() || traced["component"] != "test" {
		t.Errorf("traced line %s: want trace_id %s, span_id %s and the logger's attributes", lines[0], span.SpanContext().TraceID(), span.SpanContext().SpanID())
	}
	if _, ok := untraced["trace_id"]; ok {
		t.Errorf("untraced line %s has a trace_id", lines[1])
	}
}
