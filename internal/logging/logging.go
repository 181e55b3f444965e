// Package logging builds the JSON logger of the binaries, so that every
// process logs alike: one line per record, and durations in one readable
// unit (milliseconds) instead of slog's default of integer nanoseconds
// ("took":5683000000).
package logging

import (
	"io"
	"log/slog"
	"time"
)

// New returns a JSON logger writing to w at level.
func New(w io.Writer, level slog.Leveler) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: durationsInMilliseconds}))
}

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
