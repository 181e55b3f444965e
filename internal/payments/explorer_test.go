package payments_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/events"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/inbox"
	"github.com/idemref/payments/internal/orders"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/processor/simproc"
	"github.com/idemref/payments/internal/reaper"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/processorsim"
	"github.com/idemref/payments/internal/tooling/testdb"
)

// TestExplore is the schedule explorer (T7): the payment and refund
// machines run under many interleavings of their actors (the client's
// request and its retries from other processes, the completer, the sweep,
// webhook deliveries duplicated and out of order, the orders consumer, the
// reaper, clocks, and the processor executing a held call late), on the
// real database and the real simulator. Small scenarios run every schedule
// (depth first, within a bound on preemptions), bigger ones seeded random
// schedules. After each schedule a drain lets every clock pass and every
// background worker finish, then the checker (explorer_checker_test.go)
// asserts the money invariants from the database and the simulator's
// ledger. The scheduler is in explorer_sched_test.go.
//
// The run is bounded by time and by a count of schedules:
//
//	EXPLORER_BUDGET=5m      the schedules' time (default 60s; 5s with -short)
//	EXPLORER_SCENARIO=name  run one scenario only
//	EXPLORER_SEED=n         with EXPLORER_SCENARIO: replay that random schedule
//	EXPLORER_CHOICES=0,2,1  with EXPLORER_SCENARIO: replay these decisions
//	EXPLORER_BASE_SEED=n    the first seed of the random scenarios (default: the clock)
//	EXPLORER_MUTATE_DROP_GUARDS=1  drop the status guard triggers (000012) in
//	                        the explorer's databases, to show what they prevent
//
// A failing schedule is printed with its scenario, seed and decisions, its
// trace and the warnings logged meanwhile; either variable replays it.
func TestExplore(t *testing.T) {
	cfg := explorerConfigFromEnv(t)
	// The budget is the schedules' time; setup is the databases' and
	// pools' (a template rebuilt after a migration changed takes seconds).
	start, setup := time.Now(), time.Duration(0)
	var summary []string
	totalWeight := 0
	for _, sc := range scenarios {
		if cfg.only == "" || sc.name == cfg.only {
			totalWeight += sc.weight
		}
	}
	if totalWeight == 0 {
		t.Fatalf("EXPLORER_SCENARIO=%q names no scenario", cfg.only)
	}
	for _, sc := range scenarios {
		if cfg.only != "" && sc.name != cfg.only {
			continue
		}
		t.Run(sc.name, func(t *testing.T) {
			began := time.Now()
			w := newWorld(t)
			setup += time.Since(began)
			if cfg.replay {
				r := w.replay(sc, cfg)
				t.Logf("explorer: schedule %s\n%s", r.id(), r.report())
				if r.failed() {
					t.Errorf("explorer: schedule %s failed", r.id())
				}
				return
			}
			// Each scenario gets its weight's share of what is left, so
			// one that finishes early leaves its time to the others.
			left := cfg.budget - (time.Since(start) - setup)
			share := time.Duration(float64(left) * float64(sc.weight) / float64(totalWeight))
			totalWeight -= sc.weight
			res := w.explore(sc, time.Now().Add(share), cfg)
			t.Logf("explorer: %s: %s", sc.name, res)
			summary = append(summary, fmt.Sprintf("%s %s", sc.name, res.short()))
			if res.failure != nil {
				t.Errorf("explorer: schedule %s\n%s\nreplay: EXPLORER_SCENARIO=%s %s go test -count=1 ./internal/payments/ -run 'TestExplore$' -v",
					res.failure.id(), res.failure.report(), sc.name, res.failure.replayVars())
			}
		})
	}
	if !cfg.replay {
		t.Logf("explorer: %s in %s (base seed %d)", strings.Join(summary, "; "), time.Since(start).Round(time.Second), cfg.baseSeed)
	}
}

// Times of the services under exploration. No wall-clock time may decide
// anything during a schedule, so every lease and window is far longer
// than a schedule takes; only clock actors make them pass, by moving the
// rows' timestamps.
const (
	explorerLease  = time.Hour
	explorerSettle = time.Hour
	// explorerTimeout bounds one processor call; the transport never waits.
	explorerTimeout = time.Hour
)

// orderAmount is what each schedule's order costs, in cents.
const orderAmount = 5000

type explorerConfig struct {
	budget time.Duration
	only   string
	// replay: run one schedule, of these decisions and this seed.
	replay   bool
	choices  []int
	seed     uint64
	seeded   bool
	baseSeed uint64
	// scale multiplies each scenario's cap on schedules with the budget.
	scale float64
}

