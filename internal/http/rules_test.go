package httpapi_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/go-cmp/cmp"

	apispec "github.com/idemref/payments"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
)

// rulesRow mirrors one endpoint of GET /v1/idempotency.
type rulesRow struct {
	Endpoint string `json:"endpoint"`
	Key      struct {
		Header    string `json:"header"`
		MaxLength int    `json:"max_length"`
	} `json:"key"`
	ResultRetentionSeconds    int64    `json:"result_retention_seconds"`
	TombstoneRetentionSeconds int64    `json:"tombstone_retention_seconds"`
	LockWaitSeconds           float64  `json:"lock_wait_seconds"`
	PreferWaitMaxSeconds      int64    `json:"prefer_wait_max_seconds"`
	LeaseSeconds              float64  `json:"lease_seconds"`
	Recorded                  []string `json:"recorded"`
	FingerprintExclude        []string `json:"fingerprint_exclude"`
}

// L8: the rules document states what the server enforces, and the test
// holds each statement to the behaviour: a key of max_length is taken and
// one longer refused; a completed key's row expires and is forgotten at
// the retentions stated; the lock wait and the Prefer maximum are the
// store's and the waiters'; the recorded outcomes and the exclusions are
// those openapi.yaml declares (read here on its own, by kin-openapi).
// It is cacheable: an ETag, and a 304 for it.
func TestRulesDocumentStatesWhatTheServerEnforces(t *testing.T) {
	t.Parallel()
	e := setup(t, withPreferWait(idem.WaitLimits{Max: 7 * time.Second, PerTenant: 1, PerProcess: 1}))
	res := e.get(t, e.a.Key, "/v1/idempotency")
	wantStatus(t, res, http.StatusOK)
	if got := res.header.Get("Cache-Control"); got != "private, max-age=300" {
		t.Errorf("Cache-Control = %q, want private, max-age=300", got)
	}
	var doc struct{ Endpoints []rulesRow }
	if err := json.Unmarshal(res.body, &doc); err != nil {
		t.Fatal(err)
	}
	contract := declaredRules(t)
	var names []string
	for _, row := range doc.Endpoints {
		names = append(names, row.Endpoint)
		declared := contract[row.Endpoint]
		if diff := cmp.Diff(declared.Recorded, row.Recorded); diff != "" {
			t.Errorf("%s: recorded differs from openapi.yaml (-contract +document):\n%s", row.Endpoint, diff)
		}
		if diff := cmp.Diff(declared.Exclude, row.FingerprintExclude); diff != "" {
			t.Errorf("%s: fingerprint_exclude differs from openapi.yaml (-contract +document):\n%s", row.Endpoint, diff)
		}
		if row.Key.Header != idem.HeaderName || row.LockWaitSeconds != lockTimeout.Seconds() || row.PreferWaitMaxSeconds != 7 {
			t.Errorf("%s: %+v, want header %s, lock wait %s, Prefer maximum 7", row.Endpoint, row, idem.HeaderName, lockTimeout)
		}
		if strings.HasPrefix(row.Endpoint, "POST /v1/payments") != (row.LeaseSeconds == paymentLease.Seconds()) {
			t.Errorf("%s: lease_seconds = %v, want %v for a payment or a refund only", row.Endpoint, row.LeaseSeconds, paymentLease.Seconds())
		}
	}
	var want []string
	for _, ep := range httpapi.Endpoints {
		want = append(want, ep.String())
	}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Fatalf("endpoints (-keyed +document):\n%s", diff)
	}
	orders := doc.Endpoints[slices.Index(names, endpointOrders)]

	t.Run("KeyMaxLengthIsEnforced", func(t *testing.T) {
		ok := e.post(t, e.a.Key, strings.Repeat("k", orders.Key.MaxLength), orderBody("max-key"))
		wantStatus(t, ok, http.StatusCreated)
		long := e.post(t, e.a.Key, strings.Repeat("k", orders.Key.MaxLength+1), orderBody("long-key"))
		wantProblem(t, long, http.StatusBadRequest, "idempotency_key_invalid")
	})
	t.Run("RetentionsAreTheRecords", func(t *testing.T) {
		wantStatus(t, e.post(t, e.a.Key, "retained", orderBody("retained")), http.StatusCreated)
		var result, tombstone float64
		if err := e.pool.QueryRow(t.Context(), `
			SELECT extract(epoch FROM expires_at - created_at), extract(epoch FROM retain_until - created_at)
			FROM idempotency_keys WHERE tenant_id = $1 AND idem_key = 'retained'`, e.a.ID).Scan(&result, &tombstone); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name      string
			row, said float64
		}{{"result", result, float64(orders.ResultRetentionSeconds)}, {"tombstone", tombstone, float64(orders.TombstoneRetentionSeconds)}} {
			if c.row < c.said-2 || c.row > c.said+2 {
				t.Errorf("%s kept %.0f s, the document says %.0f s", c.name, c.row, c.said)
			}
		}
	})
	t.Run("RevalidatesWithItsETag", func(t *testing.T) {
		etag := res.header.Get("ETag")
		if etag == "" {
			t.Fatal("no ETag")
		}
		again := e.do(t, http.MethodGet, "/v1/idempotency", e.a.Key, nil, withHeader("If-None-Match", etag))
		if again.status != http.StatusNotModified || len(again.body) != 0 {
			t.Errorf("If-None-Match: %d %q, want 304 without a body", again.status, again.body)
		}
	})
}

