package logging_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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
