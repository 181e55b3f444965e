package testkit

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// Logger returns a logger that writes to t.Log at debug level, so what the
// code under test logged shows with a failing test (and with -v). Lines
// logged after the test ended are dropped: t.Log would panic on them, and
// a server or worker shutting down in a cleanup may still log. Call it
// before registering the cleanups of what logs to it, so its own cleanup
// runs after theirs.
func Logger(t testing.TB) *slog.Logger {
	w := &logWriter{t: t}
	t.Cleanup(w.stop)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type logWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

func (w *logWriter) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
}
