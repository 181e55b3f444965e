package httpapi_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	apispec "github.com/idemref/payments"
	"github.com/idemref/payments/client/api"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/processor/simproc"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/processorsim"
	"github.com/idemref/payments/internal/tooling/testdb"
)

// fuzzMethods are the methods a fuzz input picks from by index.
var fuzzMethods = []string{
	http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodHead, http.MethodOptions,
}

// FuzzRequest sends arbitrary requests through the whole handler, with a
// valid API key, against a real database and processor simulator (H, F4,
// R3): whatever the bytes, the answer is never a 500 or any 5xx but 503,
// nothing panics, and every error is a problem document with a code.
func FuzzRequest(f *testing.F) {
	handler, apiKey, paymentID := fuzzServer(f)

	order := `{"reference":"fuzz-1","customer_id":"cus_1","amount":2500,"currency":"EUR","metadata":{"plan":"pro"}}`
	const ctJSON = "application/json"
	seeds := []struct {
		method                 string
		path, name, value, key string
		contentType            string
		body                   string
	}{
		{http.MethodPost, "/v1/orders", "", "", "fuzz-key-1", ctJSON, order},
		{http.MethodPost, "/v1/orders", "Content-Encoding", "gzip", "fuzz-key-2", ctJSON, order},
		{http.MethodPost, "/v1/orders", "", "", "fuzz-key-3", ctJSON, `{"metadata":` + strings.Repeat("[", 10000)},
		{http.MethodPost, "/v1/orders", "", "", "fuzz-key-4", ctJSON, `{"reference":"a\u0000","customer_id":"c","amount":1,"currency":"EUR","metadata":{"k\u0000":"v"}}`},
		{http.MethodPost, "/v1/orders", "", "", "fuzz-key-5", "application/json; charset=latin1", "{\"reference\":\"\xff\xfe\",\"customer_id\":\"\xc3\x28\",\"amount\":1,\"currency\":\"EUR\"}"},
		{http.MethodPost, "/v1/orders", "Authorization", "Bearer x", strings.Repeat("k", 10000), ctJSON, order},
		{http.MethodPost, "/v1/payments", "", "", `"fuzz-pay-seed"`, ctJSON, `{"order_id":"abcd","amount":1e3,"currency":"EUR","payment_method":"pm_\ud800"}`},
		{http.MethodPost, "/v1/payments/" + paymentID + "/refunds", "", "", "fuzz-refund", ctJSON, `{"amount":100}`},
		{http.MethodPost, "/v1/payments/" + paymentID + "/refunds", idem.HeaderName, "second-line", "fuzz-refund-2", ctJSON, `{"amount":0}`},
		{http.MethodGet, "/v1/orders?limit=101&cursor=%ff%00", "", "", "", "", ""},
		{http.MethodGet, "/v1/orders/../payments/%2e%2e/refunds", "X-Request-Id", strings.Repeat("\x01", 100), "", "", ""},
		{http.MethodDelete, "//v1//orders/", "", "", "", "", ""},
		{http.MethodOptions, "*", "Content-Type", "text/plain", "", "", ""},
		{http.MethodGet, "/metrics", "Accept", "application/openmetrics-text", "", "", ""},
	}
	for _, s := range seeds {
		f.Add(uint8(methodIndex(s.method)), s.path, s.name, s.value, s.key, s.contentType, []byte(s.body))
	}

	f.Fuzz(func(t *testing.T, method uint8, path, name, value, key, contentType string, body []byte) {
		req := fuzzRequest(t, fuzzMethods[int(method)%len(fuzzMethods)], path, body)
		req.Header.Set("Authorization", "Bearer "+apiKey)
		if key != "" {
			req.Header.Set(idem.HeaderName, key)
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		if name != "" {
			k := http.CanonicalHeaderKey(name)
			req.Header[k] = append(req.Header[k], value)
		}

		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)

		status := rec.Code
		if status >= 500 && status != http.StatusServiceUnavailable {
			t.Fatalf("%s %q → %d; body: %.500s", req.Method, path, status, rec.Body.Bytes())
		}
		if status < 400 {
			return
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
			t.Fatalf("%s %q → %d with Content-Type %q, want application/problem+json; body: %.500s",
				req.Method, path, status, ct, rec.Body.Bytes())
		}
		var p api.Problem
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Code == "" || p.Status != status {
			t.Fatalf("%s %q → %d with a problem that has no code or another status (%v); body: %.500s",
				req.Method, path, status, err, rec.Body.Bytes())
		}
	})
}

func methodIndex(method string) int {
	for i, m := range fuzzMethods {
		if m == method {
			return i
		}
	}
	panic("unknown method " + method)
}

// fuzzRequest builds a request for any path, also one that no client could
// send: what does not parse as a request target becomes the raw path.
func fuzzRequest(t *testing.T, method, path string, body []byte) *http.Request {
	req := httptest.NewRequestWithContext(t.Context(), method, "/", bytes.NewReader(body))
	if path == "" {
		path = "/"
	}
	u, err := url.ParseRequestURI(path)
	if err != nil {
		u = &url.URL{Path: path}
	}
	req.URL = u
	req.RequestURI = path
	req.Header = http.Header{}
	return req
}

// fuzzServer is setup for a fuzz target: one environment per fuzz process,
// built before f.Fuzz and shared by every input (setup takes a *testing.T).
// It returns the handler, tenant a's API key and a paid payment to refund.
func fuzzServer(tb testing.TB) (http.Handler, string, string) {
	pool, _ := testdb.NewPool(tb)
	_, apiKey, err := tenants.Create(tb.Context(), pool, "fuzz tenant")
	if err != nil {
		tb.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	store := idem.NewStore(pool, idem.Config{LockTimeout: lockTimeout, Lease: paymentLease})
	sim := processorsim.New(processorsim.Config{Logger: logger})
	simSrv := httptest.NewServer(sim.Handler())
	tb.Cleanup(simSrv.Close)
	svc := payments.NewService(pool, store, simproc.NewClient(simSrv.URL, processorTimeout), httpapi.Renderer{}, logger,
		payments.Config{SettleWindow: settleWindow})
	handler := httpapi.NewHandler(httpapi.Config{
		Pool:           pool,
		Idem:           store,
		Payments:       svc,
		Logger:         logger,
		RequestTimeout: 10 * time.Second,
		OpenAPI:        apispec.OpenAPI,
	})

	// A paid order, so refunds have something to refund.
	send := func(path, key, body string) []byte {
		req := httptest.NewRequestWithContext(tb.Context(), http.MethodPost, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set(idem.HeaderName, key)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated {
			tb.Fatalf("POST %s = %d; body: %s", path, rec.Code, rec.Body.Bytes())
		}
		return rec.Body.Bytes()
	}
	var o api.Order
	if err := json.Unmarshal(send("/v1/orders", "fuzz-order", orderBody("fuzz-paid")), &o); err != nil {
		tb.Fatal(err)
	}
	var p api.Payment
	if err := json.Unmarshal(send("/v1/payments", "fuzz-pay", payBody(o.Id.String(), cardVisa)), &p); err != nil {
		tb.Fatal(err)
	}
	return handler, apiKey, p.Id.String()
}