const defaultBudget = 60 * time.Second

func explorerConfigFromEnv(t *testing.T) explorerConfig {
	cfg := explorerConfig{budget: defaultBudget, only: os.Getenv("EXPLORER_SCENARIO"), baseSeed: uint64(time.Now().UnixNano())}
	if testing.Short() {
		cfg.budget = 5 * time.Second
	}
	if v := os.Getenv("EXPLORER_BUDGET"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("EXPLORER_BUDGET=%q: want a positive duration such as 5m", v)
		}
		cfg.budget = d
	}
	cfg.scale = cfg.budget.Seconds() / defaultBudget.Seconds()
	parseSeed := func(name string) (uint64, bool) {
		v := os.Getenv(name)
		if v == "" {
			return 0, false
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want an unsigned integer", name, v)
		}
		return n, true
	}
	if n, ok := parseSeed("EXPLORER_BASE_SEED"); ok {
		cfg.baseSeed = n
	}
	if n, ok := parseSeed("EXPLORER_SEED"); ok {
		cfg.seed, cfg.seeded, cfg.replay = n, true, true
	}
	if v := os.Getenv("EXPLORER_CHOICES"); v != "" {
		cfg.replay = true
		for f := range strings.SplitSeq(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 0 {
				t.Fatalf("EXPLORER_CHOICES=%q: want decisions such as 0,2,1", v)
			}
			cfg.choices = append(cfg.choices, n)
		}
	}
	if cfg.replay && cfg.only == "" {
		t.Fatal("EXPLORER_SEED and EXPLORER_CHOICES replay one scenario's schedule: set EXPLORER_SCENARIO too")
	}
	return cfg
}

// --- The world: one database, one simulator, three API processes ---

type world struct {
	t   *testing.T
	ctx context.Context
	// pool is not hooked: fixtures, clocks, the drain and the checker.
	pool *pgxpool.Pool
	sim  *processorsim.Simulator
	tr   *transport
	log  *slog.Logger
	// The API processes: api1 takes the client's first request and the
	// webhooks, api2 its retries, worker runs the completer, the sweep,
	// the reaper and the orders consumer. Each has its own hooked pool.
	api1, api2, worker *process

	mu  sync.Mutex
	cur *run // the schedule running, for the log handler
	// stuck: a schedule got stuck, and an actor of it may still hold a
	// connection.
	stuck bool
}

type process struct {
	pool *pgxpool.Pool
	svc  *payments.Service
}

// newWorld gives a scenario a database of its own, so the completer, the
// sweep and the reaper (which act on every tenant) see only its schedules;
// each schedule has a tenant and an order of its own, and is drained
// before the next starts.
func newWorld(t *testing.T) *world {
	pool, dbURL := testdb.NewPool(t)
	w := &world{t: t, ctx: t.Context(), pool: pool}
	installExplorerLog(t, pool)
	if os.Getenv("EXPLORER_MUTATE_DROP_GUARDS") == "1" {
		dropGuards(t, pool)
	}
	w.tr = &transport{}
	w.sim = processorsim.New(processorsim.Config{HoldTimer: w.tr.holdTimer})
	w.tr.sim = w.sim
	// Events are recorded only while webhooks are on; the simulator's own
	// deliveries go to a sink, and the schedule's deliverers hand the
	// recorded events to the service themselves.
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(sink.Close)
	t.Cleanup(w.sim.Reset) // before the sink closes: no delivery is left running
	w.sim.SetWebhooks(processorsim.WebhookConfig{URL: sink.URL})
	w.log = slog.New(&alarmHandler{w: w})
	w.api1, w.api2, w.worker = w.process(dbURL), w.process(dbURL), w.process(dbURL)
	return w
}

func (w *world) process(dbURL string) *process {
	pool, err := hookedPool(w.ctx, dbURL)
	if err != nil {
		w.t.Fatal(err)
	}
	// A pool closes once every connection is back, which a stuck actor's
	// never is: then the failing test leaves it open rather than hang.
	w.t.Cleanup(func() {
		if !w.stuck {
			pool.Close()
		}
	})
	// The key budget (R6) stays on, as in production: its count of a
	// tenant's keys is one more point where an actor parks.
	store := idem.NewStore(pool, idem.Config{Lease: explorerLease})
	proc := simproc.NewClientWithTransport("http://processor.invalid", explorerTimeout, w.tr)
	return &process{pool: pool, svc: payments.NewService(pool, store, proc, httpapi.Renderer{}, w.log, payments.Config{SettleWindow: explorerSettle})}
}

// --- One schedule ---

