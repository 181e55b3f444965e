package stripeproc_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/processor/stripeproc"
)

// StripeMockVersion is the stripe-mock the tests build from the module
// proxy: Stripe's own mock, which checks each request against Stripe's
// OpenAPI specification (paths, methods, parameters and their types).
const StripeMockVersion = "v0.203.0"

// Every call the adapter makes is one Stripe's specification accepts:
// each is sent to stripe-mock, which answers 400 to an unknown path or
// parameter or a value of the wrong type, and each must get a 2xx that
// the adapter reads as a final answer. stripe-mock is stateless (its
// answers are fixtures), so this checks the requests' shape only; the
// recorded answers of stripefake test what the answers mean.
func TestStripeMockAcceptsEveryCall(t *testing.T) {
	t.Parallel()
	url := startStripeMock(t)
	rec := &exchanges{}
	a := stripeproc.New(stripeproc.Config{APIKey: "sk_test_123", URL: url, Transport: rec})
	ctx := t.Context()

	_, err := a.CreateCharge(ctx, processor.ChargeRequest{Amount: 1000, Currency: "EUR", PaymentMethod: "pm_card_visa",
		Metadata: map[string]string{"payment_id": "p1", "order_id": "o1"}}, "derived-charge-key")
	// stripe-mock's fixture PaymentIntent is requires_payment_method: read
	// as a decline, a final answer.
	requireFinal(t, "CreateCharge", err)
	_, err = a.Refund(ctx, processor.RefundRequest{Charge: "pi_123", Amount: 400}, "derived-refund-key")
	requireFinal(t, "Refund", err)
	_, err = a.Refund(ctx, processor.RefundRequest{Charge: "pi_123"}, "derived-refund-all-key")
	requireFinal(t, "Refund of all that is left", err)
	_, err = a.ChargesByIdempotencyKey(ctx, "derived-charge-key")
	requireFinal(t, "ChargesByIdempotencyKey", err)
	// The cancel of a PaymentIntent that stopped: stripe-mock's fixture
	// never stops, so its answer to this create is made to.
	stopping := stripeproc.New(stripeproc.Config{APIKey: "sk_test_123", URL: url, Transport: stopAtRequiresAction{rec}})
	_, err = stopping.CreateCharge(ctx, processor.ChargeRequest{Amount: 1000, Currency: "EUR", PaymentMethod: "pm_card_visa"}, "derived-stopped-key")
	requireFinal(t, "CreateCharge that stops, then its cancel", err)
	_, err = a.RefundsByCharge(ctx, "pi_123")
	requireFinal(t, "RefundsByCharge", err)

	var endpoints []string
	for _, x := range rec.all() {
		if x.status < 200 || x.status > 299 {
			t.Errorf("stripe-mock refused %s %s: %d", x.method, x.path, x.status)
		}
		if id, ok := strings.CutPrefix(x.path, "/v1/payment_intents/"); ok && strings.HasSuffix(id, "/cancel") {
			x.path = "/v1/payment_intents/{id}/cancel"
		}
		if e := x.method + " " + x.path; !slices.Contains(endpoints, e) {
			endpoints = append(endpoints, e)
		}
	}
	slices.Sort(endpoints)
	want := []string{"GET /v1/payment_intents/search", "GET /v1/refunds", "POST /v1/payment_intents", "POST /v1/payment_intents/{id}/cancel", "POST /v1/refunds"}
	if !slices.Equal(endpoints, want) {
		t.Errorf("endpoints called = %q, want %q", endpoints, want)
	}
	t.Logf("endpoints the adapter called, each accepted by stripe-mock %s: %s", StripeMockVersion, strings.Join(endpoints, ", "))

	// The negative control: stripe-mock does refuse a request Stripe
	// would, so its 2xx above mean something.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/payment_intents", strings.NewReader("amount=1000&currency=eur&not_a_parameter=1"))
	req.Header.Set("Authorization", "Bearer sk_test_123")
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("stripe-mock answered %d to an unknown parameter, want 400", resp.StatusCode)
	}
}

// docs/payments.md tells how to run the API against stripe-mock at the
// version these tests pin.
func TestPaymentsDocPinsStripeMock(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "payments.md"))
	if err != nil {
		t.Fatal(err)
	}
	want := "go install github.com/stripe/stripe-mock@" + StripeMockVersion + "\n"
	if !strings.Contains(string(doc), want) {
		t.Errorf("docs/payments.md has no line %q: say how to run the version the tests pin", strings.TrimSpace(want))
	}
}

func requireFinal(t *testing.T, call string, err error) {
	t.Helper()
	if c := processor.ClassOf(err); c != processor.ClassFinal {
		t.Errorf("%s against stripe-mock: %v (class %s), want a final answer", call, err, c)
	}
}

// stopAtRequiresAction rewrites the status of the PaymentIntent a create
// answers to requires_action, as if it had stopped there.
type stopAtRequiresAction struct{ next http.RoundTripper }

func (s stopAtRequiresAction) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := s.next.RoundTrip(r)
	if err != nil || r.Method != http.MethodPost || r.URL.Path != "/v1/payment_intents" {
		return resp, err
	}
	defer resp.Body.Close()
	var pi map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&pi); err != nil {
		return nil, err
	}
	pi["status"] = "requires_action"
	body, err := json.Marshal(pi)
	if err != nil {
		return nil, err
	}
	resp.Body, resp.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	resp.Header.Del("Content-Length")
	return resp, nil
}

// exchanges records each request's method, path and answer status.
type exchanges struct {
	mu   sync.Mutex
	list []exchange
}

type exchange struct {
	method, path string
	status       int
}

func (e *exchanges) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	x := exchange{method: r.Method, path: r.URL.Path}
	if resp != nil {
		x.status = resp.StatusCode
	}
	e.mu.Lock()
	e.list = append(e.list, x)
	e.mu.Unlock()
	return resp, err
}

func (e *exchanges) all() []exchange {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.list)
}

// startStripeMock builds stripe-mock at StripeMockVersion from the module
// proxy (go install into a temporary folder: nothing is committed, and the
// build cache makes the next build quick), runs it on 127.0.0.1 only, and
// returns its HTTP base URL. It stops with the test.
func startStripeMock(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	install := exec.Command("go", "install", "github.com/stripe/stripe-mock@"+StripeMockVersion)
	install.Dir = bin // outside this module: the tool's own go.mod decides its dependencies
	install.Env = append(os.Environ(), "GOBIN="+bin, "GOFLAGS=-mod=mod")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("build stripe-mock %s (go install from the module proxy): %v\n%s", StripeMockVersion, err, out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	// Port 0 on both listeners, loopback only: stripe-mock binds every
	// interface by default.
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "stripe-mock"), "-http-addr", "127.0.0.1:0", "-https-addr", "127.0.0.1:0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
	})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if addr, ok := strings.CutPrefix(sc.Text(), "Listening for HTTP at address: "); ok {
				found <- addr
			}
		}
	}()
	select {
	case addr := <-found:
		return fmt.Sprintf("http://%s", addr)
	case <-time.After(30 * time.Second):
		t.Fatal("stripe-mock did not say where it listens within 30 s")
	}
	return ""
}
