package httpapi_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	apispec "github.com/idemref/payments"
	"github.com/idemref/payments/client/api"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/testdb"
)

// R6: past its budget of live keys a tenant's request with a new key is
// answered 429 idempotency_key_budget_exceeded with Retry-After, before
// any claim: nothing is recorded, so the same key runs normally once the
// budget has room. A key it holds still replays.
func TestKeyBudgetRefusal(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	_, apiKey, err := tenants.Create(t.Context(), pool, "budget "+uuid.NewString())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.NewHandler(httpapi.Config{
		Pool: pool, Idem: idem.NewStore(pool, idem.Config{KeyBudget: 2}), Logger: slog.New(slog.DiscardHandler),
		RequestTimeout: 10 * time.Second, OpenAPI: apispec.OpenAPI,
	}))
	t.Cleanup(srv.Close)
	create := func(key, ref string) (response, []byte) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders", strings.NewReader(fmt.Sprintf(
			`{"reference":%q,"customer_id":"cus_1","amount":1000,"currency":"EUR"}`, ref)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		return response{status: res.StatusCode, header: res.Header, body: body}, body
	}
	count := func(table string) int {
		var n int
		if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for i := range 2 {
		if res, body := create(fmt.Sprintf("k-%d", i), fmt.Sprintf("ref-%d", i)); res.status != http.StatusCreated {
			t.Fatalf("create %d = %d %s", i, res.status, body)
		}
	}
	res, body := create("k-2", "ref-2")
	var p api.Problem
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatal(err)
	}
	if res.status != http.StatusTooManyRequests || p.Code != httpapi.CodeKeyBudgetExceeded || res.header.Get("Retry-After") != "60" ||
		res.header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("a new key past the budget = %d %s (Retry-After %q); want 429 %s with Retry-After 60",
			res.status, body, res.header.Get("Retry-After"), httpapi.CodeKeyBudgetExceeded)
	}
	if keys, orders := count("idempotency_keys"), count("orders"); keys != 2 || orders != 2 {
		t.Errorf("rows after the refusal: %d keys, %d orders; want 2 and 2", keys, orders)
	}
	if res, body := create("k-0", "ref-0"); res.status != http.StatusCreated || res.header.Get(httpapi.ReplayedHeader) != "true" {
		t.Errorf("a held key past the budget = %d %s, want its replay", res.status, body)
	}
}
