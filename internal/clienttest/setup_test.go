package clienttest

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	apispec "github.com/idemref/payments"
	"github.com/idemref/payments/client"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/processor/simproc"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/processorsim"
	"github.com/idemref/payments/internal/tooling/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// lockTimeout bounds a duplicate's wait on an uncommitted claim: short, so
// a 409 idempotency_key_in_use costs the tests little.
const lockTimeout = 200 * time.Millisecond

// bundle is the real server on its own database, a tenant, and a fault
// injecting transport between the client and the server.
type bundle struct {
	pool     *pgxpool.Pool // direct to the database: assertions and fixtures
	url      string
	tenantID uuid.UUID
	apiKey   string
	faults   *faultTransport
	sim      *processorsim.Simulator // the processor the server calls
}

// timeouts are the server's: how long a request may run, and how long it
// waits on a lock. Setup's defaults are requestTimeout and lockTimeout.
type timeouts struct {
	request, lock time.Duration
}

// requestTimeout is the server's REQUEST_TIMEOUT in these tests.
const requestTimeout = 10 * time.Second

func setup(t *testing.T, with ...timeouts) *bundle {
	t.Helper()
	to := timeouts{request: requestTimeout, lock: lockTimeout}
	for _, w := range with {
		to = w
	}
	pool, _ := testdb.NewPool(t)
	id, key, err := tenants.Create(t.Context(), pool, "client tests")
	if err != nil {
		t.Fatal(err)
	}
	store := idem.NewStore(pool, idem.Config{LockTimeout: to.lock})
	proc := processorsim.New(processorsim.Config{Logger: slog.New(slog.DiscardHandler)})
	sim := httptest.NewServer(proc.Handler())
	t.Cleanup(sim.Close)
	svc := payments.NewService(pool, store, simproc.NewClient(sim.URL, 5*time.Second), httpapi.Renderer{},
		slog.New(slog.DiscardHandler), payments.Config{SettleWindow: 15 * time.Second})
	srv := httptest.NewServer(httpapi.NewHandler(httpapi.Config{
		Pool:           pool,
		Idem:           store,
		Payments:       svc,
		Logger:         slog.New(slog.DiscardHandler),
		RequestTimeout: to.request,
		OpenAPI:        apispec.OpenAPI,
		// Prefer: wait as the service's defaults have it, and always shorter
		// than the request's deadline, as the configuration requires.
		PreferWait: idem.WaitLimits{Max: min(httpapi.DefaultPreferWaitMax, to.request/2),
			PerTenant: httpapi.DefaultPreferWaitPerTenant, PerProcess: httpapi.DefaultPreferWaitPerProcess},
	}))
	t.Cleanup(srv.Close)
	return &bundle{pool: pool, url: srv.URL, tenantID: id, apiKey: key, faults: &faultTransport{next: srv.Client().Transport}, sim: proc}
}

// client returns a client that sends through the fault transport, with
// short backoff so the tests stay fast; p overrides the policy.
func (e *bundle) client(t *testing.T, p client.Policy, opts ...client.Option) *client.Client {
	t.Helper()
	if p.BaseDelay == 0 {
		p.BaseDelay = 5 * time.Millisecond
	}
	if p.MaxDelay == 0 {
		p.MaxDelay = 20 * time.Millisecond
	}
	opts = append([]client.Option{client.WithPolicy(p), client.WithHTTPClient(&http.Client{Transport: e.faults, Timeout: 5 * time.Second})}, opts...)
	c, err := client.New(e.url, e.apiKey, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *bundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// wantOrders checks how many orders the tenant has with reference ref, and
// how many idempotency keys it recorded.
func (e *bundle) wantRows(t *testing.T, ref string, orders, keys int) {
	t.Helper()
	if got := e.count(t, "SELECT count(*) FROM orders WHERE tenant_id = $1 AND reference = $2", e.tenantID, ref); got != orders {
		t.Errorf("orders with reference %s = %d, want %d", ref, got, orders)
	}
	if got := e.count(t, "SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1", e.tenantID); got != keys {
		t.Errorf("idempotency_keys rows = %d, want %d", got, keys)
	}
}

// --- Fault injection between the client and the real server ---

// fault handles one attempt: it may forward it to the server (next), and
// decides what the client sees.
type fault func(req *http.Request, next http.RoundTripper) (*http.Response, error)

// faultTransport plays one scripted fault per attempt, in order, then
// forwards every further attempt untouched. It records each attempt.
type faultTransport struct {
	next http.RoundTripper

	mu       sync.Mutex
	script   []fault
	always   fault // when set, plays for every attempt past the script
	attempts []seen
}

// seen is one attempt as the transport saw it.
type seen struct {
	at     time.Time
	key    string // its Idempotency-Key header
	method string
	path   string
}

func (f *faultTransport) play(faults ...fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.script = append(f.script, faults...)
}

func (f *faultTransport) forever(x fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.always = x
}

func (f *faultTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	f.mu.Lock()
	f.attempts = append(f.attempts, seen{at: time.Now(), key: req.Header.Get("Idempotency-Key"), method: req.Method, path: req.URL.Path})
	next := f.always
	if len(f.script) > 0 {
		next, f.script = f.script[0], f.script[1:]
	}
	f.mu.Unlock()
	if next == nil {
		return f.next.RoundTrip(req)
	}
	return next(req, f.next)
}

func (f *faultTransport) seen() []seen {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]seen(nil), f.attempts...)
}

