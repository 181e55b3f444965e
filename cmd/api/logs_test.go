package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/idemref/payments/internal/tooling/processorsim"
	"github.com/idemref/payments/internal/tooling/testdb"
)

// docs/operations.md promises that serve's logs never contain API keys,
// idempotency keys or request bodies. A whole run of a real process
// (orders, a replay, a validation failure, a payment, a refund, the key
// status endpoint, a wrong API key) is grepped for every key and every
// distinctive body value it was sent.
func TestServeLogsNoKeysOrBodies(t *testing.T) {
	t.Parallel()
	_, dbURL := testdb.NewPool(t)
	sim, err := processorsim.Start("127.0.0.1:0", processorsim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Shutdown(context.Background()) })
	srv := startServer(t, dbURL, "PROCESSOR_URL="+sim.URL(), "LOG_LEVEL=debug")
	apiKey := runTenantCreate(t, dbURL, "logs")
	wrongKey := "sk_" + strings.Repeat("ab", 16) + "_wrongsecretwrongsecretwrongsecretwrongsecr"

	secrets := []string{apiKey, wrongKey, strings.SplitN(apiKey, "_", 3)[2]}
	send := func(method, path, idemKey, body string, want int) response {
		t.Helper()
		if idemKey != "" {
			secrets = append(secrets, idemKey)
		}
		res, err := post(srv.base, apiKey, path, idemKey, body)
		if method != http.MethodPost {
			req, _ := http.NewRequest(method, srv.base+path, nil)
			req.Header.Set("Authorization", "Bearer "+apiKey)
			r, derr := http.DefaultClient.Do(req)
			if derr == nil {
				r.Body.Close()
				res = response{status: r.StatusCode}
			}
			err = derr
		}
		if err != nil {
			t.Fatal(err)
		}
		if res.status != want {
			t.Fatalf("%s %s = %d %s, want %d", method, path, res.status, res.body, want)
		}
		return res
	}
	order := send(http.MethodPost, "/v1/orders", "log-key-order-7f3a9c",
		`{"reference":"log-ref-51d2e8","customer_id":"log-cus-a40b71","amount":1234,"currency":"EUR","description":"log-desc-9e61c0","metadata":{"log-meta-key-2b":"log-meta-val-c3"}}`, http.StatusCreated)
	send(http.MethodPost, "/v1/orders", "log-key-order-7f3a9c",
		`{"reference":"log-ref-51d2e8","customer_id":"log-cus-a40b71","amount":1234,"currency":"EUR","description":"log-desc-9e61c0","metadata":{"log-meta-key-2b":"log-meta-val-c3"}}`, http.StatusCreated)
	send(http.MethodPost, "/v1/orders", "log-key-invalid-44e1b2", `{"reference":"log-bad-ref-0c9d","customer_id":"","amount":0,"currency":"eur"}`, http.StatusBadRequest)
	orderID := jsonField(t, order.body, "id")
	pay := send(http.MethodPost, "/v1/payments", "log-key-pay-b81f04",
		fmt.Sprintf(`{"order_id":%q,"amount":1234,"currency":"EUR","payment_method":"pm_card_visa"}`, orderID), http.StatusCreated)
	send(http.MethodPost, "/v1/payments/"+jsonField(t, pay.body, "id")+"/refunds", "log-key-refund-5a0d93", `{"amount":100}`, http.StatusCreated)
	send(http.MethodGet, "/v1/idempotency-keys/"+url.PathEscape("log-key-order-7f3a9c")+"?endpoint=POST%20/v1/orders", "", "", http.StatusOK)
	if res, err := post(srv.base, wrongKey, "/v1/orders", "log-key-unauth-6e2f", `{}`); err != nil || res.status != http.StatusUnauthorized {
		t.Fatalf("a wrong key = %d, %v", res.status, err)
	}
	secrets = append(secrets, "log-key-unauth-6e2f", "log-ref-51d2e8", "log-cus-a40b71", "log-desc-9e61c0", "log-meta-key-2b", "log-meta-val-c3", "log-bad-ref-0c9d")

	srv.mu.Lock()
	logs := srv.logs.String()
	srv.mu.Unlock()
	if !strings.Contains(logs, `"msg":"request"`) {
		t.Fatalf("the server logged no request line; the test reads the wrong stream:\n%s", logs)
	}
	for _, s := range secrets {
		if strings.Contains(logs, s) {
			for line := range strings.SplitSeq(logs, "\n") {
				if strings.Contains(line, s) {
					t.Errorf("the log holds %q: %s", s, line)
					break
				}
			}
		}
	}
}

// jsonField returns the string member name of a JSON object body.
func jsonField(t *testing.T, body []byte, name string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	s, _ := m[name].(string)
	if s == "" {
		t.Fatalf("%s has no %q", body, name)
	}
	return s
}
