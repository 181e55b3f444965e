package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemref/payments/internal/tooling/harness"
	"github.com/idemref/payments/internal/tooling/processorsim"
)

// The load is what a well-behaved client of the API does while faults hit
// the deployment: one Idempotency-Key per logical operation, the same key
// and the same body on every attempt, and retries only on answers that
// leave the operation open. Whatever a client is finally told is written
// in a ledger, which the checker (check.go) holds against the database and
// the processor.

// loadConfig says who the clients are and what they send.
type loadConfig struct {
	// APIs are the base URLs (http://host:port) of the API processes. A
	// client takes the next one on every attempt, as a load balancer
	// would, so a retry after a process died reaches a live one.
	APIs []string
	// APIKey is the tenant's bearer token.
	APIKey string
	// Clients is how many clients run at once; each has one operation in
	// flight at a time.
	Clients int
	// Seed drives every random choice (amounts, jitter); keys and
	// references also carry it.
	Seed int64
	// Payments makes each client pay the order it created; without it
	// the load only creates orders.
	Payments bool
	// DeclineEvery makes every Nth payment use a card the processor
	// declines (0: none), so declines are recorded and replayed under
	// faults too.
	DeclineEvery int
	// RetryFor is how long, once the load stops, clients keep retrying the
	// operations that have no final answer yet.
	RetryFor time.Duration
}

const (
	// loadAttemptTimeout bounds one attempt. It is about PROCESSOR_TIMEOUT
	// (10 s by default), so a payment whose processor call hangs may be
	// cut off just before the API's own 503: a client that gives up first
	// is the ordinary "outcome unknown" case, and the retry resolves it.
	loadAttemptTimeout = 10 * time.Second
	// loadMaxRetryAfter caps the server's Retry-After. The API asks for
	// 1 s when a key is busy and more when a rate limit is hit; a client
	// that kept probing at least every 2 s is what lets Outage measure an
	// outage to within a couple of seconds.
	loadMaxRetryAfter = 2 * time.Second
	// Without a Retry-After, the wait before retry n is between half and
	// all of loadBaseBackoff·2ⁿ⁻¹, at most loadMaxBackoff: short, since a
	// chaos run wants to see the service recover, and jittered, so
	// clients that failed together do not come back together.
	loadBaseBackoff = 50 * time.Millisecond
	loadMaxBackoff  = time.Second
	// loadReplayedHeader marks a replayed answer, spelled out: the
	// clients check the wire, not the server's constants.
	loadReplayedHeader = "Idempotent-Replayed"
	// loadKeyInUse is the 409 that says another attempt holds the key:
	// the only 409 to retry.
	loadKeyInUse = "idempotency_key_in_use"
	// loadCardDeclined is the 402 of a declined card: a final answer.
	loadCardDeclined = "card_declined"
)

// opKind is what an operation creates.
type opKind string

const (
	kindOrder   opKind = "order"
	kindPayment opKind = "payment"
)

// loadOp is one logical operation as its client experienced it: what it
// sent, and every answer it got.
type loadOp struct {
	Key  string
	Kind opKind
	// Reference is the order's reference; a payment carries the reference
	// of the order it pays.
	Reference string
	// OrderID is, for a payment, the order it pays.
	OrderID       string
	Amount        int64
	Currency      string
	PaymentMethod string // payments only

	Attempts int
	// Statuses has one entry per attempt, in order: the HTTP status, or 0
	// when no answer arrived (network error, timeout).
	Statuses []int
	// Final is the status of the final answer; 0 while there is none.
	Final int
	// Code is the problem code of a final error answer.
	Code string
	// ID is what the final answer named: the order's id, or the
	// payment's (a 402 names it in payment_id).
	ID string
	// PaymentStatus is the payment's status as acknowledged: the 201's
	// status, or "declined" for a 402 card_declined.
	PaymentStatus string
	ChargeID      string
	// Replayed says the final answer carried Idempotent-Replayed: true.
	Replayed bool
	// AfterUnknown says an attempt before the final answer got a 5xx or
	// no answer at all: the client could not tell whether it had run.
	AfterUnknown bool
	// FirstAttempt is when the first attempt started, AckedAt when the
	// acknowledgement (2xx or 402) arrived.
	FirstAttempt, AckedAt time.Time
}

