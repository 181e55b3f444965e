package payments_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/db"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/orders"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/processor/simproc"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/processorsim"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// bundle is one test's payments service: a database of its own, a tenant,
// and a processor simulator in this process, called over real HTTP as
// cmd/api calls it.
type bundle struct {
	pool   *pgxpool.Pool // direct to the database: fixtures and assertions
	dbURL  string
	tenant uuid.UUID
	sim    *processorsim.Simulator
	// gate sits in front of the simulator, so a test can take the
	// processor down and bring it back.
	gate    *processorGate
	procURL string
	// lease is how long a payment attempt owns its key; timeout bounds one
	// processor call and is shorter, as it must be (S3).
	lease, timeout time.Duration
	// settle is the settle window (S6): longer than timeout.
	settle time.Duration
	log    *slog.Logger
	// svc is the service of the process the test plays the client of.
	svc *payments.Service
}

func setup(t *testing.T, lease, timeout time.Duration) *bundle {
	t.Helper()
	pool, dbURL := testdb.NewPool(t)
	w := &bundle{pool: pool, dbURL: dbURL, lease: lease, timeout: timeout, settle: 3 * timeout, log: testkit.Logger(t)}
	var err error
	w.tenant, _, err = tenants.Create(t.Context(), pool, "tenant "+uuid.NewString())
	if err != nil {
		t.Fatal(err)
	}
	w.sim = processorsim.New(processorsim.Config{})
	w.gate = &processorGate{next: w.sim.Handler()}
	srv := httptest.NewServer(w.gate)
	t.Cleanup(srv.Close)
	w.procURL = srv.URL
	w.svc = w.service(pool)
	return w
}

// service wires a Service over pool as cmd/api does.
func (w *bundle) service(pool *pgxpool.Pool) *payments.Service {
	store := idem.NewStore(pool, idem.Config{Lease: w.lease})
	return payments.NewService(pool, store, simproc.NewClient(w.procURL, w.timeout), httpapi.Renderer{}, w.log,
		payments.Config{SettleWindow: w.settle})
}

// process returns the Service of another API process on the same
// database and processor: its own pool, key store and processor client.
func (w *bundle) process(t *testing.T) *payments.Service {
	t.Helper()
	pool, err := db.Open(t.Context(), w.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return w.service(pool)
}

// processorGate passes calls to the simulator, or answers every call 503
// while down, as a processor in an outage does. Refused calls never reach
// the simulator, so they are counted here.
type processorGate struct {
	next    http.Handler
	down    atomic.Bool
	refused atomic.Int32
	// once, when set, serves the next call for which it returns true in
	// the simulator's place (it may call next itself): a test's hook into
	// one processor call, taken once.
	once atomic.Pointer[func(w http.ResponseWriter, r *http.Request, next http.Handler) bool]
}

// interceptOnce sets g.once.
func (g *processorGate) interceptOnce(f func(w http.ResponseWriter, r *http.Request, next http.Handler) bool) {
	g.once.Store(&f)
}

func (g *processorGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f := g.once.Load(); f != nil && (*f)(w, r, g.next) {
		g.once.CompareAndSwap(f, nil)
		return
	}
	if g.down.Load() {
		g.refused.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":{"type":"api_error","message":"The processor is down."}}`))
		return
	}
	g.next.ServeHTTP(w, r)
}

// newOrder creates an order of amount EUR cents.
func (w *bundle) newOrder(t *testing.T, ref string, amount int64) orders.Order {
	t.Helper()
	o, err := orders.Create(t.Context(), w.pool, w.tenant, orders.CreateInput{
		Reference: ref, CustomerID: "cus_1", Amount: amount, Currency: "EUR",
	})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// payment is one client's payment request: the order, the request and
// its claim under the client's key.
type payment struct {
	order orders.Order
	in    payments.PayInput
	claim idem.Claim
}

// newPayment creates an order and the request that pays it in full with a
// card that succeeds, under key.
func (w *bundle) newPayment(t *testing.T, key string, amount int64) payment {
	t.Helper()
	o := w.newOrder(t, "order-"+key, amount)
	in := payments.PayInput{OrderID: o.ID, Amount: o.Amount, Currency: o.Currency, PaymentMethod: processorsim.PaymentMethodVisa}
	fp, err := idem.Fingerprint(payments.EndpointPay, nil, in)
	if err != nil {
		t.Fatal(err)
	}
	return payment{order: o, in: in, claim: idem.Claim{TenantID: w.tenant, Endpoint: payments.EndpointPay, Key: key, Fingerprint: fp}}
}

// chargeKey is the derived key the payment's charge must carry.
func (p payment) chargeKey() string {
	return idem.DeriveKey(idem.Claim{TenantID: p.claim.TenantID, Endpoint: p.claim.Endpoint, Key: p.claim.Key}, "charge")
}

// abandon runs p's Pay with fault queued for its charge call, so it stops
// at charge_sent with its key released, as a client that gave up after a
// 503 leaves it.
func (w *bundle) abandon(t *testing.T, ctx context.Context, p payment, fault processorsim.FaultKind) {
	t.Helper()
	w.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: fault})
	res, replayed, err := w.svc.Pay(ctx, p.claim, p.in)
	if !errors.Is(err, payments.ErrOutcomeUnknown) {
		t.Fatalf("Pay(%s) with a %s fault = %d %s, replayed %v, %v; want ErrOutcomeUnknown",
			p.claim.Key, fault, res.Status, res.Body, replayed, err)
	}
	w.wantKey(t, p.claim, keyRow{State: "in_progress", RecoveryPoint: "charge_sent", Generation: 1, Lock: "expired"})
	w.wantPaymentStatus(t, p, payments.StatusChargeSent)
}

