package main

import (
	"bytes"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	apispec "github.com/idemref/payments"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// The example against the real server: the second run resumes the same
// operation and gets the replay; one order exists.
func TestCreateOrderTwiceIsOneOrder(t *testing.T) {
	pool, _ := testdb.NewPool(t)
	tenantID, key, err := tenants.Create(t.Context(), pool, "example")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.NewHandler(httpapi.Config{
		Pool: pool, Idem: idem.NewStore(pool, idem.Config{}), Logger: slog.New(slog.DiscardHandler),
		RequestTimeout: 10 * time.Second, OpenAPI: apispec.OpenAPI,
	}))
	t.Cleanup(srv.Close)
	env := map[string]string{"API": srv.URL, "API_KEY": key}
	args := []string{"-reference", "example-1", "-state", t.TempDir()}

	var first, second bytes.Buffer
	if err := run(t.Context(), args, func(k string) string { return env[k] }, &first); err != nil {
		t.Fatal(err)
	}
	if err := run(t.Context(), args, func(k string) string { return env[k] }, &second); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(first.String(), "replayed false") || !strings.Contains(second.String(), "replayed true") {
		t.Errorf("first run:\n%s\nsecond run:\n%s\nwant a fresh create, then its replay", &first, &second)
	}
	if firstKey, secondKey := strings.SplitN(first.String(), "\n", 2)[0], strings.SplitN(second.String(), "\n", 2)[0]; firstKey != secondKey {
		t.Errorf("the second run used another key: %q, %q", firstKey, secondKey)
	}
	var n int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM orders WHERE tenant_id = $1 AND reference = 'example-1'", tenantID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("orders = %d, want 1", n)
	}
}