// acked says the operation was acknowledged: created (2xx), or declined
// (402), which is as final and as recorded as a success.
func (o *loadOp) acked() bool {
	return o.Final >= 200 && o.Final < 300 || o.Final == http.StatusPaymentRequired
}

// loadAnswer is one attempt's answer, reduced to what the ledger keeps.
type loadAnswer struct {
	status     int // 0: none arrived
	replayed   bool
	retryAfter time.Duration // the server's Retry-After, when it sent one
	hasRetry   bool
	code       string // the problem code of an error
	id         string // the resource's id, or a 402's payment_id
	resStatus  string // the resource's status
	chargeID   string
}

// final says the answer closes the operation. Everything the retry rules
// leave open is retried with the same key and body: no answer, a 5xx, a
// 429 (nothing ran) and 409 idempotency_key_in_use (another attempt holds
// the key). Any other answer is the server's last word on the key.
func (a loadAnswer) final() bool {
	switch {
	case a.status == 0, a.status >= 500, a.status == http.StatusTooManyRequests:
		return false
	case a.status == http.StatusConflict:
		return a.code != loadKeyInUse
	}
	return true
}

// unknown says the answer leaves the client unable to tell whether the
// request ran: a 5xx (a commit may have been cut off behind it) or none.
func (a loadAnswer) unknown() bool { return a.status == 0 || a.status >= 500 }

// succeeded says the service answered the operation: a 2xx or a 402, the
// answers that count against an outage.
func (a loadAnswer) succeeded() bool {
	return a.status >= 200 && a.status < 300 || a.status == http.StatusPaymentRequired
}

// apply adds one attempt's answer, which arrived at at, to the operation,
// and reports whether it was the final one.
func (o *loadOp) apply(a loadAnswer, at time.Time) bool {
	o.Attempts++
	o.Statuses = append(o.Statuses, a.status)
	if !a.final() {
		o.AfterUnknown = o.AfterUnknown || a.unknown()
		return false
	}
	o.Final, o.Code, o.ID, o.Replayed = a.status, a.code, a.id, a.replayed
	if o.Kind == kindPayment {
		o.PaymentStatus, o.ChargeID = a.resStatus, a.chargeID
	}
	if o.acked() {
		o.AckedAt = at
	}
	return true
}

// attemptSample is one attempt's timing, for latency and outage figures.
type attemptSample struct {
	start     time.Time
	latency   time.Duration
	succeeded bool
}

// ledger is what the clients were told, operation by operation, and how
// long every attempt took. It is safe for concurrent use.
type ledger struct {
	mu      sync.Mutex
	ops     []*loadOp
	samples []attemptSample
}

// newLedger returns an empty ledger.
func newLedger() *ledger { return &ledger{} }

// add enters an operation before its first attempt, so one that never
// gets an answer is still in the ledger.
func (l *ledger) add(op *loadOp) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ops = append(l.ops, op)
}

// record applies the answer of an attempt started at start that took
// latency, and reports whether it was final.
func (l *ledger) record(op *loadOp, start time.Time, latency time.Duration, a loadAnswer) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if op.FirstAttempt.IsZero() {
		op.FirstAttempt = start
	}
	l.samples = append(l.samples, attemptSample{start: start, latency: latency, succeeded: a.succeeded()})
	return op.apply(a, start.Add(latency))
}

// Operations returns a copy of every operation as it stands now.
func (l *ledger) Operations() []loadOp {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]loadOp, len(l.ops))
	for i, op := range l.ops {
		out[i] = *op
		out[i].Statuses = slices.Clone(op.Statuses)
	}
	return out
}

// P99 is the 99th percentile (nearest rank) of the latency of the
// attempts that started in [from, to), answered or not: an attempt that
// timed out counts with the time the client waited for it. It is 0 when
// no attempt started in the window.
func (l *ledger) P99(from, to time.Time) time.Duration {
	l.mu.Lock()
	var lat []time.Duration
	for _, s := range l.samples {
		if !s.start.Before(from) && s.start.Before(to) {
			lat = append(lat, s.latency)
		}
	}
	l.mu.Unlock()
	return harness.Percentile(lat, 99)
}

