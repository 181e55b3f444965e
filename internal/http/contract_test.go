package httpapi_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/go-chi/chi/v5"
	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	apispec "github.com/idemref/payments"
	"github.com/idemref/payments/client/api"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/tooling/processorsim"
	"github.com/idemref/payments/internal/webhook"
)

// specServer is the origin of the spec's only server; lookup requests are
// built against it so the kin router matches them.
const specServer = "http://localhost:8080"

func loadSpec(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(apispec.OpenAPI)
	if err != nil {
		t.Fatalf("load openapi.yaml: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("openapi.yaml is not a valid OpenAPI document: %v", err)
	}
	return doc
}

// The router and the spec describe the same set of operations: no route
// that the spec does not document, no documented operation without a route.
func TestContractRoutesMatchSpec(t *testing.T) {
	t.Parallel()
	doc := loadSpec(t)
	var documented []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented = append(documented, method+" "+path)
		}
	}
	sort.Strings(documented)

	h := httpapi.NewHandler(httpapi.Config{Logger: slog.New(slog.DiscardHandler), OpenAPI: apispec.OpenAPI})
	routes, ok := h.(chi.Routes)
	if !ok {
		t.Fatalf("NewHandler returned %T, not a chi.Routes", h)
	}
	var served []string
	err := chi.Walk(routes, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		// chi spells a subrouter's root "/v1/orders/"; the spec "/v1/orders".
		if route != "/" {
			route = strings.TrimSuffix(route, "/")
		}
		// The load benchmark's baseline, in -tags loadtest builds only, is
		// a fixture of the benchmark, not part of the API.
		if strings.HasPrefix(route, "/v1/_baseline/") {
			return nil
		}
		served = append(served, method+" "+route)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(served)
	served = slices.Compact(served)

	if diff := cmp.Diff(documented, served); diff != "" {
		t.Errorf("operations (-documented in openapi.yaml +served by the router):\n%s", diff)
	}
}

// contract validates real responses against openapi.yaml and remembers
// which documented responses were seen.
type contract struct {
	doc    *openapi3.T
	router routers.Router
	opts   *openapi3filter.Options
	// seen: "METHOD /path status" of every validated response.
	seen map[string]bool
	// problems: one real problem body per code.
	problems map[string]api.Problem
}

// textBody decodes the body of a text response (the docs page and its
// script) as the string its schema declares; kin knows only text/plain.
func textBody(body io.Reader, _ http.Header, _ *openapi3.SchemaRef, _ openapi3filter.EncodingFn) (any, error) {
	b, err := io.ReadAll(body)
	return string(b), err
}

func init() {
	openapi3filter.RegisterBodyDecoder("text/html", textBody)
	openapi3filter.RegisterBodyDecoder("text/javascript", textBody)
}

func newContract(t *testing.T) *contract {
	t.Helper()
	doc := loadSpec(t)
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatalf("kin router: %v", err)
	}
	return &contract{
		doc:    doc,
		router: router,
		opts: &openapi3filter.Options{
			IncludeResponseStatus: true, // an undocumented status fails
			MultiError:            true,
			AuthenticationFunc:    openapi3filter.NoopAuthenticationFunc,
		},
		seen:     map[string]bool{},
		problems: map[string]api.Problem{},
	}
}

// check validates res, the answer to method target (path and query),
// against the operation the spec documents for it.
func (c *contract) check(t *testing.T, method, target string, res response) {
	t.Helper()
	req, err := http.NewRequest(method, specServer+target, nil)
	if err != nil {
		t.Fatal(err)
	}
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		t.Fatalf("%s %s: no operation in openapi.yaml: %v", method, target, err)
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: req, PathParams: params, Route: route, Options: c.opts,
		},
		Status:  res.status,
		Header:  res.header,
		Body:    io.NopCloser(bytes.NewReader(res.body)),
		Options: c.opts,
	}
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		t.Errorf("%s %s → %d does not match openapi.yaml: %v\nheaders: %v\nbody: %s",
			method, target, res.status, err, res.header, res.body)
	}
	c.seen[fmt.Sprintf("%s %s %d", route.Method, route.Path, res.status)] = true
	if strings.HasPrefix(res.header.Get("Content-Type"), "application/problem+json") {
		var p api.Problem
		if err := json.Unmarshal(res.body, &p); err == nil {
			c.problems[p.Code] = p
		}
	}
}

