package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	apispec "github.com/idemref/payments"
	"github.com/idemref/payments/client/api"
	"github.com/idemref/payments/internal/db"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/processor/simproc"
	"github.com/idemref/payments/internal/processor/stripeproc"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/pgwire"
	"github.com/idemref/payments/internal/tooling/processorsim"
	"github.com/idemref/payments/internal/tooling/stripefake"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
	"github.com/idemref/payments/internal/webhook"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// step runs one named step of a long scripted test as a subtest. A step
// that stops (t.Fatal) stops the script, because later steps build on what
// it left (an order, a payment, a cut connection); a step that only
// reports errors lets the script go on to the next one.
func step(t *testing.T, name string, f func(t *testing.T)) {
	t.Helper()
	finished := false
	t.Run(name, func(t *testing.T) {
		f(t)
		finished = true
	})
	if !finished {
		t.FailNow()
	}
}

// endpointOrders is how the create endpoint is named in idempotency_keys:
// method plus route template (K2).
const endpointOrders = "POST /v1/orders"

// lockTimeout bounds how long a duplicate waits on an uncommitted claim in
// these tests; short, so the 409 path is quick.
const lockTimeout = 300 * time.Millisecond

// requestTimeout is the server's REQUEST_TIMEOUT in these tests.
const requestTimeout = 10 * time.Second

type tenant struct {
	ID  uuid.UUID
	Key string // API key, sent as Authorization: Bearer <Key>
}

// bundle is one test's world: its own migrated database, a server over it and
// two tenants.
type bundle struct {
	pool  *pgxpool.Pool // direct to the database: assertions and fixtures
	dbURL string
	srv   *httptest.Server
	// handler is what httpapi.NewHandler returned.
	handler http.Handler
	client  *http.Client
	a, b    tenant
	// proxy sits between the server's pool and PostgreSQL when setup was
	// given withProxy; nil otherwise.
	proxy *testkit.TCPProxy
	// sim is the payment processor the server calls when setup was given
	// withProcessor, and payments the service that calls it; nil otherwise.
	sim      *processorsim.Simulator
	payments *payments.Service
	// stripe is the Stripe fake the server calls, through the Stripe
	// adapter, when setup was given withStripe; nil otherwise.
	stripe *stripefake.Server
	// wire counts the server's round trips to PostgreSQL when setup was
	// given withWireCounter; nil otherwise.
	wire *pgwire.Proxy
}

type setupOptions struct {
	proxy        bool
	processor    bool
	stripe       bool
	settleWindow time.Duration
	rateLimit    httpapi.RateLimit
	wireCounter  bool
	webhooks     []string // the simulator's signing secrets; nil: no webhooks
	// webhookScheme is the scheme both the server and the simulator use;
	// with SchemeStandard the server's secret is standardWebhookSecret.
	webhookScheme webhook.Scheme
	// lockTimeout is the store's; zero: the const lockTimeout.
	lockTimeout time.Duration
	// processorTimeout bounds a call to the simulator; zero: the const
	// processorTimeout.
	processorTimeout time.Duration
	// preferWait bounds waiting duplicates (L7); zero: no waiting.
	preferWait idem.WaitLimits
}

// withProcessorTimeout sets how long a call to the simulator may take, for
// a test that holds one longer than processorTimeout.
func withProcessorTimeout(d time.Duration) setupOption {
	return func(o *setupOptions) { o.processorTimeout = d }
}

// withPreferWait lets duplicates wait under Prefer: wait, within limits.
func withPreferWait(limits idem.WaitLimits) setupOption {
	return func(o *setupOptions) { o.preferWait = limits }
}

// withLockTimeout sets how long a request waits on a lock, for a test that
// holds one longer than lockTimeout.
func withLockTimeout(d time.Duration) setupOption {
	return func(o *setupOptions) { o.lockTimeout = d }
}