// Outage measures how long the service could not be used within
// [from, to]: take the instants, inside the window, at which an attempt
// got a 2xx or a 402 (the end of the attempt: when the client learned
// it); together with from and to they cut the window into spans, and
// Outage is the longest span. With no success in the window it is the
// whole window; while the service answers it is the longest gap between
// two answers, about the clients' pacing. The clients keep sending until
// the load stops, so a window that reaches past the end of the load (plus
// RetryFor) measures the silence, not the service.
func (l *ledger) Outage(from, to time.Time) time.Duration {
	l.mu.Lock()
	var ends []time.Time
	for _, s := range l.samples {
		if end := s.start.Add(s.latency); s.succeeded && !end.Before(from) && !end.After(to) {
			ends = append(ends, end)
		}
	}
	l.mu.Unlock()
	slices.SortFunc(ends, time.Time.Compare)
	var longest time.Duration
	prev := from
	for _, t := range append(ends, to) {
		longest = max(longest, t.Sub(prev))
		prev = t
	}
	return longest
}

// UnknownResolved counts the operations acknowledged by a replay after an
// earlier attempt got a 5xx or no answer: the request had run (committed)
// while its client could not tell, and the retry with the same key
// learned the outcome instead of running it again. A scenario that cuts
// connections during COMMIT shows it was hit when this is above zero.
func (l *ledger) UnknownResolved() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, op := range l.ops {
		if op.acked() && op.Replayed && op.AfterUnknown {
			n++
		}
	}
	return n
}

// runLoad runs cfg.Clients clients until ctx is done: each creates an
// order and, with cfg.Payments, pays it, one operation after the other.
// Once ctx is done no operation starts; the ones without a final answer
// are retried, with their key and body, for up to cfg.RetryFor more, and
// then runLoad returns. Keys and references are built from cfg.Seed, a
// run id (the start time) and the client's counters, so two runs never
// share one and a person reading the database can tell whose they are.
func runLoad(ctx context.Context, cfg loadConfig, led *ledger) {
	retryCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(cfg.RetryFor, cancel) })
	defer stop()

	transport := &http.Transport{MaxIdleConnsPerHost: cfg.Clients, IdleConnTimeout: time.Minute}
	defer transport.CloseIdleConnections()
	runID := fmt.Sprintf("chaos-%d-%s", cfg.Seed, strconv.FormatInt(time.Now().UnixNano(), 36))
	var payments atomic.Int64
	var wg sync.WaitGroup
	for i := range cfg.Clients {
		c := &loadClient{
			cfg: cfg, led: led, http: &http.Client{Transport: transport},
			rng:      rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(i))),
			prefix:   fmt.Sprintf("%s-c%d", runID, i),
			next:     i,
			payments: &payments,
		}
		wg.Go(func() { c.run(ctx, retryCtx) })
	}
	wg.Wait()
}

// loadClient is one client: one operation at a time, attempts spread
// over the APIs in turn.
type loadClient struct {
	cfg    loadConfig
	led    *ledger
	http   *http.Client
	rng    *rand.Rand
	prefix string // of every key and reference this client makes
	next   int    // the attempts sent so far, offset: which API is next
	// payments counts every client's payments, for DeclineEvery.
	payments *atomic.Int64
}

// run starts operations until ctx is done; retryCtx bounds the retries.
func (c *loadClient) run(ctx, retryCtx context.Context) {
	for n := 1; ctx.Err() == nil; n++ {
		order := c.newOrder(n)
		c.do(retryCtx, order, "/v1/orders", c.orderBody(order))
		if !c.cfg.Payments || order.Final != http.StatusCreated || ctx.Err() != nil {
			continue
		}
		pay := c.newPayment(n, order)
		c.do(retryCtx, pay, "/v1/payments", paymentBody(pay))
	}
}

func (c *loadClient) newOrder(n int) *loadOp {
	return &loadOp{
		Key:       fmt.Sprintf("%s-%d-order", c.prefix, n),
		Kind:      kindOrder,
		Reference: fmt.Sprintf("%s-%d", c.prefix, n),
		Amount:    100 + c.rng.Int64N(99_900),
		Currency:  "EUR",
	}
}

// newPayment pays what order owes: all of it, as the API requires.
func (c *loadClient) newPayment(n int, order *loadOp) *loadOp {
	method := processorsim.PaymentMethodVisa
	if every := int64(c.cfg.DeclineEvery); every > 0 && c.payments.Add(1)%every == 0 {
		method = processorsim.PaymentMethodDeclined
	}
	return &loadOp{
		Key:           fmt.Sprintf("%s-%d-pay", c.prefix, n),
		Kind:          kindPayment,
		Reference:     order.Reference,
		OrderID:       order.ID,
		Amount:        order.Amount,
		Currency:      order.Currency,
		PaymentMethod: method,
	}
}