// passSettleWindow makes the settle window of p's charge pass now, as
// if its last call had been sent a window ago, and ends the lease a key
// holds between two lookups: what waiting would do, without the wait.
func (w *bundle) passSettleWindow(t *testing.T, p payment) {
	t.Helper()
	ctx := context.Background()
	if _, err := w.pool.Exec(ctx, `UPDATE payments SET charge_sent_at = charge_sent_at - make_interval(secs => $3)
		WHERE tenant_id = $1 AND order_id = $2`, p.claim.TenantID, p.order.ID, w.settle.Seconds()); err != nil {
		t.Fatal(err)
	}
	if _, err := w.pool.Exec(ctx, `UPDATE idempotency_keys SET locked_until = now()
		WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3 AND state = 'in_progress'`,
		p.claim.TenantID, p.claim.Endpoint, p.claim.Key); err != nil {
		t.Fatal(err)
	}
}

// --- Rows ---

// keyRow is a multi-step key row; its response is read separately.
type keyRow struct {
	State         string
	RecoveryPoint string
	Generation    int64
	// Lock is "none" (locked_until NULL), "live" or "expired".
	Lock string
}

func (w *bundle) key(t *testing.T, c idem.Claim) keyRow {
	t.Helper()
	k, ok := testkit.ReadKeyRow(t, w.pool, c.TenantID, c.Endpoint, c.Key)
	if !ok {
		t.Fatalf("no key row for %q", c.Key)
	}
	return keyRow{State: k.State, RecoveryPoint: k.RecoveryPoint, Generation: k.Generation, Lock: k.Lock}
}

func (w *bundle) wantKey(t *testing.T, c idem.Claim, want keyRow) {
	t.Helper()
	if diff := cmp.Diff(want, w.key(t, c)); diff != "" {
		t.Errorf("key row %q (-want +got):\n%s", c.Key, diff)
	}
}

// recorded returns the response recorded on c's completed key row, and the
// resource the key names.
func (w *bundle) recorded(t *testing.T, c idem.Claim) (idem.Response, uuid.UUID) {
	t.Helper()
	var status *int32
	var headers []byte
	var body []byte
	var resource *uuid.UUID
	var location *string
	var expires time.Time
	err := w.pool.QueryRow(context.Background(), `
		SELECT response_status, response_headers, response_body, resource_id, resource_location, expires_at
		FROM idempotency_keys WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3`,
		c.TenantID, c.Endpoint, c.Key).Scan(&status, &headers, &body, &resource, &location, &expires)
	if err != nil {
		t.Fatalf("read recorded response of %q: %v", c.Key, err)
	}
	if status == nil || resource == nil {
		t.Fatalf("key %q has no recorded response or no resource", c.Key)
	}
	res := idem.Response{Status: int(*status), Body: body}
	if err := json.Unmarshal(headers, &res.Header); err != nil {
		t.Fatalf("decode recorded headers %s: %v", headers, err)
	}
	// Location and Idempotency-Expires are stored once, in resource_location
	// and expires_at (idem's storedResponse), not among the headers.
	if location != nil {
		res.Header.Set("Location", *location)
	}
	res.Header.Set(idem.ExpiresHeader, idem.HTTPDate(expires))
	return res, *resource
}