// withWireCounter routes the server's pool, one connection, through a
// proxy that counts round trips and statements (e.wire), and caches
// authentication as serve does by default.
func withWireCounter() setupOption { return func(o *setupOptions) { o.wireCounter = true } }

type setupOption func(*setupOptions)

// withProxy routes the server's pool through a TCP proxy the test can cut.
func withProxy() setupOption { return func(o *setupOptions) { o.proxy = true } }

// withProcessor serves the payments endpoints: it starts a processor
// simulator in this process, over real HTTP, and wires the payments service
// to it as cmd/api does.
func withProcessor() setupOption { return func(o *setupOptions) { o.processor = true } }

// withStripe serves the payments endpoints through the Stripe adapter,
// against the Stripe fake (e.stripe) over real HTTP. Webhooks are verified
// the Stripe way (Stripe-Signature) with webhookSecret.
func withStripe() setupOption { return func(o *setupOptions) { o.stripe = true } }

// stripeAPIKey is the secret key the server's Stripe adapter sends.
const stripeAPIKey = "sk_test_server"

// withWebhooks has the simulator deliver its webhooks to the server,
// signed with secrets. The server verifies with webhookSecret only.
func withWebhooks(secrets ...string) setupOption {
	return func(o *setupOptions) { o.webhooks = secrets }
}

// withStandardWebhooks has the simulator sign its webhooks the Standard
// Webhooks way with secrets, and the server verify them that way with
// standardWebhookSecret.
func withStandardWebhooks(secrets ...string) setupOption {
	return func(o *setupOptions) { o.webhooks, o.webhookScheme = secrets, webhook.SchemeStandard }
}

// standardWebhookSecret is the server's secret under Standard Webhooks.
const standardWebhookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// The server's webhook secret, and one it no longer knows (rotated out).
const (
	webhookSecret        = "whsec_current"
	webhookSecretRetired = "whsec_retired"
)

// withRateLimit turns the per-tenant rate limit on (it is off in tests
// unless asked for).
func withRateLimit(rate float64, burst int) setupOption {
	return func(o *setupOptions) { o.rateLimit = httpapi.RateLimit{Rate: rate, Burst: burst} }
}

// withSettleWindow sets the payments service's settle window (default
// settleWindow): shorter than the processor's execution, to play a
// processor slower than the API was configured for.
func withSettleWindow(d time.Duration) setupOption {
	return func(o *setupOptions) { o.settleWindow = d }
}

const (
	// processorTimeout bounds one call to the simulator: short, so the
	// timeout fault costs the tests little.
	processorTimeout = 500 * time.Millisecond
	// paymentLease is how long a payment attempt owns its key: well above
	// processorTimeout, as the lease must outlast one step (S3).
	paymentLease = 10 * time.Second
	// settleWindow is how long a processor call may still land after it was
	// sent (S6): above processorTimeout and above lateDelay, the longest the
	// tests' processor takes to execute a call, as it must be.
	settleWindow = 1500 * time.Millisecond
	// lateDelay is how long a late_execution fault holds a call before it
	// executes: after the caller gave up, within the settle window.
	lateDelay = time.Second
)

