package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/idemref/payments/internal/tooling/harness"
)

// replayedHeader is httpapi.ReplayedHeader, spelled out: the benchmark
// checks the wire, not the server's constants.
const replayedHeader = "Idempotent-Replayed"

// The mix of the soak and of the capacity's mix scenario, in percent of
// the requests: creates under fresh keys, replays of a create sent earlier
// (same key, same body), payments of created orders.
const (
	mixCreate  = 60
	mixReplay  = 25
	mixPayment = 15
)

// requestKind is the kind of a request of a mix.
type requestKind int

const (
	kindCreate requestKind = iota
	kindReplay
	kindPayment
	requestKinds
)

var requestKindNames = [requestKinds]string{"create", "replay", "payment"}

// orderAmount is what every order of the benchmark costs, and so what
// every payment pays.
const orderAmount = 2500

// load drives the load API and checks its traffic.
type load struct {
	base   string // http://host:port of the load API
	apiKey string
	runID  string
	client *http.Client
	db     *pgxpool.Pool // direct to PostgreSQL, for the checks
	seq    atomic.Int64  // makes keys and references unique

	// replayKeys were each used once at setup; replayBodies holds what
	// each answered, which every replay must repeat byte for byte.
	replayKeys   []string
	replayBodies map[string][]byte
	auth         http.Header

	timeOrderedKeys bool // -key-order time: the stored-keys benchmark mints version 7 keys
}

func newLoad(base, apiKey, runID string, db *pgxpool.Pool, conns int) *load {
	transport := &http.Transport{
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}
	return &load{
		base: base, apiKey: apiKey, runID: runID, db: db,
		client: &http.Client{Transport: transport, Timeout: 30 * time.Second},
		auth: http.Header{
			"Authorization": {"Bearer " + apiKey},
			"Content-Type":  {"application/json"},
		},
		replayBodies: map[string][]byte{},
	}
}

// fresh returns a name never used before in this database: the run id
// keeps two runs apart, the counter two requests of one run. Every key is
// built here, so "fresh" really is fresh (not a shadowed seed that sends
// one thread's keys from every thread).
func (l *load) fresh(kind string) string {
	return kind + "-" + l.runID + "-" + strconv.FormatInt(l.seq.Add(1), 10)
}

func orderBody(reference string) []byte {
	return fmt.Appendf(nil, `{"reference":%q,"customer_id":"cus_load","amount":%d,"currency":"EUR"}`, reference, orderAmount)
}

func (l *load) headers(idemKey string) http.Header {
	h := l.auth.Clone()
	if idemKey != "" {
		h.Set("Idempotency-Key", idemKey)
	}
	return h
}

// outcome is one attack's results.
type outcome struct {
	ok        int // answers as expected
	latencies []time.Duration
	elapsed   time.Duration
	// bodies of the expected answers, when the scenario keeps them.
	bodies [][]byte
}

func (r outcome) rps() float64 { return float64(r.ok) / r.elapsed.Seconds() }

// expectation checks one answer; it returns a description of what is
// wrong, or "".
type expectation func(res *vegeta.Result) string

// attack runs targeter with workers concurrent clients for d (0: until
// the targeter runs out) as fast as the server answers: each worker sends
// its next request when its previous one is answered, so concurrency is
// fixed and the rate is what the server sustains. Every answer is checked
// with expect; a single unexpected one fails the benchmark.
func (l *load) attack(name string, workers int, d time.Duration, tr vegeta.Targeter, expect expectation, keepBodies bool) (outcome, error) {
	if workers < 1 {
		return outcome{}, fmt.Errorf("%s: %d concurrent clients; want at least 1 (-c, -storm)", name, workers)
	}
	atk := vegeta.NewAttacker(
		vegeta.Client(l.client),
		vegeta.Workers(uint64(workers)),
		vegeta.MaxWorkers(uint64(workers)),
	)
	start := time.Now()
	var out outcome
	var end time.Time
	var bad []string
	for res := range atk.Attack(tr, vegeta.Rate{}, d, name) {
		if res.Error == vegeta.ErrNoTargets.Error() && res.Code == 0 {
			continue // the targeter ran out: not a request
		}
		if problem := expect(res); problem != "" {
			if len(bad) < 5 {
				bad = append(bad, problem)
			}
			continue
		}
		out.ok++
		out.latencies = append(out.latencies, res.Latency)
		if keepBodies {
			out.bodies = append(out.bodies, res.Body)
		}
		if e := res.End(); e.After(end) {
			end = e
		}
	}
	out.elapsed = end.Sub(start)
	if len(bad) > 0 {
		return out, fmt.Errorf("%s: unexpected answers, e.g.: %v", name, bad)
	}
	if out.ok == 0 {
		return out, fmt.Errorf("%s: no request was answered", name)
	}
	return out, nil
}