type run struct {
	w   *world
	sc  *scenario
	ctx context.Context
	// plan fixes the first decisions (a replay, the search's prefix);
	// rng makes the rest in random mode.
	plan    []int
	rng     *rand.Rand
	seed    uint64
	choices []choice

	actors []*actor
	last   *actor
	steps  int
	stuck  *actor
	held   []*heldCall
	faults int

	tenant uuid.UUID
	order  orders.Order
	keys   []*keyRef
	// answers are the final answers each key's requests got.
	answers map[*keyRef][]answer
	snap    snapshot
	// webhooksDone and consumed are the primary deliverer's and consumer's
	// progress, which the drain continues.
	webhooksDone map[string]bool
	consumed     int
	// webhooksLost are the events the processor gave up on: no deliverer
	// and no drain ever delivers them.
	webhooksLost map[string]bool

	mu       sync.Mutex
	trace    []string
	failures []string
	logs     []string
}

// keyRef is one client operation and its idempotency key, shared by the
// request and its retries.
type keyRef struct {
	name   string
	refund bool
	claim  idem.Claim
	pay    payments.PayInput
	// A refund's claim names its payment, known once the payment
	// succeeded: resolved then.
	amount    int64
	paymentID uuid.UUID
	resolved  bool
}

type answer struct {
	who string
	res idem.Response
}

// snapshot is what the scheduler knows of the database before a decision.
type snapshot struct {
	outbox     int
	inProgress int
	liveLeases int
	// sweeps counts payments and refunds whose sweep is pending, or whose
	// call may still be settling.
	sweeps int
	// paid is the order's succeeded payment (uuid.Nil: none yet).
	paid uuid.UUID
	// refundMarks is each refund key's count of marked calls.
	refundMarks map[string]int
}

func (w *world) newRun(sc *scenario, plan []int, seed uint64, random bool) *run {
	r := &run{w: w, sc: sc, ctx: w.ctx, plan: plan, seed: seed, answers: map[*keyRef][]answer{},
		webhooksDone: map[string]bool{}, webhooksLost: map[string]bool{}}
	if random {
		r.rng = newRNG(seed)
	}
	w.mu.Lock()
	w.cur = r
	w.mu.Unlock()
	w.sim.Reset()
	var err error
	if r.tenant, _, err = tenants.Create(w.ctx, w.pool, "explorer "+uuid.NewString()); err != nil {
		w.t.Fatal(err)
	}
	if r.order, err = orders.Create(w.ctx, w.pool, r.tenant, orders.CreateInput{
		Reference: "order-1", CustomerID: "cus_1", Amount: orderAmount, Currency: "EUR",
	}); err != nil {
		w.t.Fatal(err)
	}
	return r
}

// execute runs one schedule of sc to its end, drains it and checks it.
func (w *world) execute(sc *scenario, plan []int, seed uint64, random bool) *run {
	r := w.newRun(sc, plan, seed, random)
	sc.build(r)
	r.loop()
	r.stop()
	if r.stuck != nil {
		w.stuck = true
		w.t.Fatalf("explorer: schedule %s is stuck and cannot be drained\n%s", r.id(), r.report())
	}
	// After a failure too: the report then shows every invariant broken.
	r.drain()
	r.check()
	return r
}

// refreshSQL reads the snapshot, and keeps every short hold short of
// passing on its own: a key released for a second (a settle poll, a
// processor's Retry-After) or a sweep due again in seconds waits for a
// clock actor like every longer one, so wall-clock time between two steps
// decides nothing. (A data-modifying WITH runs whatever the SELECT reads.)
const refreshSQL = `
WITH held AS (
    UPDATE idempotency_keys SET locked_until = now() + interval '1 hour'
    WHERE tenant_id = $1 AND state = 'in_progress'
      AND locked_until > now() AND locked_until < now() + interval '30 seconds'
), payment_sweeps AS (
    UPDATE payments SET sweep_at = now() + interval '1 hour'
    WHERE tenant_id = $1 AND sweep_at > now() AND sweep_at < now() + interval '30 seconds'
), refund_sweeps AS (
    UPDATE refunds SET sweep_at = now() + interval '1 hour'
    WHERE tenant_id = $1 AND sweep_at > now() AND sweep_at < now() + interval '30 seconds'
)
SELECT (SELECT count(*) FROM outbox WHERE tenant_id = $1),
       (SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1 AND state = 'in_progress'),
       (SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1 AND state = 'in_progress' AND locked_until > now()),
       (SELECT count(*) FROM payments WHERE tenant_id = $1 AND (sweep_at > now() OR status = 'charge_sent'))
         + (SELECT count(*) FROM refunds WHERE tenant_id = $1 AND (sweep_at > now() OR status = 'refund_sent')),
       coalesce((SELECT id FROM payments WHERE tenant_id = $1 AND status = 'succeeded'), '00000000-0000-0000-0000-000000000000'),
       (SELECT jsonb_object_agg(refund_key, refund_calls) FROM refunds WHERE tenant_id = $1)`