func setup(t *testing.T, opts ...setupOption) *bundle {
	t.Helper()
	o := setupOptions{settleWindow: settleWindow, lockTimeout: lockTimeout, processorTimeout: processorTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	pool, dbURL := testdb.NewPool(t)
	e := &bundle{pool: pool, dbURL: dbURL}

	serverPool := pool
	if o.proxy {
		var cfg *pgxpool.Config
		e.proxy, cfg = testkit.DatabaseProxy(t, dbURL)
		// Few connections, so that after an outage the pool runs out of
		// dead ones after a bounded number of requests.
		cfg.MaxConns = 2
		var err error
		serverPool, err = pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatalf("open proxied pool: %v", err)
		}
		t.Cleanup(serverPool.Close)
	}

	var authCacheTTL time.Duration
	if o.wireCounter {
		var err error
		cfg, err := pgxpool.ParseConfig(dbURL)
		if err != nil {
			t.Fatalf("parse database URL: %v", err)
		}
		e.wire, err = pgwire.Listen(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.wire.Close() })
		url, err := e.wire.URL(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		if cfg, err = pgxpool.ParseConfig(url); err != nil {
			t.Fatal(err)
		}
		db.Configure(cfg)
		// One connection: every statement is prepared on it once, so a
		// measured request pays what it pays in steady state.
		cfg.MaxConns = 1
		if serverPool, err = pgxpool.NewWithConfig(context.Background(), cfg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(serverPool.Close)
		authCacheTTL = 10 * time.Second
	}

	var err error
	e.a.ID, e.a.Key, err = tenants.Create(t.Context(), pool, "tenant a")
	if err != nil {
		t.Fatal(err)
	}
	e.b.ID, e.b.Key, err = tenants.Create(t.Context(), pool, "tenant b")
	if err != nil {
		t.Fatal(err)
	}

	logger := testkit.Logger(t) // before the servers, so its cleanup runs after their Close
	store := idem.NewStore(serverPool, idem.Config{LockTimeout: o.lockTimeout, Lease: paymentLease})
	if o.processor {
		e.sim = processorsim.New(processorsim.Config{Logger: logger.With(slog.String("component", "processorsim"))})
		simSrv := httptest.NewServer(e.sim.Handler())
		t.Cleanup(simSrv.Close) // runs after the API server's Close: no call is cut short
		e.payments = payments.NewService(serverPool, store,
			simproc.NewClient(simSrv.URL, o.processorTimeout), httpapi.Renderer{}, logger,
			payments.Config{SettleWindow: o.settleWindow})
	}
	if o.stripe {
		e.stripe = stripefake.Start(t)
		adapter := stripeproc.New(stripeproc.Config{APIKey: stripeAPIKey, URL: e.stripe.URL, Timeout: processorTimeout, SearchLag: time.Millisecond})
		e.payments = payments.NewService(serverPool, store, adapter, httpapi.Renderer{}, logger,
			payments.Config{SettleWindow: o.settleWindow})
	}
	serverSecret := webhookSecret
	if o.webhookScheme == webhook.SchemeStandard {
		serverSecret = standardWebhookSecret
	}
	e.handler = httpapi.NewHandler(httpapi.Config{
		Pool:           serverPool,
		Idem:           store,
		Payments:       e.payments,
		Logger:         logger,
		RequestTimeout: requestTimeout,
		OpenAPI:        apispec.OpenAPI,
		RateLimit:      o.rateLimit,
		AuthCacheTTL:   authCacheTTL,
		WebhookSecrets: []string{serverSecret},
		WebhookScheme:  o.webhookScheme,
		PreferWait:     o.preferWait,
	})
	e.srv = httptest.NewServer(e.handler)
	if e.sim != nil && o.webhooks != nil {
		// Fast retries, so a failed delivery is retried within the test.
		e.sim.SetWebhooks(processorsim.WebhookConfig{
			URL: e.srv.URL + "/v1/webhooks/processor", Secrets: o.webhooks, Scheme: o.webhookScheme,
			Retry: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond},
		})
	}
	t.Cleanup(e.srv.Close) // waits for in-flight requests, so no log line comes late
	e.client = e.srv.Client()
	e.client.Timeout = 10 * time.Second
	return e
}

// response is a response as the client saw it.
type response struct {
	status int
	header http.Header
	body   []byte
}

// reqOption adjusts a request before it is sent.
type reqOption func(*http.Request)

// withHeader adds one header line (call it twice for two lines).
func withHeader(name, value string) reqOption {
	return func(r *http.Request) {
		r.Header[http.CanonicalHeaderKey(name)] = append(r.Header[http.CanonicalHeaderKey(name)], value)
	}
}