// status expects code, and replayed or not.
func status(code int, replayed bool) expectation {
	return func(res *vegeta.Result) string {
		got := res.Headers.Get(replayedHeader) == "true"
		if int(res.Code) == code && got == replayed {
			return ""
		}
		return fmt.Sprintf("%d %s=%t %q %s", res.Code, replayedHeader, got, res.Error, truncate(res.Body))
	}
}

func truncate(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}

// orderIDs collects the ids of created orders for the GET and payment
// scenarios that follow in the same round.
type orderIDs struct {
	mu  sync.Mutex
	ids []string
	// paid counts the ids the payment scenarios have taken: each order is
	// paid once, by the payment or by its baseline.
	paid atomic.Int64
}

func (o *orderIDs) add(bodies [][]byte) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, b := range bodies {
		var v struct{ ID string }
		if err := json.Unmarshal(b, &v); err != nil || v.ID == "" {
			return fmt.Errorf("a created order's body has no id: %s", truncate(b))
		}
		o.ids = append(o.ids, v.ID)
	}
	return nil
}

func (l *load) count(ctx context.Context, sql string, args ...any) (int, error) {
	var n int
	err := l.db.QueryRow(ctx, sql, args...).Scan(&n)
	return n, err
}

// checkRows fails unless the count of sql grew by exactly want during fn.
func (l *load) checkRows(ctx context.Context, what, sql string, fn func() (int, error)) error {
	before, err := l.count(ctx, sql)
	if err != nil {
		return err
	}
	want, err := fn()
	if err != nil {
		return err
	}
	after, err := l.count(ctx, sql)
	if err != nil {
		return err
	}
	if after-before != want {
		return fmt.Errorf("%s: %d rows were written for %d executions", what, after-before, want)
	}
	return nil
}

const (
	countOrders   = `SELECT count(*) FROM orders`
	countPayments = `SELECT count(*) FROM payments WHERE status = 'succeeded'`
)

// create sends creates under fresh keys: every answer must be an
// execution (201 without the replayed header), and the orders table must
// grow by exactly the number of executions.
func (l *load) create(ctx context.Context, workers int, d time.Duration, ids *orderIDs) (outcome, error) {
	return l.createOn(ctx, "create", "/v1/orders", true, workers, d, ids)
}

// baseline is create on the route without idempotency.
func (l *load) baseline(ctx context.Context, workers int, d time.Duration, ids *orderIDs) (outcome, error) {
	return l.createOn(ctx, "baseline", "/v1/_baseline/orders", false, workers, d, ids)
}

func (l *load) createOn(ctx context.Context, name, path string, withKey bool, workers int, d time.Duration, ids *orderIDs) (outcome, error) {
	tr := l.createTargeter(path, withKey)
	var out outcome
	err := l.checkRows(ctx, name, countOrders, func() (int, error) {
		var err error
		out, err = l.attack(name, workers, d, tr, status(http.StatusCreated, false), true)
		return out.ok, err
	})
	if err != nil {
		return out, err
	}
	err = ids.add(out.bodies)
	out.bodies = nil
	return out, err
}

// createTargeter sends creates to path, each a new order under a fresh
// key (withKey) or without one.
func (l *load) createTargeter(path string, withKey bool) vegeta.Targeter {
	url := l.base + path
	return func(t *vegeta.Target) error {
		key := ""
		if withKey {
			key = l.fresh("create")
		}
		t.Method, t.URL, t.Header, t.Body = http.MethodPost, url, l.headers(key), orderBody(l.fresh("ref"))
		return nil
	}
}