// waitLeaseExpired waits until the lease on c's key has expired (or was
// released), so a completer may take it.
func (w *bundle) waitLeaseExpired(t *testing.T, ctx context.Context, c idem.Claim) {
	t.Helper()
	waitFor(t, ctx, w.pool, `
		SELECT coalesce(locked_until < now(), false) FROM idempotency_keys
		WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3`, c.TenantID, c.Endpoint, c.Key)
}

// snapshot returns c's whole key row as JSON, to check that something
// changed nothing at all.
func (w *bundle) snapshot(t *testing.T, c idem.Claim) string {
	t.Helper()
	return testkit.KeyRowJSON(t, w.pool, c.TenantID, c.Endpoint, c.Key)
}

// paymentRow is a payments row; NULLs read as "".
type paymentRow struct {
	ID        uuid.UUID
	Status    string
	Amount    int64
	ChargeKey string
	ChargeID  string
}

// paymentRows returns the payments of p's order.
func (w *bundle) paymentRows(t *testing.T, p payment) []paymentRow {
	t.Helper()
	return testkit.Rows[paymentRow](t, w.pool, `
		SELECT id, status, amount, charge_key, coalesce(charge_id, '')
		FROM payments WHERE tenant_id = $1 AND order_id = $2 ORDER BY created_at, id`, w.tenant, p.order.ID)
}

// onePayment returns the only payment of p's order.
func (w *bundle) onePayment(t *testing.T, p payment) paymentRow {
	t.Helper()
	rows := w.paymentRows(t, p)
	if len(rows) != 1 {
		t.Fatalf("order %s has %d payments, want 1: %+v", p.order.Reference, len(rows), rows)
	}
	return rows[0]
}

func (w *bundle) wantPaymentStatus(t *testing.T, p payment, status string) {
	t.Helper()
	if got := w.onePayment(t, p); got.Status != status {
		t.Errorf("payment of %s is %q, want %q", p.order.Reference, got.Status, status)
	}
}

// orderEvents is what the outbox says happened to an order: how many
// payment.succeeded events name it and their total. The payment's final
// transaction writes them; the order row follows them through the orders
// consumer (internal/orders), which these tests do not run.
type orderEvents struct {
	Succeeded int
	Amount    int64
}