func (c *loadClient) orderBody(op *loadOp) []byte {
	return encodeBody(map[string]any{
		"reference": op.Reference, "customer_id": c.prefix,
		"amount": op.Amount, "currency": op.Currency,
	})
}

func paymentBody(op *loadOp) []byte {
	return encodeBody(map[string]any{
		"order_id": op.OrderID, "amount": op.Amount,
		"currency": op.Currency, "payment_method": op.PaymentMethod,
	})
}

// encodeBody encodes a body built of strings and numbers, which always
// encodes.
func encodeBody(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// do sends op to path with body until an answer is final or ctx ends,
// the same key and the same bytes every time.
func (c *loadClient) do(ctx context.Context, op *loadOp, path string, body []byte) {
	c.led.add(op)
	for n := 1; ctx.Err() == nil; n++ {
		start := time.Now()
		a := c.attempt(ctx, path, op.Key, body)
		if c.led.record(op, start, time.Since(start), a) {
			return
		}
		if !pause(ctx, c.retryDelay(n, a)) {
			return
		}
	}
}

// retryDelay is the wait before retry n (n ≥ 1) after a: the server's
// Retry-After, capped, plus up to a tenth of a second of jitter; without
// one, the jittered exponential backoff.
func (c *loadClient) retryDelay(n int, a loadAnswer) time.Duration {
	if a.hasRetry {
		return min(a.retryAfter, loadMaxRetryAfter) + time.Duration(c.rng.Int64N(int64(100*time.Millisecond)))
	}
	ceiling := loadMaxBackoff
	if n <= 16 {
		ceiling = min(loadBaseBackoff<<(n-1), loadMaxBackoff)
	}
	return ceiling/2 + time.Duration(c.rng.Int64N(int64(ceiling/2)))
}

// attempt sends one request to the next API and reads its whole answer
// within loadAttemptTimeout; any failure to get one is status 0.
//
// The body is handed over without GetBody on purpose: net/http resends a
// request carrying an Idempotency-Key by itself when a reused connection
// fails, and such a resend would be an attempt the ledger never sees (an
// unknown outcome resolved invisibly). Every resend here is the client's
// own, and recorded.
func (c *loadClient) attempt(ctx context.Context, path, key string, body []byte) loadAnswer {
	base := c.cfg.APIs[c.next%len(c.cfg.APIs)]
	c.next++
	ctx, cancel := context.WithTimeout(ctx, loadAttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, nil)
	if err != nil {
		return loadAnswer{}
	}
	req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	req.Header.Set("Authorization", "Bearer "+c.cfg.APIKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	res, err := c.http.Do(req)
	if err != nil {
		return loadAnswer{}
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return loadAnswer{}
	}
	return readAnswer(res.StatusCode, res.Header, raw)
}

// readAnswer reduces a complete response to a loadAnswer. A body that
// does not parse leaves the fields it would have filled empty: the
// checker then finds the acknowledged resource missing.
func readAnswer(status int, h http.Header, raw []byte) loadAnswer {
	a := loadAnswer{status: status, replayed: h.Get(loadReplayedHeader) == "true"}
	if s, err := strconv.Atoi(strings.TrimSpace(h.Get("Retry-After"))); err == nil && s >= 0 {
		// Bounded before the multiplication, which could overflow; the
		// wait is capped far lower anyway.
		a.retryAfter, a.hasRetry = time.Duration(min(s, 3600))*time.Second, true
	}
	if status >= 200 && status < 300 {
		var v struct {
			ID       string `json:"id"`
			Status   string `json:"status"`
			ChargeID string `json:"charge_id"`
		}
		_ = json.Unmarshal(raw, &v)
		a.id, a.resStatus, a.chargeID = v.ID, v.Status, v.ChargeID
		return a
	}
	var p struct {
		Code      string `json:"code"`
		PaymentID string `json:"payment_id"`
	}
	_ = json.Unmarshal(raw, &p)
	a.code = p.Code
	if status == http.StatusPaymentRequired && p.Code == loadCardDeclined {
		a.id, a.resStatus = p.PaymentID, "declined"
	}
	return a
}

// pause waits d, or less if ctx ends first; it reports whether it waited
// it all.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