// setupReplays creates n orders under n keys, one request each, for the
// replay scenario.
func (l *load) setupReplays(ctx context.Context, n int) error {
	for range n {
		key := l.fresh("replay")
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.base+"/v1/orders", bytes.NewReader(orderBody(l.fresh("ref"))))
		if err != nil {
			return err
		}
		req.Header = l.headers(key)
		res, err := l.client.Do(req)
		if err != nil {
			return err
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			return err
		}
		if res.StatusCode != http.StatusCreated {
			return fmt.Errorf("replay setup: %d %s", res.StatusCode, truncate(body))
		}
		l.replayKeys = append(l.replayKeys, key)
		l.replayBodies[key] = body
	}
	return nil
}

// replay resends the setup's requests under their keys: every answer must
// be a replay (201 with the replayed header and a recorded body, byte for
// byte), and no order may be written.
func (l *load) replay(ctx context.Context, workers int, d time.Duration) (outcome, error) {
	tr, expect, err := l.replayTargeter()
	if err != nil {
		return outcome{}, err
	}
	var out outcome
	err = l.checkRows(ctx, "replay", countOrders, func() (int, error) {
		var err error
		out, err = l.attack("replay", workers, d, tr, expect, false)
		return 0, err
	})
	return out, err
}

// replayTargeter resends the setup's requests under their keys, in turn,
// and expects each answer to be a replay of the recorded response.
func (l *load) replayTargeter() (vegeta.Targeter, expectation, error) {
	var next atomic.Int64
	recorded := map[string]bool{}
	requests := map[string][]byte{} // the body each key was first sent with
	for _, k := range l.replayKeys {
		recorded[string(l.replayBodies[k])] = true
		var v struct{ Reference string }
		if err := json.Unmarshal(l.replayBodies[k], &v); err != nil {
			return nil, nil, err
		}
		requests[k] = orderBody(v.Reference)
	}
	tr := func(t *vegeta.Target) error {
		key := l.replayKeys[int(next.Add(1))%len(l.replayKeys)]
		t.Method, t.URL, t.Header, t.Body = http.MethodPost, l.base+"/v1/orders", l.headers(key), requests[key]
		return nil
	}
	replayed := status(http.StatusCreated, true)
	expect := func(res *vegeta.Result) string {
		if p := replayed(res); p != "" {
			return p
		}
		if !recorded[string(res.Body)] {
			return "a replay's body differs from every recorded one: " + truncate(res.Body)
		}
		return ""
	}
	return tr, expect, nil
}

// get reads the round's orders, one GET each in turn.
func (l *load) get(workers int, d time.Duration, ids *orderIDs) (outcome, error) {
	var next atomic.Int64
	tr := func(t *vegeta.Target) error {
		ids.mu.Lock()
		id := ids.ids[int(next.Add(1))%len(ids.ids)]
		ids.mu.Unlock()
		t.Method, t.URL, t.Header = http.MethodGet, l.base+"/v1/orders/"+id, l.auth
		return nil
	}
	return l.attack("get", workers, d, tr, status(http.StatusOK, false), false)
}

// payment pays the round's orders, each once, under fresh keys: every
// answer must be an execution that succeeded, and the succeeded payments
// must grow by exactly their number. It stops early if it runs out of
// unpaid orders.
func (l *load) payment(ctx context.Context, workers int, d time.Duration, ids *orderIDs) (outcome, bool, error) {
	return l.paymentOn(ctx, "payment", "/v1/payments", true, workers, d, ids)
}

// paymentBaseline is payment on the route without idempotency
// (POST /v1/_baseline/payments), paying other orders of the round.
func (l *load) paymentBaseline(ctx context.Context, workers int, d time.Duration, ids *orderIDs) (outcome, bool, error) {
	return l.paymentOn(ctx, "payment-baseline", "/v1/_baseline/payments", false, workers, d, ids)
}

func (l *load) paymentOn(ctx context.Context, name, path string, withKey bool, workers int, d time.Duration, ids *orderIDs) (outcome, bool, error) {
	var ranOut atomic.Bool
	tr := l.paymentTargeter(path, withKey, ids, &ranOut)
	var out outcome
	err := l.checkRows(ctx, name, countPayments, func() (int, error) {
		var err error
		out, err = l.attack(name, workers, d, tr, paymentSucceeded, false)
		return out.ok, err
	})
	return out, ranOut.Load(), err
}

