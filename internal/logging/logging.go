// Package logging builds the JSON logger of the binaries, so that every
// process logs alike: one line per record, and durations in one readable
// unit (milliseconds) instead of slog's default of integer nanoseconds
// ("took":5683000000), and the trace and span ids on every line written
// with the context of a traced request (X4).
package logging

import (
	"context"
	"io"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// New returns a JSON logger writing to w at level.
func New(w io.Writer, level slog.Leveler) *slog.Logger {
	return slog.New(traceIDs{slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: durationsInMilliseconds})})
}

// traceIDs adds trace_id and span_id to a record logged with a context
// that carries a span (the *Context methods: InfoContext, ErrorContext),
// so a log line leads to its trace and back. Without a span, or with the
// no-op provider's invalid one, the record is unchanged.
type traceIDs struct{ slog.Handler }

func (h traceIDs) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceIDs) WithAttrs(attrs []slog.Attr) slog.Handler {
	return traceIDs{h.Handler.WithAttrs(attrs)}
}

func (h traceIDs) WithGroup(name string) slog.Handler { return traceIDs{h.Handler.WithGroup(name)} }

// durationsInMilliseconds writes every duration as a number of
// milliseconds, its key suffixed _ms so the unit is in the name
// ("took_ms":5683); a key that already says _ms keeps its name.
func durationsInMilliseconds(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() != slog.KindDuration {
		return a
	}
	key := a.Key
	if len(key) < 3 || key[len(key)-3:] != "_ms" {
		key += "_ms"
	}
	return slog.Float64(key, float64(a.Value.Duration())/float64(time.Millisecond))
}