func (r *run) refresh() {
	s := &r.snap
	s.refundMarks = nil
	if err := r.w.pool.QueryRow(r.w.ctx, refreshSQL, r.tenant).Scan(&s.outbox, &s.inProgress, &s.liveLeases, &s.sweeps, &s.paid, &s.refundMarks); err != nil {
		r.fail("read the snapshot: %v", err)
	}
}

func (r *run) note(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trace = append(r.trace, fmt.Sprintf(format, args...))
}

func (r *run) fail(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}

func (r *run) failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.failures) > 0
}

// id names the schedule as the failure line does.
func (r *run) id() string {
	seed := "none"
	if r.rng != nil {
		seed = strconv.FormatUint(r.seed, 10)
	}
	return fmt.Sprintf("%s seed=%s choices=%s", r.sc.name, seed, r.choiceList())
}

func (r *run) choiceList() string {
	picks := make([]string, len(r.choices))
	for i, c := range r.choices {
		picks[i] = strconv.Itoa(c.pick)
	}
	return strings.Join(picks, ",")
}

func (r *run) replayVars() string {
	if r.rng != nil {
		return fmt.Sprintf("EXPLORER_SEED=%d", r.seed)
	}
	return "EXPLORER_CHOICES=" + r.choiceList()
}

// report is a schedule's failures, trace and the warnings logged.
func (r *run) report() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, f := range r.failures {
		fmt.Fprintf(&b, "FAIL %s\n", f)
	}
	b.WriteString("trace:\n")
	for _, line := range r.trace {
		fmt.Fprintf(&b, "  %s\n", line)
	}
	if len(r.logs) > 0 {
		b.WriteString("logged:\n")
		for _, line := range r.logs {
			fmt.Fprintf(&b, "  %s\n", line)
		}
	}
	return b.String()
}

// --- Exploration ---

type exploreResult struct {
	schedules  int
	complete   bool // every schedule of an exhaustive scenario ran
	exhaustive bool
	took       time.Duration
	failure    *run
}

func (e exploreResult) String() string {
	mode := "random"
	if e.exhaustive {
		mode = "exhaustive, cut short by the budget"
		if e.complete {
			mode = "exhaustive, complete"
		}
	}
	return fmt.Sprintf("%d schedules (%s) in %s", e.schedules, mode, e.took.Round(time.Millisecond))
}

func (e exploreResult) short() string {
	s := strconv.Itoa(e.schedules)
	if e.complete {
		s += " (all)"
	}
	if e.failure != nil {
		s += " FAILED"
	}
	return s
}

// explore runs sc's schedules until they are all done (exhaustive), its
// cap, its deadline, or the first failure.
func (w *world) explore(sc *scenario, deadline time.Time, cfg explorerConfig) exploreResult {
	start := time.Now()
	res := exploreResult{exhaustive: sc.exhaustive}
	limit := max(1, int(float64(sc.cap)*cfg.scale))
	var plan []int
	for res.schedules < limit && time.Now().Before(deadline) {
		seed := cfg.baseSeed + uint64(res.schedules)
		r := w.execute(sc, plan, seed, !sc.exhaustive)
		res.schedules++
		if r.failed() {
			res.failure = r
			break
		}
		if sc.exhaustive {
			next, ok := nextPlan(r.choices, sc.preemptions)
			if !ok {
				res.complete = true
				break
			}
			plan = next
		}
	}
	res.took = time.Since(start)
	return res
}

// replay runs the one schedule that EXPLORER_CHOICES or EXPLORER_SEED
// names: the decisions given, then the seed's (or option 0).
func (w *world) replay(sc *scenario, cfg explorerConfig) *run {
	return w.execute(sc, cfg.choices, cfg.seed, cfg.seeded)
}

// --- Actors ---

// payKey is the client's payment of the schedule's order under key name.
func (r *run) payKey(name string) *keyRef {
	in := payments.PayInput{OrderID: r.order.ID, Amount: r.order.Amount, Currency: r.order.Currency, PaymentMethod: processorsim.PaymentMethodVisa}
	fp, err := idem.Fingerprint(payments.EndpointPay, nil, in)
	if err != nil {
		r.w.t.Fatal(err)
	}
	k := &keyRef{name: name, pay: in, resolved: true,
		claim: idem.Claim{TenantID: r.tenant, Endpoint: payments.EndpointPay, Key: name, Fingerprint: fp}}
	r.keys = append(r.keys, k)
	return k
}

