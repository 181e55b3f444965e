package httpapi_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	httpapi "github.com/idemref/payments/internal/http"
)

// G6: /metrics and the profiler are served by the admin handler, and the
// public handler answers them as unknown paths. Mutation: mount
// promhttp.Handler() at /metrics on the public router again and
// System/MetricsOnlyOnTheAdminListener in TestHostileRequests fails.
func TestAdminHandlerServesMetricsAndProfiler(t *testing.T) {
	admin := httptest.NewServer(httpapi.NewAdminHandler())
	t.Cleanup(admin.Close)
	for _, tt := range []struct{ path, want string }{
		{"/metrics", "go_goroutines"},
		{"/debug/pprof/", "goroutine"},
		{"/debug/pprof/cmdline", ".test"}, // the test binary's name
		{"/debug/pprof/heap?debug=1", "heap profile"},
		{"/debug/pprof/goroutine?debug=1", "goroutine profile"},
	} {
		res, err := admin.Client().Get(admin.URL + tt.path)
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, res)
		if res.StatusCode != http.StatusOK || !strings.Contains(body, tt.want) {
			t.Errorf("admin GET %s = %d, want 200 with %q in:\n%.300s", tt.path, res.StatusCode, tt.want, body)
		}
	}
	// Nothing else: the admin listener is not a second public API.
	for _, path := range []string{"/v1/orders", "/healthz", "/openapi.yaml"} {
		res, err := admin.Client().Get(admin.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = readAll(t, res)
		if res.StatusCode != http.StatusNotFound {
			t.Errorf("admin GET %s = %d, want 404", path, res.StatusCode)
		}
	}
}

func readAll(t *testing.T, res *http.Response) string {
	t.Helper()
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
