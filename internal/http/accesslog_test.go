package httpapi_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	apispec "github.com/idemref/payments"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
)

// lockedBuffer is a bytes.Buffer safe for the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// TestAccessLog: one line per request, a rejected one included, with the
// problem's code and the duration in milliseconds.
func TestAccessLog(t *testing.T) {
	e := setup(t)
	var buf lockedBuffer
	h := httpapi.NewHandler(httpapi.Config{
		Pool:           e.pool,
		Idem:           idem.NewStore(e.pool, idem.Config{}),
		Logger:         slog.New(slog.NewJSONHandler(&buf, nil)),
		RequestTimeout: 10 * time.Second,
		OpenAPI:        apispec.OpenAPI,
	})
	srv := httptest.NewServer(h)
	defer srv.Close()

	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders", strings.NewReader(`{"amount":-1}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.a.Key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idem.HeaderName, "log-key")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	if res.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d, want 400", res.StatusCode)
	}
	srv.Close() // waits for the handler, and with it the access line

	lines := buf.lines(t)
	if len(lines) != 1 {
		t.Fatalf("%d log lines for one rejected request, want 1:\n%v", len(lines), lines)
	}
	line := lines[0]
	if line["msg"] != "request" || line["code"] != "validation_failed" || line["status"] != float64(400) {
		t.Errorf("access line = %v, want msg request, status 400, code validation_failed", line)
	}
	if _, ok := line["duration_ms"].(float64); !ok {
		t.Errorf("access line has no numeric duration_ms: %v", line)
	}
	if _, ok := line["duration"]; ok {
		t.Errorf("access line still has the nanosecond duration: %v", line)
	}
}