// refundKey is a refund of amount of the order's payment under key name.
func (r *run) refundKey(name string, amount int64) *keyRef {
	k := &keyRef{name: name, refund: true, amount: amount}
	r.keys = append(r.keys, k)
	return k
}

// resolve names a refund's payment: the order's succeeded one.
func (r *run) resolve(k *keyRef) {
	if k.resolved {
		return
	}
	var id uuid.UUID
	if err := r.w.pool.QueryRow(r.w.ctx, `SELECT id FROM payments WHERE tenant_id = $1 AND status = 'succeeded'`, r.tenant).Scan(&id); err != nil {
		r.fail("find the payment to refund: %v", err)
		return
	}
	body := struct {
		Amount int64 `json:"amount"`
	}{k.amount}
	fp, err := idem.Fingerprint(payments.EndpointRefund, map[string]string{"id": id.String()}, body)
	if err != nil {
		r.fail("fingerprint: %v", err)
		return
	}
	k.paymentID, k.resolved = id, true
	k.claim = idem.Claim{TenantID: r.tenant, Endpoint: payments.EndpointRefund, Key: k.name, Fingerprint: fp}
}

// request is the client sending k to process p: its first request or a
// retry (another process, the same claim). A refund waits for its payment
// to have succeeded, as a client does.
func (r *run) request(name string, p *process, k *keyRef) {
	var ready func() bool
	if k.refund {
		ready = func() bool { return k.resolved || r.snap.paid != uuid.Nil }
	}
	r.add(name, ready, func(ctx context.Context) error {
		if k.refund {
			if err := yieldPoint(ctx, "request", true); err != nil {
				return nil
			}
			r.resolve(k)
		}
		res, err := r.send(ctx, p, k)
		r.answered(name, k, res, err)
		return nil
	})
}

// send is one request of k to p.
func (r *run) send(ctx context.Context, p *process, k *keyRef) (idem.Response, error) {
	if k.refund {
		res, _, err := p.svc.Refund(ctx, k.claim, k.paymentID, k.amount)
		return res, err
	}
	res, _, err := p.svc.Pay(ctx, k.claim, k.pay)
	return res, err
}

// answered records what a request got: a final answer, to compare with
// the key's recorded response, or an error, which must be one a client is
// told to retry after.
func (r *run) answered(who string, k *keyRef, res idem.Response, err error) {
	switch {
	case err == nil:
		r.answers[k] = append(r.answers[k], answer{who: who, res: res})
		r.note("    %s: %s answered %d", who, k.name, res.Status)
	case errors.Is(err, errAborted):
	case expected(err):
		r.note("    %s: %s: %v", who, k.name, err)
	default:
		r.fail("%s: %s: %v", who, k.name, err)
	}
}

// paidUpFront pays the order before the schedule starts, without faults,
// for scenarios about refunds.
func (r *run) paidUpFront() {
	k := r.payKey("pay-1")
	res, err := r.send(r.ctx, r.w.api1, k)
	r.answered("fixture", k, res, err)
}

// completer is one pass of p's completer: takeovers of expired keys, then
// the sweep.
func (r *run) completer(name string, p *process) {
	r.add(name, nil, func(ctx context.Context) error {
		payments.NewCompleter(p.svc, time.Hour).RunOnce(ctx)
		return nil
	})
}

// sweeper is one pass of p's reconciliation sweep alone.
func (r *run) sweeper(name string, p *process) {
	r.add(name, nil, func(ctx context.Context) error {
		if _, err := p.svc.Sweep(ctx, 20); err != nil && !expected(err) && !errors.Is(err, errAborted) {
			r.fail("%s: %v", name, err)
		}
		return nil
	})
}

// reaper is one pass of the reaper over p's pool.
func (r *run) reaper(name string, p *process) {
	r.add(name, nil, func(ctx context.Context) error {
		if _, err := reaper.New(p.pool, reaper.Config{Logger: r.w.log}).RunOnce(ctx); err != nil && !errors.Is(err, errAborted) {
			r.fail("%s: %v", name, err)
		}
		return nil
	})
}