// declared is what x-idempotency of an operation says.
type declared struct{ Recorded, Exclude []string }

// declaredRules reads x-idempotency of every keyed POST from openapi.yaml.
func declaredRules(t *testing.T) map[string]declared {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(apispec.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]declared{}
	for path, item := range doc.Paths.Map() {
		if item.Post == nil || item.Post.Extensions["x-idempotency"] == nil {
			continue
		}
		raw, err := json.Marshal(item.Post.Extensions["x-idempotency"])
		if err != nil {
			t.Fatal(err)
		}
		var x struct {
			Recorded []string `json:"recorded"`
			Exclude  []string `json:"fingerprint-exclude"`
		}
		if err := json.Unmarshal(raw, &x); err != nil {
			t.Fatal(err)
		}
		if x.Exclude == nil {
			x.Exclude = []string{}
		}
		out["POST "+path] = declared{x.Recorded, x.Exclude}
	}
	return out
}

// F5: what the contract excludes from POST /v1/orders' fingerprint
// (/metadata/request_id) may change on a retry, which is replayed; a
// change of anything else (the amount, another metadata member) is 422,
// and nothing more is written: one order, one key.
func TestFingerprintIgnoresWhatTheContractExcludes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	body := func(requestID string, amount int, note string) string {
		meta := map[string]string{"note": note}
		if requestID != "" {
			meta["request_id"] = requestID
		}
		m, _ := json.Marshal(meta)
		return fmt.Sprintf(`{"reference":"inv-ex","customer_id":"cus_1","amount":%d,"currency":"EUR","metadata":%s}`, amount, m)
	}
	first := e.post(t, e.a.Key, "excluded", body("trace-1", 2500, "a"))
	wantStatus(t, first, http.StatusCreated)
	for _, c := range []struct {
		name, body string
		code       string // "": replayed
	}{
		{"ChangedRequestIDReplays", body("trace-2", 2500, "a"), ""},
		{"OmittedRequestIDReplays", body("", 2500, "a"), ""},
		{"ChangedAmountIs422", body("trace-3", 2600, "a"), "idempotency_key_reused"},
		{"ChangedOtherMetadataIs422", body("trace-1", 2500, "b"), "idempotency_key_reused"},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := e.post(t, e.a.Key, "excluded", c.body)
			if c.code == "" {
				wantReplay(t, first, res)
				return
			}
			wantProblem(t, res, http.StatusUnprocessableEntity, c.code)
		})
	}
	e.wantRows(t, 1, 1)
	var requestID string
	if err := e.pool.QueryRow(t.Context(), `SELECT metadata->>'request_id' FROM orders WHERE reference = 'inv-ex'`).Scan(&requestID); err != nil {
		t.Fatal(err)
	}
	if requestID != "trace-1" {
		t.Errorf("the order holds request_id %q, want the first request's trace-1", requestID)
	}
}