// withContentType replaces the Content-Type; "" removes it.
func withContentType(ct string) reqOption {
	return func(r *http.Request) {
		if ct == "" {
			r.Header.Del("Content-Type")
			return
		}
		r.Header.Set("Content-Type", ct)
	}
}

// withAuthorization replaces the Authorization header; "" removes it.
func withAuthorization(v string) reqOption {
	return func(r *http.Request) {
		if v == "" {
			r.Header.Del("Authorization")
			return
		}
		r.Header.Set("Authorization", v)
	}
}

// do sends one request. apiKey "" sends no Authorization header.
func (e *bundle) do(t *testing.T, method, path, apiKey string, body []byte, opts ...reqOption) response {
	t.Helper()
	res, err := e.send(t.Context(), method, path, apiKey, body, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// send is do for other goroutines than the test's: it reports failures
// instead of ending the test.
func (e *bundle) send(ctx context.Context, method, path, apiKey string, body []byte, opts ...reqOption) (response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, e.srv.URL+path, rd)
	if err != nil {
		return response{}, err
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, opt := range opts {
		opt(req)
	}
	res, err := e.client.Do(req)
	if err != nil {
		return response{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		return response{}, fmt.Errorf("%s %s: read body: %w", method, path, err)
	}
	return response{status: res.StatusCode, header: res.Header, body: data}, nil
}

// post creates an order. idemKey "" sends no Idempotency-Key header.
func (e *bundle) post(t *testing.T, apiKey, idemKey, body string, opts ...reqOption) response {
	t.Helper()
	if idemKey != "" {
		opts = append([]reqOption{withHeader(idem.HeaderName, idemKey)}, opts...)
	}
	return e.do(t, http.MethodPost, "/v1/orders", apiKey, []byte(body), opts...)
}

func (e *bundle) get(t *testing.T, apiKey, path string) response {
	t.Helper()
	return e.do(t, http.MethodGet, path, apiKey, nil)
}

// orderBody is a valid create request for reference ref.
func orderBody(ref string) string {
	return `{"reference":"` + ref + `","customer_id":"cus_1","amount":2500,"currency":"EUR"}`
}

// wantProblem checks that res is a problem with the given status and code,
// with the headers every problem carries, and returns it.
func wantProblem(t *testing.T, res response, status int, code string) api.Problem {
	t.Helper()
	if res.status != status {
		t.Fatalf("status = %d, want %d; body: %s", res.status, status, res.body)
	}
	if ct := res.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q, want application/problem+json", ct)
	}
	if cc := res.header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("Cache-Control = %q, want no-store", cc)
	}
	var p api.Problem
	if err := json.Unmarshal(res.body, &p); err != nil {
		t.Fatalf("decode problem: %v; body: %s", err, res.body)
	}
	if p.Code != code || p.Status != status {
		t.Fatalf("problem code/status = %s/%d, want %s/%d; body: %s", p.Code, p.Status, code, status, res.body)
	}
	if want := httpapi.ProblemType(code); p.Type != want {
		t.Errorf("problem type = %q, want %q", p.Type, want)
	}
	if p.Title == "" {
		t.Error("problem has no title")
	}
	return p
}

// wantRetryAfter checks for a Retry-After in delay-seconds.
func wantRetryAfter(t *testing.T, res response) {
	t.Helper()
	v := res.header.Get("Retry-After")
	if n, err := strconv.Atoi(v); err != nil || n < 0 {
		t.Errorf("Retry-After = %q, want a non-negative integer", v)
	}
}

// wantStatus fails the test unless res has the given status.
func wantStatus(t *testing.T, res response, status int) {
	t.Helper()
	if res.status != status {
		t.Fatalf("status = %d, want %d; body: %s", res.status, status, res.body)
	}
}

func decodeOrder(t *testing.T, res response) api.Order {
	t.Helper()
	var o api.Order
	if err := json.Unmarshal(res.body, &o); err != nil {
		t.Fatalf("decode order: %v; body: %s", err, res.body)
	}
	return o
}

// wantReplay checks that replay is first replayed byte for byte: same
// status, same recorded headers, same body, and Idempotent-Replayed: true
// on the replay only.
func wantReplay(t *testing.T, first, replay response) {
	t.Helper()
	if got := first.header.Values(httpapi.ReplayedHeader); len(got) != 0 {
		t.Errorf("first response has %s %q; want none", httpapi.ReplayedHeader, got)
	}
	if got := replay.header.Get(httpapi.ReplayedHeader); got != "true" {
		t.Errorf("replay %s = %q, want true; status %d, body: %s", httpapi.ReplayedHeader, got, replay.status, replay.body)
	}
	if replay.status != first.status {
		t.Errorf("replay status = %d, want %d", replay.status, first.status)
	}
	for _, name := range idem.RecordedHeaders {
		if diff := cmp.Diff(first.header.Values(name), replay.header.Values(name)); diff != "" {
			t.Errorf("replay header %s differs (-first +replay):\n%s", name, diff)
		}
	}
	if !bytes.Equal(first.body, replay.body) {
		t.Errorf("replay body differs:\nfirst:  %s\nreplay: %s", first.body, replay.body)
	}
}

// --- Reading the side effects directly ---

func (e *bundle) countOrders(t *testing.T) int {
	t.Helper()
	return e.count(t, "SELECT count(*) FROM orders")
}

func (e *bundle) countKeys(t *testing.T) int {
	t.Helper()
	return e.count(t, "SELECT count(*) FROM idempotency_keys")
}

func (e *bundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// wantRows checks the number of rows in orders and idempotency_keys.
func (e *bundle) wantRows(t *testing.T, orders, keys int) {
	t.Helper()
	if got := e.countOrders(t); got != orders {
		t.Errorf("orders rows = %d, want %d", got, orders)
	}
	if got := e.countKeys(t); got != keys {
		t.Errorf("idempotency_keys rows = %d, want %d", got, keys)
	}
}

// keyRow is the part of an idempotency_keys row the tests look at.
type keyRow struct {
	State  string
	Status int // 0 while in progress
}

// keyRecord reads the (tenant, POST /v1/orders, key) row; ok is false when
// there is none.
func (e *bundle) keyRecord(t *testing.T, tenantID uuid.UUID, key string) (row keyRow, ok bool) {
	t.Helper()
	k, ok := testkit.ReadKeyRow(t, e.pool, tenantID, endpointOrders, key)
	return keyRow{State: k.State, Status: k.ResponseStatus}, ok
}

// wantKeyRecord checks that the key's row is completed with status.
func (e *bundle) wantKeyRecord(t *testing.T, tenantID uuid.UUID, key string, status int) {
	t.Helper()
	row, ok := e.keyRecord(t, tenantID, key)
	if !ok {
		t.Fatalf("no idempotency_keys row for key %q", key)
	}
	if diff := cmp.Diff(keyRow{State: "completed", Status: status}, row); diff != "" {
		t.Errorf("idempotency_keys row for %q (-want +got):\n%s", key, diff)
	}
}

func (e *bundle) countOrdersWithReference(t *testing.T, tenantID uuid.UUID, ref string) int {
	t.Helper()
	return e.count(t, "SELECT count(*) FROM orders WHERE tenant_id = $1 AND reference = $2", tenantID, ref)
}

// customerBody is a valid PUT /v1/customers/{id} body.
func customerBody(name string) string {
	return `{"name":"` + name + `","email":"` + strings.ToLower(name) + `@example.com"}`
}

// deref is *p, or the zero value when the member p decodes is absent.
func deref[T any](p *T) T {
	if p == nil {
		var zero T
		return zero
	}
	return *p
}

// idString is the text of the id *id, or "" when the member is absent.
func idString(id *api.Uuid) string {
	if id == nil {
		return ""
	}
	return id.String()
}