func (w *bundle) orderOf(t *testing.T, p payment) orderEvents {
	t.Helper()
	var o orderEvents
	err := w.pool.QueryRow(context.Background(),
		`SELECT count(*), coalesce(sum((convert_from(payload, 'UTF8')::jsonb #>> '{data,amount}')::bigint), 0)
		 FROM outbox WHERE tenant_id = $1 AND event_type = 'payment.succeeded'
		   AND convert_from(payload, 'UTF8')::jsonb #>> '{data,order_id}' = $2`,
		w.tenant, p.order.ID.String()).Scan(&o.Succeeded, &o.Amount)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// --- The processor's side ---

// chargesWithKey returns the charges the simulator created under key.
func (w *bundle) chargesWithKey(key string) []processor.Charge {
	var out []processor.Charge
	for _, ch := range w.sim.Charges() {
		if ch.IdempotencyKey == key {
			out = append(out, ch)
		}
	}
	return out
}

// chargeCalls returns the POST /v1/charges calls that carried key.
func (w *bundle) chargeCalls(key string) []processorsim.Call {
	var out []processorsim.Call
	for _, c := range w.sim.Calls() {
		if c.Method == http.MethodPost && c.Path == processorsim.PathCharges && c.IdempotencyKey == key {
			out = append(out, c)
		}
	}
	return out
}

// wantPaid checks every side effect of p having been paid exactly once:
// one succeeded charge at the processor under p's derived key, the payment
// succeeded with that charge, the order paid once, and the key completed
// with a 201 that names the payment. It returns the recorded response.
func (w *bundle) wantPaid(t *testing.T, p payment) idem.Response {
	t.Helper()
	pay := w.onePayment(t, p)
	if pay.ChargeKey != p.chargeKey() {
		t.Errorf("payment of %s has charge key %q, want the derived %q", p.order.Reference, pay.ChargeKey, p.chargeKey())
	}
	charges := w.chargesWithKey(p.chargeKey())
	if len(charges) != 1 {
		t.Fatalf("the processor has %d charges for %s, want 1: %+v", len(charges), p.order.Reference, charges)
	}
	ch := charges[0]
	if ch.Status != processor.StatusSucceeded || ch.Amount != p.order.Amount || ch.Currency != p.order.Currency {
		t.Errorf("charge for %s = %+v; want a succeeded charge of %d %s", p.order.Reference, ch, p.order.Amount, p.order.Currency)
	}
	wantPay := paymentRow{ID: pay.ID, Status: payments.StatusSucceeded, Amount: p.order.Amount, ChargeKey: p.chargeKey(), ChargeID: ch.ID}
	if diff := cmp.Diff(wantPay, pay); diff != "" {
		t.Errorf("payment of %s (-want +got):\n%s", p.order.Reference, diff)
	}
	wantOrder := orderEvents{Succeeded: 1, Amount: p.order.Amount}
	if diff := cmp.Diff(wantOrder, w.orderOf(t, p)); diff != "" {
		t.Errorf("order %s (-want +got):\n%s", p.order.Reference, diff)
	}

	w.wantKey(t, p.claim, keyRow{State: "completed", RecoveryPoint: idem.RecoveryFinished, Generation: w.key(t, p.claim).Generation, Lock: "none"})
	res, resource := w.recorded(t, p.claim)
	if resource != pay.ID {
		t.Errorf("key %q names resource %s, want the payment %s", p.claim.Key, resource, pay.ID)
	}
	if res.Status != http.StatusCreated {
		t.Fatalf("key %q recorded status %d, want 201; body: %s", p.claim.Key, res.Status, res.Body)
	}
	if got, want := res.Header.Get("Location"), "/v1/payments/"+pay.ID.String(); got != want {
		t.Errorf("recorded Location = %q, want %q", got, want)
	}
	type paymentBody struct {
		ID       uuid.UUID `json:"id"`
		OrderID  uuid.UUID `json:"order_id"`
		Status   string    `json:"status"`
		ChargeID string    `json:"charge_id"`
	}
	var body paymentBody
	if err := json.Unmarshal(res.Body, &body); err != nil {
		t.Fatalf("decode recorded body %s: %v", res.Body, err)
	}
	wantBody := paymentBody{ID: pay.ID, OrderID: p.order.ID, Status: payments.StatusSucceeded, ChargeID: ch.ID}
	if diff := cmp.Diff(wantBody, body); diff != "" {
		t.Errorf("recorded body of %q (-want +got):\n%s", p.claim.Key, diff)
	}
	return res
}

// --- Waiting and logging ---

// deadline bounds a test that waits on other goroutines or processes, so
// a bug that makes a wait unbounded fails the test instead of hanging it.
// It is never compared with how long anything took.
func deadline(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls query (which returns one boolean) until it is true or ctx
// ends.
func waitFor(t *testing.T, ctx context.Context, pool *pgxpool.Pool, query string, args ...any) {
	t.Helper()
	eventually(t, ctx, query, func() bool {
		var ok bool
		if err := pool.QueryRow(ctx, query, args...).Scan(&ok); err != nil && ctx.Err() == nil {
			t.Fatalf("%s: %v", query, err)
		}
		return ok
	})
}

// eventually polls cond until it holds or ctx ends. It synchronises with
// state, never with the clock.
func eventually(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("gave up waiting for %s: %v", strings.TrimSpace(what), ctx.Err())
		case <-tick.C:
		}
	}
}