// F5: a contract that excludes an amount, a currency or a target (a part
// of one, or the whole body) from a fingerprint is refused, so the server does
// not start with it; the one shipped is accepted.
func TestContractRefusesExclusionsOfWhatARequestMoves(t *testing.T) {
	t.Parallel()
	if err := httpapi.CheckContract(apispec.OpenAPI); err != nil {
		t.Fatalf("the shipped contract: %v", err)
	}
	for _, pointer := range []string{"/amount", "/currency", "/reference", "/order_id", "/amount/value", "", "/", "metadata"} {
		spec := strings.Replace(string(apispec.OpenAPI), "fingerprint-exclude: [/metadata/request_id]", "fingerprint-exclude: ['"+pointer+"']", 1)
		if spec == string(apispec.OpenAPI) {
			t.Fatal("openapi.yaml no longer excludes /metadata/request_id from POST /v1/orders")
		}
		if err := httpapi.CheckContract([]byte(spec)); err == nil {
			t.Errorf("fingerprint-exclude [%q] was accepted", pointer)
		}
	}
}

// Problem types resolve: every problem's type, resolved against the URL
// the client called, is a page this server serves, with an anchor per code
// and the rule under it; every code the contract lists has one. A keyed
// endpoint's problem links to the rules of keys, which answer.
func TestProblemTypesResolve(t *testing.T) {
	t.Parallel()
	e := setup(t)
	res := e.do(t, http.MethodPost, "/v1/orders", e.a.Key, []byte(orderBody("no-key")))
	wantProblem(t, res, http.StatusBadRequest, "idempotency_key_missing")
	var keyed map[string]any
	if err := json.Unmarshal(res.body, &keyed); err != nil || keyed["idempotency_rules"] != "/v1/idempotency" {
		t.Errorf("idempotency_rules = %v (%v), want /v1/idempotency", keyed["idempotency_rules"], err)
	}
	wantStatus(t, e.get(t, e.a.Key, "/v1/idempotency"), http.StatusOK)
	var notKeyed map[string]any
	_ = json.Unmarshal(e.get(t, e.a.Key, "/v1/orders/00000000-0000-4000-8000-000000000000").body, &notKeyed)
	if notKeyed["idempotency_rules"] != nil {
		t.Errorf("a problem of a route without keys links to the rules: %v", notKeyed)
	}

	called, err := url.Parse(e.srv.URL + "/v1/orders")
	if err != nil {
		t.Fatal(err)
	}
	pages := map[string]string{}
	for _, code := range contractCodes(t) {
		ref, err := url.Parse(httpapi.ProblemType(code))
		if err != nil {
			t.Fatal(err)
		}
		target := called.ResolveReference(ref)
		page, ok := pages[target.Path]
		if !ok {
			r, err := e.client.Get(target.String())
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(r.Body)
			_ = r.Body.Close()
			if r.StatusCode != http.StatusOK {
				t.Fatalf("%s: %d", target, r.StatusCode)
			}
			page, pages[target.Path] = string(b), string(b)
		}
		rule := regexp.MustCompile(`<dt id="` + regexp.QuoteMeta(target.Fragment) + `"><code>` + regexp.QuoteMeta(code) + `</code> \(\d+\)</dt>\s*<dd>([^<]{20,})</dd>`)
		if !rule.MatchString(page) {
			t.Errorf("%s: no anchor #%s with the rule of %s", target.Path, target.Fragment, code)
		}
	}
}

// contractCodes is every problem code openapi.yaml lists.
func contractCodes(t *testing.T) []string {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(apispec.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	raw, _ := json.Marshal(doc.Components.Schemas["Problem"].Value.Properties["code"].Value.Extensions["x-extensible-enum"])
	if err := json.Unmarshal(raw, &codes); err != nil || len(codes) < 30 {
		t.Fatalf("x-extensible-enum: %v (%d codes)", err, len(codes))
	}
	return codes
}