// webhooks delivers the processor's events to p, each once: in order, or
// in an order the schedule picks. The primary deliverer's progress is the
// run's, and the drain delivers what it left; any other is a duplicate
// delivery of every event. While the scenario's lostWebhooks last, the
// primary deliverer may find that the processor gave up on the event it
// picked (every attempt failed, as a receiver that was down for the whole
// retry schedule sees it): it is never delivered, by anyone.
func (r *run) webhooks(name string, p *process, primary, anyOrder bool) {
	done := map[string]bool{}
	if primary {
		done = r.webhooksDone
	}
	pending := func() []processor.Event {
		var out []processor.Event
		for _, ev := range r.w.sim.Events() {
			if !done[ev.ID] && !r.webhooksLost[ev.ID] {
				out = append(out, ev)
			}
		}
		return out
	}
	r.add(name, func() bool { return len(pending()) > 0 }, func(ctx context.Context) error {
		for {
			if err := yieldPoint(ctx, "deliver", true); err != nil {
				return nil
			}
			evs := pending()
			ev := evs[0]
			if anyOrder {
				ev = evs[r.choose(len(evs), kindPick, false)]
			}
			done[ev.ID] = true
			if primary && len(r.webhooksLost) < r.sc.lostWebhooks && r.choose(2, kindFault, false) == 1 {
				r.webhooksLost[ev.ID] = true
				r.note("    %s %s %s: lost, never delivered", ev.Type, ev.Data.Object.ID, ev.ID)
				continue
			}
			r.note("    %s %s %s", ev.Type, ev.Data.Object.ID, ev.ID)
			if _, err := p.svc.HandleProcessorEvent(ctx, ev); err != nil && !errors.Is(err, errAborted) {
				r.fail("%s: %s: %v", name, ev.ID, err)
			}
		}
	})
}

// consumer applies the outbox's events to the orders in outbox order, as
// the orders consumer does (internal/consumer, orders.ApplyEvent): the
// inbox row and the effect in one transaction. The primary consumer's
// progress is the run's; any other delivers every event once more.
func (r *run) consumer(name string, p *process, primary bool) {
	own := 0
	cursor := &own
	if primary {
		cursor = &r.consumed
	}
	r.add(name, func() bool { return *cursor < r.snap.outbox }, func(ctx context.Context) error {
		for {
			if err := yieldPoint(ctx, "consume", true); err != nil {
				return nil
			}
			if err := r.consumeNext(ctx, p.pool, cursor); err != nil && !errors.Is(err, errAborted) {
				r.fail("%s: %v", name, err)
			}
		}
	})
}

// consumeNext applies the outbox row at *cursor, and moves the cursor on
// once its transaction committed.
func (r *run) consumeNext(ctx context.Context, pool *pgxpool.Pool, cursor *int) error {
	err := db.WithTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
		var id uuid.UUID
		var payload []byte
		if err := tx.QueryRow(ctx, `SELECT id, payload FROM outbox WHERE tenant_id = $1 ORDER BY seq OFFSET $2 LIMIT 1`,
			r.tenant, *cursor).Scan(&id, &payload); err != nil {
			return err
		}
		fresh, err := inbox.Record(ctx, tx, r.tenant, orders.ConsumerName, events.Source, id.String())
		if err != nil || !fresh {
			return err
		}
		var ev events.Envelope
		if err := json.Unmarshal(payload, &ev); err != nil {
			return err
		}
		r.note("    apply %s %s", ev.Type, ev.ID)
		return orders.ApplyEvent(ctx, tx, ev)
	})
	if err == nil {
		*cursor++
	}
	return err
}

// clockLevel is how much time a clock actor lets pass. Each level implies
// the ones before it, as the production settings do: a lease (60 s) is
// shorter than the settle window (2 min), which is shorter than a key's
// horizons (24 h).
type clockLevel int

const (
	// clockLeases: every lease and hold ends (a crashed or stalled
	// attempt's, a settle poll's).
	clockLeases clockLevel = iota
	// clockSettle: every call's settle window passes, and every sweep
	// becomes due.
	clockSettle
	// clockHorizons: the horizons set at each unfinished key's claim
	// pass (an outage longer than the TTL).
	clockHorizons
)

func (c clockLevel) String() string {
	return [...]string{"leases expire", "settle window passes", "claim horizons pass"}[c]
}

// clock lets the time of c pass, once, when there is something for it to
// pass on.
func (r *run) clock(name string, c clockLevel) {
	ready := func() bool {
		switch c {
		case clockLeases:
			return r.snap.liveLeases > 0
		case clockSettle:
			return (r.snap.inProgress > 0 || r.snap.sweeps > 0) && !r.refundInFlight()
		default:
			return r.snap.inProgress > 0 && !r.refundInFlight()
		}
	}
	r.add(name, ready, func(ctx context.Context) error {
		if err := yieldPoint(ctx, c.String(), true); err != nil {
			return nil
		}
		return r.advance(c)
	})
}