// cutAfterCommit forwards the attempt, waits for the server's whole answer
// (so its transaction committed), then drops it: the client sees a broken
// connection, exactly as when a link fails after the server's commit.
func cutAfterCommit(req *http.Request, next http.RoundTripper) (*http.Response, error) {
	res, err := next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return nil, errors.New("connection reset after the request was sent")
}

// status answers for the server without forwarding: what a load balancer,
// a gateway or an overloaded front end sends. retryAfter "" sends none.
func status(code int, retryAfter string) fault {
	return func(req *http.Request, _ http.RoundTripper) (*http.Response, error) {
		h := http.Header{}
		body := "<html><body>" + http.StatusText(code) + "</body></html>" // a gateway's page, not a problem
		h.Set("Content-Type", "text/html")
		if code == http.StatusServiceUnavailable || code == http.StatusTooManyRequests {
			problemCode := map[int]string{503: "service_unavailable", 429: "rate_limited"}[code]
			h.Set("Content-Type", "application/problem+json")
			body = `{"type":"` + httpapi.ProblemType(problemCode) + `","title":"` + http.StatusText(code) + `","status":` + strconv.Itoa(code) + `,"code":"` + problemCode + `"}`
		}
		if retryAfter != "" {
			h.Set("Retry-After", retryAfter)
		}
		return &http.Response{
			StatusCode: code, Status: strconv.Itoa(code) + " " + http.StatusText(code), Header: h,
			Body: io.NopCloser(strings.NewReader(body)), Request: req, ProtoMajor: 1, ProtoMinor: 1,
		}, nil
	}
}

// heldByAnother forwards the attempt while another transaction holds an
// uncommitted claim on its key, as a concurrent first attempt would: the
// real server waits its lock timeout and answers 409
// idempotency_key_in_use with Retry-After. The claim is then rolled back,
// so the retry can run.
func (e *bundle) heldByAnother(t *testing.T) fault {
	return func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		ctx := context.Background()
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		fp := sha256.Sum256([]byte("another attempt"))
		if _, err := tx.Exec(ctx,
			`INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, expires_at, retain_until)
			 VALUES ($1, 'POST /v1/orders', $2, $3, $4, now() + interval '1 day', now() + interval '3 days')`,
			e.tenantID, req.Header.Get("Idempotency-Key"), fp[:], idem.FingerprintVersion); err != nil {
			t.Errorf("hold the key: %v", err)
			return nil, err
		}
		return next.RoundTrip(req)
	}
}

// detached forwards the attempt on its own, as a server behind a broken
// link goes on with a request its client no longer hears about: the client
// sees a connection reset at once, while the request runs to its end at the
// server, which sends its status to done.
func detached(done chan<- int) fault {
	return func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		body, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		out := req.Clone(context.WithoutCancel(req.Context()))
		out.Body = body
		go func() {
			res, err := next.RoundTrip(out)
			if err != nil {
				done <- 0
				return
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			done <- res.StatusCode
		}()
		return nil, errors.New("connection reset while the request was in flight")
	}
}

// waitForLockWaiters returns once n statements of the test's database wait
// on a lock: the server's requests are held where the test wants them.
func (e *bundle) waitForLockWaiters(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for e.count(t, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'") < n {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d requests ever waited on the lock the test holds", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// writtenByAnother forwards the attempt while another transaction holds an
// uncommitted order with the attempt's reference, as another key's request
// for the same order would: the real server waits its lock timeout and
// answers 409 conflicting_write_in_progress with Retry-After, recording
// nothing. The other order is then rolled back, so the retry can run.
func (e *bundle) writtenByAnother(t *testing.T) fault {
	return func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		body, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		var order struct {
			Reference string `json:"reference"`
		}
		if err := json.NewDecoder(body).Decode(&order); err != nil {
			return nil, err
		}
		ctx := context.Background()
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, `
			INSERT INTO orders (tenant_id, id, reference, customer_id, amount, currency)
			VALUES ($1, gen_random_uuid(), $2, 'cus_other', 100, 'EUR')`, e.tenantID, order.Reference); err != nil {
			t.Errorf("write the other order: %v", err)
			return nil, err
		}
		return next.RoundTrip(req)
	}
}