// paymentTargeter pays ids' unpaid orders, each once, on path, under a
// fresh key (withKey) or without one; when none is left it sets ranOut
// and stops the attack.
func (l *load) paymentTargeter(path string, withKey bool, ids *orderIDs, ranOut *atomic.Bool) vegeta.Targeter {
	return func(t *vegeta.Target) error {
		i := int(ids.paid.Add(1)) - 1
		ids.mu.Lock()
		n := len(ids.ids)
		var id string
		if i < n {
			id = ids.ids[i]
		}
		ids.mu.Unlock()
		if i >= n {
			ranOut.Store(true)
			return vegeta.ErrNoTargets
		}
		body := fmt.Appendf(nil, `{"order_id":%q,"amount":%d,"currency":"EUR","payment_method":"pm_card_visa"}`, id, orderAmount)
		key := ""
		if withKey {
			key = l.fresh("pay")
		}
		t.Method, t.URL, t.Header, t.Body = http.MethodPost, l.base+path, l.headers(key), body
		return nil
	}
}

// paymentSucceeded expects a payment's execution (201, not replayed)
// that succeeded.
func paymentSucceeded(res *vegeta.Result) string {
	if p := status(http.StatusCreated, false)(res); p != "" {
		return p
	}
	var v struct{ Status string }
	if err := json.Unmarshal(res.Body, &v); err != nil || v.Status != "succeeded" {
		return "a payment did not succeed: " + truncate(res.Body)
	}
	return ""
}

// stormResult is one duplicate storm.
type stormResult struct {
	executions, replays, inProgress int
	p99                             time.Duration
}

// storm sends n identical requests under one key at once. Exactly one may
// execute; the others get its replay or 409 idempotency_key_in_use; the
// reference must exist exactly once.
func (l *load) storm(ctx context.Context, n int) (stormResult, error) {
	// Open n connections first, so the storm's requests leave together
	// instead of queueing behind TCP handshakes.
	var warmed atomic.Int64
	warm := func(t *vegeta.Target) error {
		if warmed.Add(1) > int64(n) {
			return vegeta.ErrNoTargets
		}
		t.Method, t.URL = http.MethodGet, l.base+"/healthz"
		return nil
	}
	if _, err := l.attack("storm-warmup", n, 0, warm, status(http.StatusOK, false), false); err != nil {
		return stormResult{}, err
	}

	key, ref := l.fresh("storm"), l.fresh("storm-ref")
	body, headers := orderBody(ref), l.headers(key)
	var sent atomic.Int64
	tr := func(t *vegeta.Target) error {
		if sent.Add(1) > int64(n) {
			return vegeta.ErrNoTargets
		}
		t.Method, t.URL, t.Header, t.Body = http.MethodPost, l.base+"/v1/orders", headers, body
		return nil
	}
	var out stormResult
	expect := func(res *vegeta.Result) string {
		replayed := res.Headers.Get(replayedHeader) == "true"
		switch {
		case res.Code == http.StatusCreated && !replayed:
			out.executions++
		case res.Code == http.StatusCreated:
			out.replays++
		case res.Code == http.StatusConflict && bytes.Contains(res.Body, []byte(`"idempotency_key_in_use"`)):
			out.inProgress++
		default:
			return fmt.Sprintf("%d %q %s", res.Code, res.Error, truncate(res.Body))
		}
		return ""
	}
	r, err := l.attack("storm", n, 0, tr, expect, false)
	if err != nil {
		return out, err
	}
	out.p99 = harness.Percentile(r.latencies, 99)
	if r.ok != n {
		return out, fmt.Errorf("storm: %d of %d requests answered", r.ok, n)
	}
	rows, err := l.count(ctx, `SELECT count(*) FROM orders WHERE reference = $1`, ref)
	if err != nil {
		return out, err
	}
	if out.executions != 1 || rows != 1 {
		return out, fmt.Errorf("storm: %d executions and %d orders for one key, want 1 and 1", out.executions, rows)
	}
	return out, nil
}
