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
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/go-chi/chi/v5"
	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	payments "github.com/idemref/payments"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
)

// specServer is the origin of the spec's only server; lookup requests are
// built against it so the kin router matches them.
const specServer = "http://localhost:8080"

func loadSpec(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(payments.OpenAPI)
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

	h := httpapi.NewHandler(httpapi.Config{Logger: slog.New(slog.DiscardHandler), OpenAPI: payments.OpenAPI})
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
	problems map[string]problem
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
		problems: map[string]problem{},
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
		var p problem
		if err := json.Unmarshal(res.body, &p); err == nil {
			c.problems[p.Code] = p
		}
	}
}

// Real responses, successes and every kind of error, validated against
// openapi.yaml with statuses, headers and bodies.
func TestContractResponsesMatchSpec(t *testing.T) {
	t.Parallel()
	e := setup(t, withProxy())
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

	get(t, "healthz", 200, "", "/healthz")
	get(t, "readyz", 200, "", "/readyz")
	get(t, "openapi", 200, "", "/openapi.yaml")

	full := `{"reference":"inv-1","customer_id":"cus_1","amount":2500,"currency":"EUR","description":"Invoice","metadata":{"plan":"pro"}}`
	created := post(t, "create", 201, e.a.Key, "k-create", full)
	post(t, "replay", 201, e.a.Key, "k-create", full)
	id := decodeOrder(t, created).ID

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

	// 409 idempotency_key_in_use: another transaction holds the claim.
	blocker, err := e.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	fp := sha256.Sum256([]byte("held"))
	if _, err := blocker.Exec(context.Background(),
		`INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, expires_at)
		 VALUES ($1, $2, 'k-held', $3, $4, now() + interval '1 day')`,
		e.a.ID, endpointOrders, fp[:], idem.FingerprintVersion); err != nil {
		t.Fatal(err)
	}
	post(t, "idempotency_key_in_use", 409, e.a.Key, "k-held", orderBody("inv-3"))
	if err := blocker.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}

	get(t, "list", 200, e.a.Key, "/v1/orders?limit=1")
	get(t, "list empty", 200, e.b.Key, "/v1/orders")
	get(t, "list invalid_query", 400, e.a.Key, "/v1/orders?limit=0")
	get(t, "list unauthorized", 401, "", "/v1/orders")
	get(t, "get", 200, e.a.Key, "/v1/orders/"+id)
	get(t, "get other tenant", 404, e.b.Key, "/v1/orders/"+id)
	get(t, "get unauthorized", 401, "", "/v1/orders/"+id)

	e.proxy.Cut()
	post(t, "service_unavailable", 503, e.a.Key, "k-outage", orderBody("inv-4"))
	get(t, "readyz down", 503, "", "/readyz")
	get(t, "list down", 503, e.a.Key, "/v1/orders")
	get(t, "get down", 503, e.a.Key, "/v1/orders/"+uuid.NewString())
	e.proxy.Restore()

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
					var want problem
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