// advance lets the time of c pass for the schedule's rows, by moving their
// timestamps back (the database's clock is the one every rule reads).
// Expired leases get distinct times in key order, so the completer takes
// keys over in the same order on every replay.
func (r *run) advance(c clockLevel) error {
	b := &pgx.Batch{}
	if c >= clockHorizons {
		b.Queue(`UPDATE idempotency_keys SET created_at = created_at - interval '4 days', expires_at = now(), retain_until = now()
			WHERE tenant_id = $1 AND state = 'in_progress'`, r.tenant)
	}
	if c >= clockSettle {
		shift := 2 * explorerSettle.Seconds()
		b.Queue(`UPDATE payments SET charge_sent_at = charge_sent_at - make_interval(secs => $2),
			sweep_at = CASE WHEN sweep_at > now() THEN now() ELSE sweep_at END
			WHERE tenant_id = $1 AND (charge_sent_at IS NOT NULL OR sweep_at IS NOT NULL)`, r.tenant, shift)
		b.Queue(`UPDATE refunds SET refund_sent_at = refund_sent_at - make_interval(secs => $2),
			sweep_at = CASE WHEN sweep_at > now() THEN now() ELSE sweep_at END
			WHERE tenant_id = $1 AND (refund_sent_at IS NOT NULL OR sweep_at IS NOT NULL)`, r.tenant, shift)
	}
	b.Queue(`UPDATE idempotency_keys k SET locked_until = now() - make_interval(secs => o.n / 1000.0)
		FROM (SELECT endpoint, idem_key, row_number() OVER (ORDER BY created_at, idem_key) AS n
		      FROM idempotency_keys WHERE tenant_id = $1 AND state = 'in_progress' AND locked_until > now()) o
		WHERE k.tenant_id = $1 AND k.endpoint = o.endpoint AND k.idem_key = o.idem_key`, r.tenant)
	return r.w.pool.SendBatch(r.w.ctx, b).Close()
}

// --- Scenarios ---

type scenario struct {
	name string
	// exhaustive: every schedule, depth first, with at most preemptions
	// switches away from an actor inside an operation (negative: any
	// number); otherwise seeded random schedules.
	exhaustive  bool
	preemptions int
	// The faults a call may take, and how many calls of a schedule may
	// take one.
	postFaults, getFaults []fault
	maxFaults             int
	// lostWebhooks is how many events of a schedule the processor may
	// give up on, never delivered (the primary deliverer decides).
	lostWebhooks int
	// weight is the scenario's share of the budget, cap its most
	// schedules at the default budget.
	weight, cap int
	build       func(r *run)
}

