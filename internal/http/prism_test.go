package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/google/uuid"

	"github.com/idemref/payments/client/api"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/tooling/processorsim"
	"github.com/idemref/payments/internal/webhook"
)

// prismBinary finds Stoplight Prism, installed from .tools/package.json
// (npm ci in .tools/, which .ci/run does). On CI its absence fails the
// test; elsewhere it skips.
func prismBinary(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "..", ".tools", "node_modules", ".bin", "prism"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatal("prism is not installed (.ci/run installs it: npm ci --prefix .tools)")
	}
	t.Skip("prism is not installed: npm ci --prefix .tools")
	return ""
}

// prismProxy is one `prism proxy openapi.yaml <api>` process: it forwards
// each request to the API, validates the request and the response against
// openapi.yaml, and reports what does not match in the sl-violations
// header of its answer (and in its log).
type prismProxy struct {
	url    string
	errors bool // started with --errors
	log    *prismLog
}

// prismLog is Prism's log, written by the process's output copier.
type prismLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *prismLog) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *prismLog) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startPrism runs Prism on a free loopback port in front of upstream and
// waits until it accepts connections. With errors (--errors), Prism
// answers a request that breaks the contract itself, without forwarding
// it, and replaces a response that breaks it with a 500 problem; without,
// it forwards everything and only reports.
func startPrism(t *testing.T, bin, spec, upstream string, errors bool) (*prismProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()

	args := []string{"proxy", spec, upstream, "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--cors", "false", "-v", "warn"}
	if errors {
		args = append(args, "--errors")
	}
	p := &prismProxy{url: fmt.Sprintf("http://127.0.0.1:%d", port), errors: errors, log: &prismLog{}}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "NO_COLOR=1", "FORCE_COLOR=0", "SCARF_ANALYTICS=false", "DO_NOT_TRACK=1")
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start prism: %w", err)
	}
	exited := make(chan struct{})
	var waitErr error // cmd.Wait's result, set before exited is closed
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			if waitErr == nil {
				return nil, fmt.Errorf("prism exited (status 0) before listening:\n%s", p.log.String())
			}
			return nil, fmt.Errorf("prism exited before listening: %w\n%s", waitErr, p.log.String())
		default:
		}
		if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
			c.Close()
			return p, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("prism did not listen on %s within a minute:\n%s", ln.Addr(), p.log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// violation is one entry of Prism's sl-violations header.
type violation struct {
	Location []string `json:"location"`
	Severity string   `json:"severity"`
	Code     any      `json:"code"`
	Message  string   `json:"message"`
}

func (v violation) String() string {
	return fmt.Sprintf("%s %s: %s", v.Severity, strings.Join(v.Location, "."), v.Message)
}

// exchange is one request sent through Prism, with the status the API
// must answer.
type exchange struct {
	name   string
	method string
	path   string
	apiKey string // "" sends no Authorization
	body   string // "" sends none
	header map[string]string
	want   int
	// invalid: the request itself breaks openapi.yaml (a missing required
	// header, a body its schema refuses, an undocumented method...). It
	// goes through the proxy without --errors, which forwards it to the
	// API instead of answering for it, so the API's refusal is validated
	// too; and Prism must report the request, or the contract would allow
	// what the API refuses.
	invalid bool
}

// Stoplight Prism, a validator we did not write, stands between a client
// and the real API (PostgreSQL, the processor simulator, the rate limit on)
// and checks every exchange against openapi.yaml: successes and every
// kind of refusal of every operation, replays, processor failures, a
// database outage. Each exchange must get its expected status, and Prism
// must find no response that breaks the contract.
func TestPrismProxyFindsNoViolations(t *testing.T) {
	t.Parallel()
	bin := prismBinary(t)
	spec, err := filepath.Abs(filepath.Join("..", "..", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// The rate limit is on so that every /v1 answer carries RateLimit and
	// RateLimit-Policy: 200 requests per tenant, then one every 100 s.
	e := setup(t, withProxy(), withProcessor(), withRateLimit(0.01, 200))
	// Both start at once: Node takes seconds to load Prism.
	var strict, lenient *prismProxy
	var strictErr, lenientErr error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); strict, strictErr = startPrism(t, bin, spec, e.srv.URL, true) }()
	go func() { defer wg.Done(); lenient, lenientErr = startPrism(t, bin, spec, e.srv.URL, false) }()
	wg.Wait()
	if strictErr != nil || lenientErr != nil {
		t.Fatalf("prism proxy --errors: %v\nprism proxy: %v", strictErr, lenientErr)
	}

	router, err := legacy.NewRouter(loadSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 30 * time.Second}
	operations := map[string]bool{} // "METHOD /route" exercised
	statuses := map[int]int{}
	var sent, violations int

	do := func(t *testing.T, x exchange) response {
		t.Helper()
		px := strict
		if x.invalid {
			px = lenient
		}
		var body io.Reader
		if x.body != "" {
			body = strings.NewReader(x.body)
		}
		req, err := http.NewRequestWithContext(t.Context(), x.method, px.url+x.path, body)
		if err != nil {
			t.Fatal(err)
		}
		if x.apiKey != "" {
			req.Header.Set("Authorization", "Bearer "+x.apiKey)
		}
		if x.body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		for k, v := range x.header {
			req.Header.Set(k, v)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", x.name, err)
		}
		data, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			t.Fatalf("%s: read body: %v", x.name, err)
		}
		sent++
		statuses[res.StatusCode]++
		if kr, err := http.NewRequest(x.method, specServer+x.path, nil); err == nil {
			if route, _, err := router.FindRoute(kr); err == nil {
				operations[route.Method+" "+route.Path] = true
			}
		}

		var found []violation
		if h := res.Header.Get("sl-violations"); h != "" {
			if err := json.Unmarshal([]byte(h), &found); err != nil {
				t.Errorf("%s: sl-violations is not a JSON list (%v): %.300s", x.name, err, h)
				violations++
			}
		}
		var inRequest []violation
		for _, v := range found {
			switch {
			case len(v.Location) > 0 && v.Location[0] == "response":
				violations++
				t.Errorf("%s: %s %s → %d: response breaks openapi.yaml: %s", x.name, x.method, x.path, res.StatusCode, v)
			default:
				inRequest = append(inRequest, v)
			}
		}
		switch {
		case x.invalid && len(inRequest) == 0:
			t.Errorf("%s: %s %s: Prism found nothing wrong with this request, which the API refuses: openapi.yaml should forbid it (or send it as valid)", x.name, x.method, x.path)
		case !x.invalid && len(inRequest) > 0:
			t.Errorf("%s: %s %s: Prism finds the request invalid: %v", x.name, x.method, x.path, inRequest)
		}
		if res.StatusCode != x.want {
			t.Errorf("%s: %s %s → %d, want %d; body: %.500s", x.name, x.method, x.path, res.StatusCode, x.want, data)
		}
		return response{status: res.StatusCode, header: res.Header, body: data}
	}
	run := func(t *testing.T, xs ...exchange) {
		t.Helper()
		for _, x := range xs {
			do(t, x)
		}
	}
	a, b := e.a.Key, e.b.Key
	key := func(k string) map[string]string { return map[string]string{idem.HeaderName: k} }
	plain := map[string]string{"Content-Type": "text/plain"}
	big := strings.Repeat("x", httpapi.MaxBodyBytes)
	unknownKey := "sk_" + strings.Repeat("0", 32) + "_" + strings.Repeat("A", 43)

	// The unauthenticated system endpoints.
	step(t, "SystemEndpointsAnswer", func(t *testing.T) {
		run(t,
			exchange{name: "healthz", method: "GET", path: "/healthz", want: 200},
			exchange{name: "readyz", method: "GET", path: "/readyz", want: 200},
			exchange{name: "openapi.yaml", method: "GET", path: "/openapi.yaml", want: 200},
			exchange{name: "docs", method: "GET", path: "/docs", want: 200},
			exchange{name: "docs bundle", method: "GET", path: "/docs/redoc.standalone.js", want: 200},
			exchange{name: "problem types", method: "GET", path: "/docs/problems", want: 200},
		)
	})

	// Orders.
	var orderPath string
	step(t, "CreateOrderAndItsRefusals", func(t *testing.T) {
		full := `{"reference":"prism-1","customer_id":"cus_1","amount":2500,"currency":"EUR","description":"Invoice","metadata":{"plan":"pro"}}`
		created := do(t, exchange{name: "create order", method: "POST", path: "/v1/orders", apiKey: a, body: full, header: key("o-create"), want: 201})
		orderID := decodeOrder(t, created).Id.String()
		orderPath = "/v1/orders/" + orderID
		run(t,
			exchange{name: "create order replay", method: "POST", path: "/v1/orders", apiKey: a, body: full, header: key("o-create"), want: 201},
			exchange{name: "create order validation_failed", method: "POST", path: "/v1/orders", apiKey: a, body: `{"reference":"prism-2","customer_id":"cus_1","amount":2500,"currency":"QQQ"}`, header: key("o-invalid"), want: 400},
			exchange{name: "create order validation_failed replay", method: "POST", path: "/v1/orders", apiKey: a, body: `{"reference":"prism-2","customer_id":"cus_1","amount":2500,"currency":"QQQ"}`, header: key("o-invalid"), want: 400},
			exchange{name: "create order invalid_json", method: "POST", path: "/v1/orders", apiKey: a, body: `{"reference":"prism-2","customer_id":"cus_1","Amount":2500,"currency":"EUR"}`, header: key("o-json"), want: 400, invalid: true},
			exchange{name: "create order idempotency_key_missing", method: "POST", path: "/v1/orders", apiKey: a, body: orderBody("prism-2"), want: 400, invalid: true},
			exchange{name: "create order idempotency_key_invalid", method: "POST", path: "/v1/orders", apiKey: a, body: orderBody("prism-2"), header: key(`"unterminated`), want: 400, invalid: true},
			exchange{name: "create order unauthorized", method: "POST", path: "/v1/orders", body: orderBody("prism-2"), header: key("o-auth"), want: 401, invalid: true},
			exchange{name: "create order other scheme", method: "POST", path: "/v1/orders", body: orderBody("prism-2"), header: map[string]string{idem.HeaderName: "o-auth", "Authorization": "Basic YTpi"}, want: 401, invalid: true},
			exchange{name: "create order unknown key", method: "POST", path: "/v1/orders", apiKey: unknownKey, body: orderBody("prism-2"), header: key("o-auth"), want: 401},
			exchange{name: "create order order_reference_exists", method: "POST", path: "/v1/orders", apiKey: a, body: full, header: key("o-dup"), want: 409},
			exchange{name: "create order order_reference_exists replay", method: "POST", path: "/v1/orders", apiKey: a, body: full, header: key("o-dup"), want: 409},
			exchange{name: "create order body_too_large", method: "POST", path: "/v1/orders", apiKey: a, body: `{"description":"` + big + `"}`, header: key("o-big"), want: 413, invalid: true},
			exchange{name: "create order unsupported_media_type", method: "POST", path: "/v1/orders", apiKey: a, body: orderBody("prism-2"), header: map[string]string{idem.HeaderName: "o-media", "Content-Type": "text/plain"}, want: 415, invalid: true},
			exchange{name: "create order idempotency_key_reused", method: "POST", path: "/v1/orders", apiKey: a, body: orderBody("prism-2"), header: key("o-create"), want: 422},
		)
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
			 VALUES ($1, $2, 'o-held', $3, $4, now() + interval '1 day', now() + interval '3 days')`,
			e.a.ID, endpointOrders, fp[:], idem.FingerprintVersion); err != nil {
			t.Fatal(err)
		}
		do(t, exchange{name: "create order idempotency_key_in_use", method: "POST", path: "/v1/orders", apiKey: a, body: orderBody("prism-3"), header: key("o-held"), want: 409})
		if err := blocker.Rollback(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
	// 409 idempotency_result_expired: a key past its TTL.
	step(t, "KeyPastItsTTLIsExpired", func(t *testing.T) {
		do(t, exchange{name: "create order to expire", method: "POST", path: "/v1/orders", apiKey: a, body: orderBody("prism-expiring"), header: key("o-expiring"), want: 201})
		e.ageKey(t, e.a.ID, endpointOrders, "o-expiring", false)
		do(t, exchange{name: "create order idempotency_result_expired", method: "POST", path: "/v1/orders", apiKey: a, body: orderBody("prism-expiring"), header: key("o-expiring"), want: 409})
	})

	step(t, "ListAndGetOrders", func(t *testing.T) {
		run(t,
			exchange{name: "list orders", method: "GET", path: "/v1/orders?limit=1", apiKey: a, want: 200},
			exchange{name: "list orders empty", method: "GET", path: "/v1/orders", apiKey: b, want: 200},
			exchange{name: "list orders limit out of range", method: "GET", path: "/v1/orders?limit=0", apiKey: a, want: 400, invalid: true},
			exchange{name: "list orders foreign cursor", method: "GET", path: "/v1/orders?cursor=bm90LWEtY3Vyc29y", apiKey: a, want: 400},
			exchange{name: "list orders unauthorized", method: "GET", path: "/v1/orders", want: 401, invalid: true},
			exchange{name: "get order", method: "GET", path: orderPath, apiKey: a, want: 200},
			exchange{name: "get order other tenant", method: "GET", path: orderPath, apiKey: b, want: 404},
			exchange{name: "get order malformed id", method: "GET", path: "/v1/orders/not-a-uuid", apiKey: a, want: 404, invalid: true},
			exchange{name: "get order unauthorized", method: "GET", path: orderPath, want: 401, invalid: true},
			exchange{name: "delete order method_not_allowed", method: "DELETE", path: orderPath, apiKey: a, want: 405, invalid: true},
		)
	})

	// The conditional update.
	step(t, "ConditionalOrderUpdate", func(t *testing.T) {
		etag := do(t, exchange{name: "get order for its ETag", method: "GET", path: orderPath, apiKey: a, want: 200}).header.Get("ETag")
		patched := do(t, exchange{name: "patch order", method: "PATCH", path: orderPath, apiKey: a, body: `{"description":"corrected"}`, header: map[string]string{"If-Match": etag}, want: 200})
		newTag := map[string]string{"If-Match": patched.header.Get("ETag")}
		run(t,
			exchange{name: "patch order precondition_failed", method: "PATCH", path: orderPath, apiKey: a, body: `{"description":"again"}`, header: map[string]string{"If-Match": etag}, want: 412},
			exchange{name: "patch order weak tag", method: "PATCH", path: orderPath, apiKey: a, body: `{"description":"again"}`, header: map[string]string{"If-Match": "W/" + newTag["If-Match"]}, want: 412},
			exchange{name: "patch order precondition_required", method: "PATCH", path: orderPath, apiKey: a, body: `{"description":"again"}`, want: 428, invalid: true},
			exchange{name: "patch order validation_failed", method: "PATCH", path: orderPath, apiKey: a, body: `{"description":"bell\u0007"}`, header: newTag, want: 400},
			exchange{name: "patch order invalid_json", method: "PATCH", path: orderPath, apiKey: a, body: `{"status":"paid"}`, header: newTag, want: 400, invalid: true},
			exchange{name: "patch order other tenant", method: "PATCH", path: orderPath, apiKey: b, body: `{"description":"x"}`, header: newTag, want: 404},
			exchange{name: "patch order unauthorized", method: "PATCH", path: orderPath, body: `{"description":"x"}`, header: newTag, want: 401, invalid: true},
			exchange{name: "patch order body_too_large", method: "PATCH", path: orderPath, apiKey: a, body: `{"description":"` + big + `"}`, header: newTag, want: 413, invalid: true},
			exchange{name: "patch order unsupported_media_type", method: "PATCH", path: orderPath, apiKey: a, body: `{"description":"x"}`, header: map[string]string{"If-Match": newTag["If-Match"], "Content-Type": "text/plain"}, want: 415, invalid: true},
		)
	})

	// Customers, at an id the client chooses.
	step(t, "PutAndGetCustomer", func(t *testing.T) {
		customer := "/v1/customers/" + uuid.NewString()
		run(t,
			exchange{name: "put customer", method: "PUT", path: customer, apiKey: a, body: customerBody("Ada"), want: 201},
			exchange{name: "put customer again", method: "PUT", path: customer, apiKey: a, body: customerBody("Ada"), want: 200},
			exchange{name: "put customer validation_failed", method: "PUT", path: customer, apiKey: a, body: `{"name":"Ada","email":"nope"}`, want: 400},
			exchange{name: "put customer id not a uuid", method: "PUT", path: "/v1/customers/not-a-uuid", apiKey: a, body: customerBody("Ada"), want: 400, invalid: true},
			exchange{name: "put customer invalid_json", method: "PUT", path: customer, apiKey: a, body: `{"name":"Ada","email":"ada@example.com","nickname":"x"}`, want: 400, invalid: true},
			exchange{name: "put customer unauthorized", method: "PUT", path: customer, body: customerBody("Ada"), want: 401, invalid: true},
			exchange{name: "put customer body_too_large", method: "PUT", path: customer, apiKey: a, body: `{"name":"` + big + `"}`, want: 413, invalid: true},
			exchange{name: "put customer unsupported_media_type", method: "PUT", path: customer, apiKey: a, body: customerBody("Ada"), header: plain, want: 415, invalid: true},
			exchange{name: "get customer", method: "GET", path: customer, apiKey: a, want: 200},
			exchange{name: "get customer other tenant", method: "GET", path: customer, apiKey: b, want: 404},
			exchange{name: "get customer unauthorized", method: "GET", path: customer, want: 401, invalid: true},
		)
	})

	// Payments, against the processor simulator.
	const pay = "/v1/payments"
	var toPay api.Order
	var paymentID, declinedID string
	step(t, "PayAgainstTheSimulator", func(t *testing.T) {
		toPay = e.newOrder(t, e.a, "prism-pay")
		toDecline := e.newOrder(t, e.a, "prism-decline")
		toFail := e.newOrder(t, e.a, "prism-fail")
		paid := do(t, exchange{name: "pay", method: "POST", path: pay, apiKey: a, body: payBody(toPay.Id.String(), cardVisa), header: key("p-create"), want: 201})
		paymentID = decodePayment(t, paid).Id.String()
		declined := do(t, exchange{name: "pay card_declined", method: "POST", path: pay, apiKey: a, body: payBody(toDecline.Id.String(), cardDeclined), header: key("p-declined"), want: 402})
		var declinedProblem api.Problem
		if err := json.Unmarshal(declined.body, &declinedProblem); err != nil || declinedProblem.PaymentId == nil {
			t.Fatalf("card_declined without payment_id: %s", declined.body)
		}
		declinedID = declinedProblem.PaymentId.String()
		run(t,
			exchange{name: "pay replay", method: "POST", path: pay, apiKey: a, body: payBody(toPay.Id.String(), cardVisa), header: key("p-create"), want: 201},
			exchange{name: "pay card_declined replay", method: "POST", path: pay, apiKey: a, body: payBody(toDecline.Id.String(), cardDeclined), header: key("p-declined"), want: 402},
			exchange{name: "pay validation_failed", method: "POST", path: pay, apiKey: a, body: paymentBody(toFail.Id.String(), orderAmount, "QQQ", cardVisa), header: key("p-invalid"), want: 400},
			exchange{name: "pay invalid_json", method: "POST", path: pay, apiKey: a, body: `{"order_id":"` + toFail.Id.String() + `","amount":2500,"currency":"EUR","payment_method":"pm_card_visa","tip":1}`, header: key("p-json"), want: 400, invalid: true},
			exchange{name: "pay idempotency_key_missing", method: "POST", path: pay, apiKey: a, body: payBody(toFail.Id.String(), cardVisa), want: 400, invalid: true},
			exchange{name: "pay unauthorized", method: "POST", path: pay, body: payBody(toFail.Id.String(), cardVisa), header: key("p-auth"), want: 401, invalid: true},
			exchange{name: "pay payment_exists", method: "POST", path: pay, apiKey: a, body: payBody(toPay.Id.String(), cardVisa), header: key("p-exists"), want: 409},
			exchange{name: "pay body_too_large", method: "POST", path: pay, apiKey: a, body: `{"payment_method":"` + big + `"}`, header: key("p-big"), want: 413, invalid: true},
			exchange{name: "pay unsupported_media_type", method: "POST", path: pay, apiKey: a, body: payBody(toFail.Id.String(), cardVisa), header: map[string]string{idem.HeaderName: "p-media", "Content-Type": "text/plain"}, want: 415, invalid: true},
			exchange{name: "pay order_not_found", method: "POST", path: pay, apiKey: a, body: payBody(uuid.NewString(), cardVisa), header: key("p-no-order"), want: 422},
			exchange{name: "pay payment_amount_mismatch", method: "POST", path: pay, apiKey: a, body: paymentBody(toFail.Id.String(), 1, "EUR", cardVisa), header: key("p-mismatch"), want: 422},
			exchange{name: "pay processor_rejected", method: "POST", path: pay, apiKey: a, body: payBody(toFail.Id.String(), "pm_card_unknown"), header: key("p-rejected"), want: 422},
			exchange{name: "pay idempotency_key_reused", method: "POST", path: pay, apiKey: a, body: payBody(toFail.Id.String(), cardVisa), header: key("p-create"), want: 422},
		)
		e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultStatus, Status: http.StatusTooManyRequests})
		do(t, exchange{name: "pay processor_unavailable", method: "POST", path: pay, apiKey: a, body: payBody(toFail.Id.String(), cardVisa), header: key("p-limited"), want: 503})
		e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultServerError})
		e.setLease(t, e.a.ID, endpointPayments, "p-limited", -time.Second)
		do(t, exchange{name: "pay processor_outcome_unknown", method: "POST", path: pay, apiKey: a, body: payBody(toFail.Id.String(), cardVisa), header: key("p-limited"), want: 503})
		e.setLease(t, e.a.ID, endpointPayments, "p-limited", time.Hour)
		do(t, exchange{name: "pay idempotency_key_in_use", method: "POST", path: pay, apiKey: a, body: payBody(toFail.Id.String(), cardVisa), header: key("p-limited"), want: 409})
	})

	step(t, "GetAndListPayments", func(t *testing.T) {
		run(t,
			exchange{name: "get payment", method: "GET", path: pay + "/" + paymentID, apiKey: a, want: 200},
			exchange{name: "get declined payment", method: "GET", path: pay + "/" + declinedID, apiKey: a, want: 200},
			exchange{name: "get payment other tenant", method: "GET", path: pay + "/" + paymentID, apiKey: b, want: 404},
			exchange{name: "get payment malformed id", method: "GET", path: pay + "/not-a-uuid", apiKey: a, want: 404, invalid: true},
			exchange{name: "get payment unauthorized", method: "GET", path: pay + "/" + paymentID, want: 401, invalid: true},
			exchange{name: "list payments", method: "GET", path: pay + "?limit=1", apiKey: a, want: 200},
			exchange{name: "list payments of an order", method: "GET", path: pay + "?order_id=" + toPay.Id.String(), apiKey: a, want: 200},
			exchange{name: "list payments bad order_id", method: "GET", path: pay + "?order_id=nope", apiKey: a, want: 400, invalid: true},
			exchange{name: "list payments unauthorized", method: "GET", path: pay, want: 401, invalid: true},
		)
	})

	// Refunds.
	step(t, "Refunds", func(t *testing.T) {
		refunds := pay + "/" + paymentID + "/refunds"
		refund := do(t, exchange{name: "refund", method: "POST", path: refunds, apiKey: a, body: refundBody(1000), header: key("r-create"), want: 201})
		refundAt := refund.header.Get("Location")
		unknownPayment := pay + "/" + uuid.NewString() + "/refunds"
		run(t,
			exchange{name: "refund replay", method: "POST", path: refunds, apiKey: a, body: refundBody(1000), header: key("r-create"), want: 201},
			exchange{name: "refund validation_failed", method: "POST", path: refunds, apiKey: a, body: refundBody(0), header: key("r-invalid"), want: 400, invalid: true},
			exchange{name: "refund invalid_json", method: "POST", path: refunds, apiKey: a, body: `{"amount":"1"}`, header: key("r-json"), want: 400, invalid: true},
			exchange{name: "refund idempotency_key_missing", method: "POST", path: refunds, apiKey: a, body: refundBody(1), want: 400, invalid: true},
			exchange{name: "refund unauthorized", method: "POST", path: refunds, body: refundBody(1), header: key("r-auth"), want: 401, invalid: true},
			exchange{name: "refund not_found", method: "POST", path: unknownPayment, apiKey: a, body: refundBody(1), header: key("r-unknown"), want: 404},
			exchange{name: "refund not_found replay", method: "POST", path: unknownPayment, apiKey: a, body: refundBody(1), header: key("r-unknown"), want: 404},
			exchange{name: "refund malformed payment id", method: "POST", path: pay + "/not-a-uuid/refunds", apiKey: a, body: refundBody(1), header: key("r-malformed"), want: 404, invalid: true},
			exchange{name: "refund payment_not_refundable", method: "POST", path: pay + "/" + declinedID + "/refunds", apiKey: a, body: refundBody(1), header: key("r-declined"), want: 409},
			exchange{name: "refund body_too_large", method: "POST", path: refunds, apiKey: a, body: `{"amount":1,"x":"` + big + `"}`, header: key("r-big"), want: 413, invalid: true},
			exchange{name: "refund unsupported_media_type", method: "POST", path: refunds, apiKey: a, body: refundBody(1), header: map[string]string{idem.HeaderName: "r-media", "Content-Type": "text/plain"}, want: 415, invalid: true},
			exchange{name: "refund refund_exceeds_payment", method: "POST", path: refunds, apiKey: a, body: refundBody(orderAmount), header: key("r-exceeds"), want: 422},
			exchange{name: "refund idempotency_key_reused", method: "POST", path: refunds, apiKey: a, body: refundBody(2), header: key("r-create"), want: 422},
			exchange{name: "get refund", method: "GET", path: refundAt, apiKey: a, want: 200},
			exchange{name: "get refund other tenant", method: "GET", path: refundAt, apiKey: b, want: 404},
			exchange{name: "get refund malformed id", method: "GET", path: refunds + "/not-a-uuid", apiKey: a, want: 404, invalid: true},
			exchange{name: "get refund unauthorized", method: "GET", path: refundAt, want: 401, invalid: true},
		)
		e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathRefunds, Kind: processorsim.FaultServerError})
		do(t, exchange{name: "refund processor_outcome_unknown", method: "POST", path: refunds, apiKey: a, body: refundBody(1), header: key("r-fault"), want: 503})
	})

	// What became of a key.
	step(t, "KeyStatus", func(t *testing.T) {
		keyStatus := func(k, endpoint string) string {
			return "/v1/idempotency-keys/" + url.PathEscape(k) + "?endpoint=" + url.QueryEscape(endpoint)
		}
		run(t,
			exchange{name: "key status", method: "GET", path: keyStatus("o-create", endpointOrders), apiKey: a, want: 200},
			exchange{name: "key status in progress", method: "GET", path: keyStatus("p-limited", endpointPayments), apiKey: a, want: 200},
			exchange{name: "key status result expired", method: "GET", path: keyStatus("o-expiring", endpointOrders), apiKey: a, want: 200},
			exchange{name: "key status of a refund", method: "GET", path: keyStatus("r-create", endpointRefunds), apiKey: a, want: 200},
			exchange{name: "key status bad endpoint", method: "GET", path: keyStatus("o-create", "GET /v1/orders"), apiKey: a, want: 400, invalid: true},
			exchange{name: "key status unknown", method: "GET", path: keyStatus("never-used", endpointOrders), apiKey: a, want: 404},
			exchange{name: "key status other tenant", method: "GET", path: keyStatus("o-create", endpointOrders), apiKey: b, want: 404},
			exchange{name: "key status unauthorized", method: "GET", path: keyStatus("o-create", endpointOrders), want: 401, invalid: true},
		)
	})

	// The rules of keys, and their revalidation.
	step(t, "IdempotencyRules", func(t *testing.T) {
		etag := do(t, exchange{name: "rules", method: "GET", path: "/v1/idempotency", apiKey: a, want: 200}).header.Get("ETag")
		run(t,
			exchange{name: "rules unchanged", method: "GET", path: "/v1/idempotency", apiKey: a, header: map[string]string{"If-None-Match": etag}, want: 304},
			exchange{name: "rules unauthorized", method: "GET", path: "/v1/idempotency", want: 401, invalid: true},
		)
	})

	// Processor webhooks, signed instead of authenticated.
	sign := func(body string, at time.Time) map[string]string {
		return map[string]string{webhook.Header: webhook.Sign([]byte(body), at, webhookSecret)}
	}
	const hook = "/v1/webhooks/processor"
	step(t, "Webhooks", func(t *testing.T) {
		event := `{"id":"evt_prism","object":"event","type":"charge.refunded","created":1736935800,"data":{"object":{}}}`
		bigEvent := `{"id":"` + big + `","type":"charge.refunded"}`
		run(t,
			exchange{name: "webhook", method: "POST", path: hook, body: event, header: sign(event, time.Now()), want: 200},
			exchange{name: "webhook duplicate", method: "POST", path: hook, body: event, header: sign(event, time.Now()), want: 200},
			exchange{name: "webhook_signature_invalid", method: "POST", path: hook, body: event, header: map[string]string{webhook.Header: "t=1,v1=00"}, want: 400},
			exchange{name: "webhook without signature", method: "POST", path: hook, body: event, want: 400, invalid: true},
			exchange{name: "webhook_timestamp_out_of_tolerance", method: "POST", path: hook, body: event, header: sign(event, time.Now().Add(-time.Hour)), want: 400},
			exchange{name: "webhook invalid_json", method: "POST", path: hook, body: `{}`, header: sign(`{}`, time.Now()), want: 400, invalid: true},
			exchange{name: "webhook body_too_large", method: "POST", path: hook, body: bigEvent, header: sign(bigEvent, time.Now()), want: 413, invalid: true},
		)
	})

	// 429 from the tenant's rate limit: tenant b spends its burst
	// directly, then asks through Prism.
	step(t, "TenantRateLimit", func(t *testing.T) {
		for i := 0; ; i++ {
			res := e.get(t, b, "/v1/orders?limit=1")
			if res.status == http.StatusTooManyRequests {
				break
			}
			if i > 300 {
				t.Fatalf("tenant b was never rate limited; last status %d", res.status)
			}
		}
		run(t,
			exchange{name: "list orders rate_limited", method: "GET", path: "/v1/orders", apiKey: b, want: 429},
			exchange{name: "create order rate_limited", method: "POST", path: "/v1/orders", apiKey: b, body: orderBody("prism-limited"), header: key("o-limited"), want: 429},
			exchange{name: "get payment rate_limited", method: "GET", path: pay + "/" + paymentID, apiKey: b, want: 429},
			exchange{name: "rules rate_limited", method: "GET", path: "/v1/idempotency", apiKey: b, want: 429},
		)
	})
	// The database goes away: 503 with Retry-After.
	step(t, "DatabaseDown", func(t *testing.T) {
		e.proxy.Cut()
		run(t,
			exchange{name: "readyz down", method: "GET", path: "/readyz", want: 503},
			exchange{name: "list orders down", method: "GET", path: "/v1/orders", apiKey: a, want: 503},
			exchange{name: "create order down", method: "POST", path: "/v1/orders", apiKey: a, body: orderBody("prism-down"), header: key("o-down"), want: 503},
			exchange{name: "webhook down", method: "POST", path: hook, body: `{"id":"evt_down","type":"charge.refunded"}`, header: sign(`{"id":"evt_down","type":"charge.refunded"}`, time.Now()), want: 503},
		)
		e.proxy.Restore()
	})

	// 429 before authentication: this address sent too many keys nobody
	// knows (the test's requests and Prism's come from one address). Last:
	// from now on, this address is refused any key not cached.
	step(t, "UnknownKeysThrottledBeforeAuthentication", func(t *testing.T) {
		for i := 0; ; i++ {
			res := e.get(t, unknownKey, "/v1/orders")
			if res.status == http.StatusTooManyRequests {
				break
			}
			if i > 100 {
				t.Fatalf("unknown keys were never throttled; last status %d", res.status)
			}
		}
		do(t, exchange{name: "unknown key throttled", method: "GET", path: "/v1/orders", apiKey: unknownKey, want: 429})
	})

	// What the run covered: every operation, the main refusals, enough
	// exchanges to mean something.
	step(t, "EveryOperationAndStatusExercised", func(t *testing.T) {
		var missing []string
		for path, item := range loadSpec(t).Paths.Map() {
			for method := range item.Operations() {
				if !operations[method+" "+path] {
					missing = append(missing, method+" "+path)
				}
			}
		}
		sort.Strings(missing)
		if len(missing) > 0 {
			t.Errorf("operations no exchange exercised: %v", missing)
		}
		for _, s := range []int{200, 201, 400, 401, 402, 404, 405, 409, 412, 413, 415, 422, 428, 429, 503} {
			if statuses[s] == 0 {
				t.Errorf("no exchange was answered %d", s)
			}
		}
		if sent < 60 {
			t.Errorf("only %d exchanges; want at least 60", sent)
		}
	})
	// Prism also logs each violation; its log must show none for a response.
	step(t, "PrismLogsNoResponseViolation", func(t *testing.T) {
		for _, px := range []*prismProxy{strict, lenient} {
			sc := bufio.NewScanner(strings.NewReader(px.log.String()))
			sc.Buffer(make([]byte, 0, 64*1024), 16<<20)
			for sc.Scan() {
				if line := sc.Text(); strings.Contains(line, "Violation: response") {
					violations++
					t.Errorf("prism (--errors=%t) logged: %s", px.errors, line)
				}
			}
		}
	})
	t.Logf("%d exchanges through Prism, %d response violations; statuses %v", sent, violations, statuses)
}