// Real responses, successes and every kind of error, validated against
// openapi.yaml with statuses, headers and bodies.
func TestContractResponsesMatchSpec(t *testing.T) {
	t.Parallel()
	e := setup(t, withProxy(), withProcessor())
	c := newContract(t)

	post := func(t *testing.T, name string, want int, apiKey, key, body string, opts ...reqOption) response {
		t.Helper()
		res := e.post(t, apiKey, key, body, opts...)
		if res.status != want {
			t.Errorf("%s: status = %d, want %d; body: %s", name, res.status, want, res.body)
		}
		c.check(t, http.MethodPost, "/v1/orders", res)
		return res
	}
	get := func(t *testing.T, name string, want int, apiKey, target string) response {
		t.Helper()
		res := e.get(t, apiKey, target)
		if res.status != want {
			t.Errorf("%s: status = %d, want %d; body: %s", name, res.status, want, res.body)
		}
		c.check(t, http.MethodGet, target, res)
		return res
	}

	step(t, "SystemEndpointsAnswer", func(t *testing.T) {
		get(t, "healthz", 200, "", "/healthz")
		get(t, "readyz", 200, "", "/readyz")
		get(t, "openapi", 200, "", "/openapi.yaml")
		get(t, "docs", 200, "", "/docs")
		get(t, "docs bundle", 200, "", "/docs/redoc.standalone.js")
		get(t, "problem types", 200, "", "/docs/problems")
	})

	var id string
	step(t, "CreateOrderAndItsRefusals", func(t *testing.T) {
		full := `{"reference":"inv-1","customer_id":"cus_1","amount":2500,"currency":"EUR","description":"Invoice","metadata":{"plan":"pro"}}`
		created := post(t, "create", 201, e.a.Key, "k-create", full)
		post(t, "replay", 201, e.a.Key, "k-create", full)
		id = decodeOrder(t, created).Id.String()

		post(t, "validation_failed", 400, e.a.Key, "k-invalid", `{"reference":"","customer_id":"cus_1","amount":0,"currency":"eur"}`)
		post(t, "validation_failed replay", 400, e.a.Key, "k-invalid", `{"reference":"","customer_id":"cus_1","amount":0,"currency":"eur"}`)
		post(t, "invalid_json", 400, e.a.Key, "k-json", `{"reference":"inv-2",`)
		post(t, "idempotency_key_missing", 400, e.a.Key, "", orderBody("inv-2"))
		post(t, "idempotency_key_invalid", 400, e.a.Key, `"unterminated`, orderBody("inv-2"))
		post(t, "unauthorized", 401, "", "k-auth", orderBody("inv-2"))
		post(t, "order_reference_exists", 409, e.a.Key, "k-dup", full)
		post(t, "order_reference_exists replay", 409, e.a.Key, "k-dup", full)
		post(t, "body_too_large", 413, e.a.Key, "k-big", `{"description":"`+strings.Repeat("x", httpapi.MaxBodyBytes)+`"}`)
		post(t, "unsupported_media_type", 415, e.a.Key, "k-media", orderBody("inv-2"), withContentType("text/plain"))
		post(t, "idempotency_key_reused", 422, e.a.Key, "k-create", orderBody("inv-2"))
	})

	// 409 idempotency_key_in_use: another transaction holds the claim.
	step(t, "KeyHeldByAnotherTransactionIsInUse", func(t *testing.T) {
		blocker, err := e.pool.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		fp := sha256.Sum256([]byte("held"))
		if _, err := blocker.Exec(context.Background(),
			`INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, expires_at, retain_until)
			 VALUES ($1, $2, 'k-held', $3, $4, now() + interval '1 day', now() + interval '3 days')`,
			e.a.ID, endpointOrders, fp[:], idem.FingerprintVersion); err != nil {
			t.Fatal(err)
		}
		post(t, "idempotency_key_in_use", 409, e.a.Key, "k-held", orderBody("inv-3"))
		if err := blocker.Rollback(context.Background()); err != nil {
			t.Fatal(err)
		}
	})

	// 409 conflicting_write_in_progress: another key's request holds an
	// uncommitted order with the same reference.
	step(t, "ReferenceHeldByAnotherWriteIsInProgress", func(t *testing.T) {
		other, err := e.pool.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Exec(context.Background(),
			`INSERT INTO orders (tenant_id, id, reference, customer_id, amount, currency)
			 VALUES ($1, gen_random_uuid(), 'inv-contended', 'cus_1', 2500, 'EUR')`, e.a.ID); err != nil {
			t.Fatal(err)
		}
		post(t, "conflicting_write_in_progress", 409, e.a.Key, "k-contended", orderBody("inv-contended"))
		if err := other.Rollback(context.Background()); err != nil {
			t.Fatal(err)
		}
	})

	step(t, "ListAndGetOrders", func(t *testing.T) {
		get(t, "list", 200, e.a.Key, "/v1/orders?limit=1")
		get(t, "list empty", 200, e.b.Key, "/v1/orders")
		get(t, "list invalid_query", 400, e.a.Key, "/v1/orders?limit=0")
		get(t, "list unauthorized", 401, "", "/v1/orders")
		get(t, "get", 200, e.a.Key, "/v1/orders/"+id)
		get(t, "get other tenant", 404, e.b.Key, "/v1/orders/"+id)
		get(t, "get unauthorized", 401, "", "/v1/orders/"+id)
	})

	// Payments and refunds, against the processor simulator.
	send := func(t *testing.T, name string, want int, target, apiKey, key, body string, opts ...reqOption) response {
		t.Helper()
		if key != "" {
			opts = append([]reqOption{withHeader(idem.HeaderName, key)}, opts...)
		}
		res := e.do(t, http.MethodPost, target, apiKey, []byte(body), opts...)
		if res.status != want {
			t.Errorf("%s: status = %d, want %d; body: %s", name, res.status, want, res.body)
		}
		c.check(t, http.MethodPost, target, res)
		return res
	}
	const pay = "/v1/payments"
	var toPay, toFail api.Order
	var paymentID, declinedID string
	step(t, "PayAgainstTheSimulator", func(t *testing.T) {
		toPay = e.newOrder(t, e.a, "inv-pay")
		toDecline := e.newOrder(t, e.a, "inv-decline")
		toFail = e.newOrder(t, e.a, "inv-fail")

		paid := send(t, "pay", 201, pay, e.a.Key, "p-create", payBody(toPay.Id.String(), cardVisa))
		send(t, "pay replay", 201, pay, e.a.Key, "p-create", payBody(toPay.Id.String(), cardVisa))
		paymentID = decodePayment(t, paid).Id.String()
		declined := send(t, "card_declined", 402, pay, e.a.Key, "p-declined", payBody(toDecline.Id.String(), cardDeclined))
		send(t, "card_declined replay", 402, pay, e.a.Key, "p-declined", payBody(toDecline.Id.String(), cardDeclined))
		declinedID = idString(wantProblem(t, declined, 402, httpapi.CodeCardDeclined).PaymentId)
		send(t, "pay validation_failed", 400, pay, e.a.Key, "p-invalid", paymentBody(toPay.Id.String(), 0, "EUR", "visa"))
		send(t, "pay invalid_json", 400, pay, e.a.Key, "p-json", `{"order_id":`)
		send(t, "pay idempotency_key_missing", 400, pay, e.a.Key, "", payBody(toPay.Id.String(), cardVisa))
		send(t, "pay idempotency_key_invalid", 400, pay, e.a.Key, `"unterminated`, payBody(toPay.Id.String(), cardVisa))
		send(t, "pay unauthorized", 401, pay, "", "p-auth", payBody(toPay.Id.String(), cardVisa))
		send(t, "payment_exists", 409, pay, e.a.Key, "p-exists", payBody(toPay.Id.String(), cardVisa))
		send(t, "payment_exists replay", 409, pay, e.a.Key, "p-exists", payBody(toPay.Id.String(), cardVisa))
		send(t, "pay body_too_large", 413, pay, e.a.Key, "p-big", `{"payment_method":"`+strings.Repeat("x", httpapi.MaxBodyBytes)+`"}`)
		send(t, "pay unsupported_media_type", 415, pay, e.a.Key, "p-media", payBody(toPay.Id.String(), cardVisa), withContentType("text/plain"))
		send(t, "order_not_found", 422, pay, e.a.Key, "p-no-order", payBody(uuid.NewString(), cardVisa))
		send(t, "payment_amount_mismatch", 422, pay, e.a.Key, "p-mismatch", paymentBody(toFail.Id.String(), 1, "EUR", cardVisa))
		send(t, "processor_rejected", 422, pay, e.a.Key, "p-rejected", payBody(toFail.Id.String(), "pm_card_unknown"))
		send(t, "pay idempotency_key_reused", 422, pay, e.a.Key, "p-create", payBody(toFail.Id.String(), cardVisa))
		e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultStatus, Status: http.StatusTooManyRequests})
		send(t, "processor_unavailable", 503, pay, e.a.Key, "p-limited", payBody(toFail.Id.String(), cardVisa))
		e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultServerError})
		e.setLease(t, e.a.ID, endpointPayments, "p-limited", -time.Second) // its Retry-After passed
		send(t, "processor_outcome_unknown", 503, pay, e.a.Key, "p-limited", payBody(toFail.Id.String(), cardVisa))
		// Another attempt holds the released key's lease now.
		e.setLease(t, e.a.ID, endpointPayments, "p-limited", time.Hour)
		send(t, "pay idempotency_key_in_use", 409, pay, e.a.Key, "p-limited", payBody(toFail.Id.String(), cardVisa))
	})

	step(t, "GetPayments", func(t *testing.T) {
		get(t, "get payment", 200, e.a.Key, "/v1/payments/"+paymentID)
		get(t, "get declined payment", 200, e.a.Key, "/v1/payments/"+declinedID)
		get(t, "get payment other tenant", 404, e.b.Key, "/v1/payments/"+paymentID)
		get(t, "get payment malformed id", 404, e.a.Key, "/v1/payments/not-a-uuid")
		get(t, "get payment unauthorized", 401, "", "/v1/payments/"+paymentID)
	})

	var refunds, refundAt string
	step(t, "Refunds", func(t *testing.T) {
		refunds = "/v1/payments/" + paymentID + "/refunds"
		refund := send(t, "refund", 201, refunds, e.a.Key, "r-create", refundBody(1000))
		refundAt = refund.header.Get("Location")
		get(t, "get refund", 200, e.a.Key, refundAt)
		get(t, "get refund other tenant", 404, e.b.Key, refundAt)
		get(t, "get refund of another payment", 404, e.a.Key, "/v1/payments/"+declinedID+"/refunds/"+path.Base(refundAt))
		get(t, "get refund malformed id", 404, e.a.Key, refunds+"/not-a-uuid")
		get(t, "get refund unauthorized", 401, "", refundAt)
		get(t, "list payments", 200, e.a.Key, "/v1/payments?limit=1")
		get(t, "list payments of an order", 200, e.a.Key, "/v1/payments?order_id="+toPay.Id.String())
		get(t, "list payments invalid_query", 400, e.a.Key, "/v1/payments?order_id=nope")
		get(t, "list payments unauthorized", 401, "", "/v1/payments")
		send(t, "refund replay", 201, refunds, e.a.Key, "r-create", refundBody(1000))
		send(t, "refund validation_failed", 400, refunds, e.a.Key, "r-invalid", refundBody(0))
		send(t, "refund invalid_json", 400, refunds, e.a.Key, "r-json", `{"amount":"1"}`)
		send(t, "refund idempotency_key_missing", 400, refunds, e.a.Key, "", refundBody(1))
		send(t, "refund unauthorized", 401, refunds, "", "r-auth", refundBody(1))
		unknown := "/v1/payments/" + uuid.NewString() + "/refunds"
		send(t, "refund not_found", 404, unknown, e.a.Key, "r-unknown", refundBody(1))
		send(t, "refund not_found replay", 404, unknown, e.a.Key, "r-unknown", refundBody(1))
		send(t, "refund malformed id", 404, "/v1/payments/not-a-uuid/refunds", e.a.Key, "r-malformed", refundBody(1))
		send(t, "payment_not_refundable", 409, "/v1/payments/"+declinedID+"/refunds", e.a.Key, "r-declined", refundBody(1))
		send(t, "refund body_too_large", 413, refunds, e.a.Key, "r-big", `{"amount":1,"x":"`+strings.Repeat("x", httpapi.MaxBodyBytes)+`"}`)
		send(t, "refund unsupported_media_type", 415, refunds, e.a.Key, "r-media", refundBody(1), withContentType("text/plain"))
		send(t, "refund_exceeds_payment", 422, refunds, e.a.Key, "r-exceeds", refundBody(orderAmount))
		send(t, "refund idempotency_key_reused", 422, refunds, e.a.Key, "r-create", refundBody(2))
		e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathRefunds, Kind: processorsim.FaultServerError})
		send(t, "refund processor_outcome_unknown", 503, refunds, e.a.Key, "r-fault", refundBody(1))
	})

	// The alternatives to keys (N2): a client-supplied id with PUT, and a
	// conditional update with If-Match.
	call := func(t *testing.T, name string, want int, method, target, apiKey, body string, opts ...reqOption) response {
		t.Helper()
		res := e.do(t, method, target, apiKey, []byte(body), opts...)
		if res.status != want {
			t.Errorf("%s: status = %d, want %d; body: %s", name, res.status, want, res.body)
		}
		c.check(t, method, target, res)
		return res
	}
	customer := "/v1/customers/" + uuid.NewString()
	step(t, "PutAndGetCustomer", func(t *testing.T) {
		call(t, "put customer", 201, http.MethodPut, customer, e.a.Key, customerBody("Ada"))
		call(t, "put customer again", 200, http.MethodPut, customer, e.a.Key, customerBody("Ada"))
		call(t, "put customer validation_failed", 400, http.MethodPut, customer, e.a.Key, `{"name":"","email":"nope"}`)
		call(t, "put customer invalid_json", 400, http.MethodPut, customer, e.a.Key, `{"name":"Ada","nickname":"x"}`)
		call(t, "put customer unauthorized", 401, http.MethodPut, customer, "", customerBody("Ada"))
		call(t, "put customer body_too_large", 413, http.MethodPut, customer, e.a.Key, `{"name":"`+strings.Repeat("x", httpapi.MaxBodyBytes)+`"}`)
		call(t, "put customer unsupported_media_type", 415, http.MethodPut, customer, e.a.Key, customerBody("Ada"), withContentType("text/plain"))
		call(t, "get customer", 200, http.MethodGet, customer, e.a.Key, "")
		call(t, "get customer other tenant", 404, http.MethodGet, customer, e.b.Key, "")
		call(t, "get customer unauthorized", 401, http.MethodGet, customer, "", "")
	})

	orderPath := "/v1/orders/" + id
	step(t, "ConditionalOrderUpdate", func(t *testing.T) {
		etag := e.get(t, e.a.Key, orderPath).header.Get("ETag")
		patched := call(t, "patch order", 200, http.MethodPatch, orderPath, e.a.Key, `{"description":"corrected"}`, withHeader("If-Match", etag))
		call(t, "patch order precondition_failed", 412, http.MethodPatch, orderPath, e.a.Key, `{"description":"again"}`, withHeader("If-Match", etag))
		call(t, "patch order precondition_required", 428, http.MethodPatch, orderPath, e.a.Key, `{"description":"again"}`)
		newTag := withHeader("If-Match", patched.header.Get("ETag"))
		call(t, "patch order validation_failed", 400, http.MethodPatch, orderPath, e.a.Key, `{"description":"`+strings.Repeat("x", 1001)+`"}`, newTag)
		call(t, "patch order invalid_json", 400, http.MethodPatch, orderPath, e.a.Key, `{"status":"paid"}`, newTag)
		call(t, "patch order other tenant", 404, http.MethodPatch, orderPath, e.b.Key, `{"description":"x"}`, newTag)
		call(t, "patch order unauthorized", 401, http.MethodPatch, orderPath, "", `{"description":"x"}`, newTag)
		call(t, "patch order body_too_large", 413, http.MethodPatch, orderPath, e.a.Key, `{"description":"`+strings.Repeat("x", httpapi.MaxBodyBytes)+`"}`, newTag)
		call(t, "patch order unsupported_media_type", 415, http.MethodPatch, orderPath, e.a.Key, `{"description":"x"}`, newTag, withContentType("text/plain"))
	})

	// A key whose result is past its TTL (E3).
	step(t, "KeyPastItsTTLIsExpired", func(t *testing.T) {
		post(t, "idempotency_result_expired key", 201, e.a.Key, "k-expiring", orderBody("inv-expiring"))
		e.ageKey(t, e.a.ID, endpointOrders, "k-expiring", false)
		post(t, "idempotency_result_expired", 409, e.a.Key, "k-expiring", orderBody("inv-expiring"))
	})

	keyStatus := func(key, endpoint string) string {
		return "/v1/idempotency-keys/" + url.PathEscape(key) + "?endpoint=" + url.QueryEscape(endpoint)
	}
	step(t, "KeyStatus", func(t *testing.T) {
		get(t, "key status", 200, e.a.Key, keyStatus("k-create", endpointOrders))
		get(t, "key status in progress", 200, e.a.Key, keyStatus("p-limited", endpointPayments))
		get(t, "key status expired", 200, e.a.Key, keyStatus("k-expiring", endpointOrders))
		get(t, "key status bad endpoint", 400, e.a.Key, keyStatus("k-create", "GET /v1/orders"))
		get(t, "key status unknown", 404, e.a.Key, keyStatus("never-used", endpointOrders))
		get(t, "key status other tenant", 404, e.b.Key, keyStatus("k-create", endpointOrders))
		get(t, "key status unauthorized", 401, "", keyStatus("k-create", endpointOrders))
	})
	step(t, "RulesOfKeys", func(t *testing.T) {
		rules := get(t, "rules", 200, e.a.Key, "/v1/idempotency")
		call(t, "rules not modified", 304, http.MethodGet, "/v1/idempotency", e.a.Key, "", withHeader("If-None-Match", rules.header.Get("ETag")))
		get(t, "rules unauthorized", 401, "", "/v1/idempotency")
	})

	// A tenant past its rate limit: every /v1 operation answers 429.
	limited := setup(t, withRateLimit(0.001, 1))
	step(t, "EveryOperationPastTheRateLimitIs429", func(t *testing.T) {
		wantStatus(t, limited.get(t, limited.a.Key, "/v1/orders"), http.StatusOK) // the one token
		someID := uuid.NewString()
		for _, op := range []struct{ method, target, body string }{
			{http.MethodPost, "/v1/orders", orderBody("inv-limited")},
			{http.MethodGet, "/v1/orders", ""},
			{http.MethodGet, "/v1/orders/" + someID, ""},
			{http.MethodPost, "/v1/payments", payBody(someID, cardVisa)},
			{http.MethodGet, "/v1/payments/" + someID, ""},
			{http.MethodPost, "/v1/payments/" + someID + "/refunds", refundBody(1)},
			{http.MethodGet, "/v1/payments", ""},
			{http.MethodGet, "/v1/payments/" + someID + "/refunds/" + someID, ""},
			{http.MethodGet, keyStatus("k-limited", endpointOrders), ""},
			{http.MethodGet, "/v1/idempotency", ""},
			{http.MethodPatch, "/v1/orders/" + someID, `{"description":"x"}`},
			{http.MethodPut, "/v1/customers/" + someID, customerBody("Ada")},
			{http.MethodGet, "/v1/customers/" + someID, ""},
		} {
			var opts []reqOption
			if op.method == http.MethodPost {
				opts = append(opts, withHeader(idem.HeaderName, "k-limited"))
			}
			res := limited.do(t, op.method, op.target, limited.a.Key, []byte(op.body), opts...)
			if res.status != http.StatusTooManyRequests {
				t.Errorf("%s %s past the rate limit: status %d, want 429", op.method, op.target, res.status)
			}
			c.check(t, op.method, op.target, res)
		}
	})

	// Processor webhooks: signed, not authenticated by an API key.
	hook := func(t *testing.T, name string, want int, body, sig string) {
		t.Helper()
		var opts []reqOption
		if sig != "" {
			opts = append(opts, withHeader(webhook.Header, sig))
		}
		res := e.do(t, http.MethodPost, "/v1/webhooks/processor", "", []byte(body), opts...)
		if res.status != want {
			t.Errorf("%s: status = %d, want %d; body: %s", name, res.status, want, res.body)
		}
		c.check(t, http.MethodPost, "/v1/webhooks/processor", res)
	}
	step(t, "Webhooks", func(t *testing.T) {
		event := `{"id":"evt_contract","object":"event","type":"charge.refunded","created":1736935800,"data":{"object":{}}}`
		hook(t, "webhook", 200, event, webhook.Sign([]byte(event), time.Now(), webhookSecret))
		hook(t, "webhook duplicate", 200, event, webhook.Sign([]byte(event), time.Now(), webhookSecret))
		hook(t, "webhook_signature_invalid", 400, event, "t=1,v1=00")
		hook(t, "webhook_timestamp_out_of_tolerance", 400, event, webhook.Sign([]byte(event), time.Now().Add(-time.Hour), webhookSecret))
		hook(t, "webhook invalid_json", 400, `{}`, webhook.Sign([]byte(`{}`), time.Now(), webhookSecret))
		big := `{"id":"` + strings.Repeat("x", httpapi.MaxBodyBytes) + `"}`
		hook(t, "webhook body_too_large", 413, big, webhook.Sign([]byte(big), time.Now(), webhookSecret))
	})

	step(t, "DatabaseDown", func(t *testing.T) {
		e.proxy.Cut()
		hook(t, "webhook down", 503, `{"id":"evt_outage","type":"charge.refunded"}`, webhook.Sign([]byte(`{"id":"evt_outage","type":"charge.refunded"}`), time.Now(), webhookSecret))
		post(t, "service_unavailable", 503, e.a.Key, "k-outage", orderBody("inv-4"))
		get(t, "readyz down", 503, "", "/readyz")
		get(t, "list down", 503, e.a.Key, "/v1/orders")
		get(t, "key status down", 503, e.a.Key, keyStatus("k-create", endpointOrders))
		get(t, "get down", 503, e.a.Key, "/v1/orders/"+uuid.NewString())
		send(t, "pay down", 503, pay, e.a.Key, "p-outage", payBody(toFail.Id.String(), cardVisa))
		get(t, "get payment down", 503, e.a.Key, "/v1/payments/"+paymentID)
		get(t, "list payments down", 503, e.a.Key, "/v1/payments")
		get(t, "get refund down", 503, e.a.Key, refundAt)
		send(t, "refund down", 503, refunds, e.a.Key, "r-outage", refundBody(1))
		call(t, "put customer down", 503, http.MethodPut, customer, e.a.Key, customerBody("Ada"))
		call(t, "get customer down", 503, http.MethodGet, customer, e.a.Key, "")
		call(t, "patch order down", 503, http.MethodPatch, orderPath, e.a.Key, `{"description":"x"}`, withHeader("If-Match", "*"))
		e.proxy.Restore()
	})

	t.Run("EveryDocumentedResponseWasExercised", func(t *testing.T) {
		var missing []string
		for path, item := range c.doc.Paths.Map() {
			for method, op := range item.Operations() {
				for status := range op.Responses.Map() {
					k := method + " " + path + " " + status
					// An unexpected 500 cannot be provoked from outside.
					if status != "500" && !c.seen[k] {
						missing = append(missing, k)
					}
				}
			}
		}
		sort.Strings(missing)
		if len(missing) > 0 {
			t.Errorf("documented responses no test validated:\n%s", strings.Join(missing, "\n"))
		}
	})

	// The examples in openapi.yaml show what clients will see: their type,
	// status and title must be the ones the server sends for that code.
	t.Run("ProblemExamplesMatchRealProblems", func(t *testing.T) {
		for name, ref := range c.doc.Components.Responses {
			for _, mt := range ref.Value.Content {
				for exName, ex := range mt.Examples {
					var want api.Problem
					raw, err := json.Marshal(ex.Value.Value)
					if err != nil || json.Unmarshal(raw, &want) != nil || want.Code == "" {
						continue
					}
					got, ok := c.problems[want.Code]
					if !ok && want.Code == httpapi.CodeInternal {
						continue // an unexpected 500 cannot be provoked from outside
					}
					if !ok {
						t.Errorf("responses.%s example %s: code %s was never produced by the tests", name, exName, want.Code)
						continue
					}
					type head struct {
						Type, Title string
						Status      int
					}
					if diff := cmp.Diff(head{got.Type, got.Title, got.Status}, head{want.Type, want.Title, want.Status}); diff != "" {
						t.Errorf("responses.%s example %s (-server +openapi.yaml):\n%s", name, exName, diff)
					}
				}
			}
		}
	})
}