var scenarios = []*scenario{
	{
		// A charge whose answer is lost, held or unreadable, the webhook
		// that reports it and the completer.
		name: "charge-webhook-completer", exhaustive: true, preemptions: 1,
		postFaults: []fault{faultLate, faultLost, faultMalformed}, maxFaults: 1,
		weight: 4, cap: 20000,
		build: func(r *run) {
			k := r.payKey("pay-1")
			r.request("pay", r.w.api1, k)
			r.webhooks("webhook", r.w.api1, true, false)
			r.completer("completer", r.w.worker)
			r.clock("clock-settle", clockSettle)
		},
	},
	{
		// The client retries from another process while the first call is
		// held, the window passes and the webhook arrives: a resend after
		// the payment was settled (defect 1).
		name: "charge-retry-webhook", exhaustive: true, preemptions: 1,
		postFaults: []fault{faultLate, faultLost, faultServerError}, maxFaults: 1,
		weight: 5, cap: 20000,
		build: func(r *run) {
			k := r.payKey("pay-1")
			r.request("pay", r.w.api1, k)
			r.request("retry", r.w.api2, k)
			r.webhooks("webhook", r.w.api1, true, false)
			r.clock("clock-settle", clockSettle)
		},
	},
	{
		// A processor that ignores keys: a late call and a resend are two
		// charges, and the sweep must refund one.
		name: "ignore-keys", exhaustive: true, preemptions: 1,
		postFaults: []fault{faultLate, faultLost}, maxFaults: 1,
		weight: 5, cap: 20000,
		build: func(r *run) {
			r.w.sim.SetIgnoreIdempotencyKeys(true)
			k := r.payKey("pay-1")
			r.request("pay", r.w.api1, k)
			r.request("retry", r.w.api2, k)
			r.webhooks("webhook", r.w.api1, true, false)
			r.clock("clock-settle", clockSettle)
		},
	},
	{
		// One charge call lands twice at a processor that ignores keys
		// (issue 27, part 4): a resumed attempt's lookup finds both
		// charges, the webhook of the one it keeps settles the payment
		// before the attempt records it, and the other's webhook may never
		// come. The lookup's knowledge of the second charge is then all
		// that can get it refunded.
		name: "double-charge-webhook", exhaustive: true, preemptions: 1,
		postFaults: []fault{faultDoubled}, maxFaults: 1, lostWebhooks: 1,
		weight: 3, cap: 20000,
		build: func(r *run) {
			r.w.sim.SetIgnoreIdempotencyKeys(true)
			k := r.payKey("pay-1")
			r.request("pay", r.w.api1, k)
			r.request("retry", r.w.api2, k)
			r.webhooks("webhook", r.w.api1, true, false)
		},
	},
	{
		// The completer finishes a payment after the horizons set at its
		// claim passed and the reaper runs; the drain's last retry is the
		// client's (defect 2).
		name: "horizons-reaper", exhaustive: true, preemptions: 0,
		postFaults: []fault{faultLost, faultLate, faultServerError}, maxFaults: 1,
		weight: 1, cap: 20000,
		build: func(r *run) {
			k := r.payKey("pay-1")
			r.request("pay", r.w.api1, k)
			r.clock("clock-horizons", clockHorizons)
			r.completer("completer", r.w.worker)
			r.reaper("reaper", r.w.worker)
		},
	},
	{
		// A refund of a settled payment and its retry, with every fault a
		// refund call can meet.
		name: "refund-retry", exhaustive: true, preemptions: 1,
		postFaults: []fault{faultLate, faultLost, faultMalformed, faultRateLimited}, maxFaults: 1,
		weight: 2, cap: 20000,
		build: func(r *run) {
			r.paidUpFront()
			k := r.refundKey("refund-1", 2000)
			r.request("refund", r.w.api1, k)
			r.request("refund-retry", r.w.api2, k)
			r.clock("clock-settle", clockSettle)
		},
	},
	{
		// Refunds against a processor that ignores keys, with lookups that
		// fail or answer {}: only the settle window and the lookup stand
		// between a lost answer and a second refund.
		name: "refund-ignore-keys", exhaustive: true, preemptions: 0,
		postFaults: []fault{faultLate, faultLost}, getFaults: []fault{faultReset, faultMalformed}, maxFaults: 2,
		weight: 1, cap: 20000,
		build: func(r *run) {
			r.w.sim.SetIgnoreIdempotencyKeys(true)
			r.paidUpFront()
			k := r.refundKey("refund-1", 2000)
			r.request("refund", r.w.api1, k)
			r.request("refund-retry", r.w.api2, k)
			r.clock("clock-settle", clockSettle)
		},
	},
	{
		// Everything at once, in random schedules: either processor mode,
		// two refunds with retries, duplicated, reordered and lost webhooks,
		// duplicated events, two completers, the sweep, the reaper, every
		// clock.
		name: "random", postFaults: []fault{faultLate, faultLost, faultMalformed, faultServerError, faultRateLimited, faultDoubled},
		getFaults: []fault{faultReset, faultMalformed}, maxFaults: 3, lostWebhooks: 1,
		weight: 6, cap: 4000,
		build: func(r *run) {
			if r.choose(2, kindPick, false) == 1 {
				r.w.sim.SetIgnoreIdempotencyKeys(true)
				r.note("processor ignores idempotency keys")
			}
			pay := r.payKey("pay-1")
			r.request("pay", r.w.api1, pay)
			r.request("pay-retry", r.w.api2, pay)
			r.request("pay-retry-2", r.w.api1, pay)
			refund1 := r.refundKey("refund-1", 2000)
			r.request("refund-1", r.w.api1, refund1)
			r.request("refund-1-retry", r.w.api2, refund1)
			refund2 := r.refundKey("refund-2", 3000)
			r.request("refund-2", r.w.api2, refund2)
			r.completer("completer", r.w.worker)
			r.completer("completer-2", r.w.api2)
			r.sweeper("sweep", r.w.api1)
			r.webhooks("webhook", r.w.api1, true, false)
			r.webhooks("webhook-dup", r.w.api2, false, true)
			r.consumer("consumer", r.w.worker, true)
			r.consumer("consumer-dup", r.w.api1, false)
			r.reaper("reaper", r.w.worker)
			r.clock("clock-lease", clockLeases)
			r.clock("clock-lease-2", clockLeases)
			r.clock("clock-settle", clockSettle)
			r.clock("clock-settle-2", clockSettle)
			r.clock("clock-horizons", clockHorizons)
		},
	},
}
