package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/tooling/processorsim"
)

// The checker's comparison is tested on hand-made records: a world in
// which everything the clients were told holds, then the same world with
// one thing broken at a time, each of which must be found in its bucket
// and nowhere else.

var testTenant = uuid.MustParse("0193a3c0-0000-7000-8000-0000000000aa")

// world is a ledger snapshot with the records that should match it.
type world struct {
	ops []loadOp
	obs observed
}

func (w *world) compare() checkResult { return compare(w.ops, w.obs) }

// order adds an acknowledged order and its row; it returns the row's
// index.
func (w *world) order(ref string, amount int64) int {
	id := "ord-" + ref
	w.ops = append(w.ops, loadOp{
		Key: ref + "-order", Kind: kindOrder, Reference: ref, Amount: amount, Currency: "EUR",
		Attempts: 1, Statuses: []int{201}, Final: 201, ID: id,
	})
	w.obs.orders = append(w.obs.orders, orderRow{TenantID: testTenant, ID: id, Reference: ref, Amount: amount, Currency: "EUR"})
	return len(w.obs.orders) - 1
}

// pay adds the acknowledged payment of the order at index i, its row,
// its event and its charge call at the processor, as a healthy
// deployment leaves them: a visa payment succeeds and credits the order,
// a declined card is recorded declined and credits nothing.
func (w *world) pay(i int, method string) {
	ord := &w.obs.orders[i]
	key := ord.Reference + "-pay"
	p := paymentRow{
		ID: "pay-" + ord.Reference, OrderID: ord.ID, Amount: ord.Amount, Status: payments.StatusSucceeded,
		PaymentMethod: method, ChargeKey: chargeKey(testTenant, key), ChargeID: "ch_" + ord.Reference,
	}
	op := loadOp{
		Key: key, Kind: kindPayment, Reference: ord.Reference, OrderID: ord.ID, Amount: ord.Amount, Currency: "EUR",
		PaymentMethod: method, Attempts: 1, Statuses: []int{201}, Final: 201, ID: p.ID,
		PaymentStatus: payments.StatusSucceeded, ChargeID: p.ChargeID,
	}
	event := eventRow{ID: "ev-" + p.ID, Type: payments.TypePaymentSucceeded, OrderID: ord.ID, PaymentID: p.ID, Published: true, Applied: true}
	if method == processorsim.PaymentMethodDeclined {
		p.Status, op.Statuses, op.Final, op.PaymentStatus, op.ChargeID = payments.StatusDeclined, []int{402}, 402, payments.StatusDeclined, ""
		event.Type, event.Applied = payments.TypePaymentFailed, false
	} else {
		ord.AmountPaid = ord.Amount
	}
	w.ops = append(w.ops, op)
	w.obs.payments = append(w.obs.payments, p)
	w.obs.events = append(w.obs.events, event)
	w.charge(p.ChargeKey)
}

// charge records an executed charge call under key.
func (w *world) charge(key string) {
	w.obs.calls = append(w.obs.calls, processorsim.Call{
		Seq: int64(len(w.obs.calls) + 1), Method: http.MethodPost, Path: processorsim.PathCharges,
		IdempotencyKey: key, Status: 200, Executed: true,
	})
}

// compensate records the sweep's compensation of a charge of the payment
// at index j, and whether its refund executed at the processor.
func (w *world) compensate(j int, chargeID string, refunded bool) {
	p := w.obs.payments[j]
	refundKey := "refund-" + chargeID
	status := "pending"
	if refunded {
		status = compensationSucceeded
		w.obs.calls = append(w.obs.calls, processorsim.Call{
			Seq: int64(len(w.obs.calls) + 1), Method: http.MethodPost, Path: processorsim.PathRefunds,
			IdempotencyKey: refundKey, Status: 200, Executed: true,
		})
	}
	w.obs.compensations = append(w.obs.compensations, compensationRow{PaymentID: p.ID, ChargeID: chargeID, Status: status, RefundKey: refundKey})
}

// healthy is a run in which nothing went wrong: two paid orders, one
// declined, one only created.
func healthy() *world {
	w := &world{}
	w.pay(w.order("r1", 2500), processorsim.PaymentMethodVisa)
	w.pay(w.order("r2", 990), processorsim.PaymentMethodVisa)
	w.pay(w.order("r3", 1200), processorsim.PaymentMethodDeclined)
	w.order("r4", 700)
	return w
}

// counts is the part of a result the tests compare.
type counts struct{ Acked, Lost, Duplicated, DoubleCharged, Unresolved, Unexpected int }

func countsOf(r checkResult) counts {
	return counts{r.Acked, r.Lost, r.Duplicated, r.DoubleCharged, r.Unresolved, r.Unexpected}
}

func TestCheckHealthyRunHasNoViolation(t *testing.T) {
	res := healthy().compare()
	if got, want := countsOf(res), (counts{Acked: 7}); got != want || len(res.Problems) > 0 {
		t.Fatalf("got %+v, problems %q; want %+v and none", got, res.Problems, want)
	}
}

// TestCheckNegativeControl breaks four things at once, each on its own
// order, and wants each found once, in its bucket.
func TestCheckNegativeControl(t *testing.T) {
	w := healthy()
	// A lost order: acknowledged, gone from the database.
	w.obs.orders = w.obs.orders[:3]
	// A duplicated order: a second order with r2's reference.
	dup := w.obs.orders[1]
	dup.ID, dup.AmountPaid = "ord-r2-again", 0
	w.obs.orders = append(w.obs.orders, dup)
	// A doubly applied event: r1 credited twice.
	w.obs.orders[0].AmountPaid *= 2
	// A double charge: r2's charge executed twice, nothing compensated.
	w.charge(w.obs.payments[1].ChargeKey)

	res := w.compare()
	if got, want := countsOf(res), (counts{Acked: 7, Lost: 1, Duplicated: 2, DoubleCharged: 1}); got != want {
		t.Fatalf("got %+v, want %+v; problems:\n%s", got, want, strings.Join(res.Problems, "\n"))
	}
	for _, want := range []string{
		"order ord-r4 (reference r4, key r4-order): acknowledged 201, not in the database",
		"reference r2: 2 orders",
		"order ord-r1: amount_paid 5000",
		"payment pay-r2 (succeeded) of order ord-r2: 2 charge(s) kept",
	} {
		if !slices.ContainsFunc(res.Problems, func(p string) bool { return strings.HasPrefix(p, want) }) {
			t.Errorf("no problem starts with %q; problems:\n%s", want, strings.Join(res.Problems, "\n"))
		}
	}
}

// TestCheckFindsEachViolation breaks one thing at a time.
func TestCheckFindsEachViolation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(w *world)
		want   counts
	}{{
		name:   "acknowledged order stored with another amount",
		mutate: func(w *world) { w.obs.orders[3].Amount = 701 },
		want:   counts{Acked: 7, Lost: 1},
	}, {
		name:   "acknowledged payment stored declined",
		mutate: func(w *world) { w.obs.payments[0].Status = payments.StatusDeclined; w.obs.orders[0].AmountPaid = 0 },
		// The order is no longer owed its payment, and the charge is
		// kept for a declined payment: both are found too.
		want: counts{Acked: 7, Lost: 1, Duplicated: 1, DoubleCharged: 1},
	}, {
		name:   "acknowledged payment stored with another charge",
		mutate: func(w *world) { w.obs.payments[1].ChargeID = "ch_other" },
		want:   counts{Acked: 7, Lost: 1},
	}, {
		name: "event never applied",
		mutate: func(w *world) {
			w.obs.orders[0].AmountPaid = 0
			w.obs.events[0].Applied = false
		},
		want: counts{Acked: 7, Lost: 1},
	}, {
		name:   "event applied, order not credited",
		mutate: func(w *world) { w.obs.orders[1].AmountPaid = 0 },
		want:   counts{Acked: 7, Lost: 1},
	}, {
		name:   "succeeded payment with no charge at the processor",
		mutate: func(w *world) { w.obs.calls = w.obs.calls[1:] },
		want:   counts{Acked: 7, Lost: 1},
	}, {
		name: "a late duplicate charge, compensated",
		mutate: func(w *world) {
			w.charge(w.obs.payments[0].ChargeKey)
			w.compensate(0, "ch_late", true)
		},
		want: counts{Acked: 7},
	}, {
		name: "a late duplicate charge, compensation never refunded",
		mutate: func(w *world) {
			w.charge(w.obs.payments[0].ChargeKey)
			w.compensate(0, "ch_late", false)
		},
		want: counts{Acked: 7, DoubleCharged: 1},
	}, {
		name: "a charge that landed after the payment failed, compensated",
		mutate: func(w *world) {
			p := &w.obs.payments[1]
			p.Status, p.ChargeID = payments.StatusFailed, ""
			w.ops[3].Final, w.ops[3].Code, w.ops[3].ID = 422, "processor_rejected", ""
			w.obs.orders[1].AmountPaid = 0
			w.obs.events[1].Type, w.obs.events[1].Applied = payments.TypePaymentFailed, false
			w.compensate(1, "ch_r2", true)
		},
		want: counts{Acked: 6, Unexpected: 1},
	}, {
		name: "a refund is subtracted from what the order was paid",
		mutate: func(w *world) {
			w.obs.refunds = append(w.obs.refunds, refundRow{ID: "re-1", PaymentID: "pay-r1", Amount: 500, Status: payments.RefundStatusSucceeded})
			w.obs.orders[0].AmountPaid, w.obs.orders[0].AmountRefunded = 2000, 500
		},
		want: counts{Acked: 7},
	}, {
		name: "a payment under no client's key",
		mutate: func(w *world) {
			w.obs.payments = append(w.obs.payments, paymentRow{ID: "pay-stray", OrderID: "ord-r3", Amount: 1200,
				Status: payments.StatusDeclined, PaymentMethod: processorsim.PaymentMethodDeclined, ChargeKey: "stray"})
		},
		want: counts{Acked: 7, Duplicated: 1},
	}, {
		name: "two payments of one order, each charged",
		mutate: func(w *world) {
			w.obs.payments[1].OrderID = "ord-r1"
			w.ops[3].OrderID, w.ops[3].Reference = "ord-r1", "r1"
			w.obs.events[1].OrderID = "ord-r1"
			w.obs.orders[0].AmountPaid, w.obs.orders[1].AmountPaid = 2500+990, 0
		},
		want: counts{Acked: 7, Duplicated: 1, DoubleCharged: 1},
	}, {
		name: "a payment row lost, its charge kept",
		mutate: func(w *world) {
			w.obs.payments = w.obs.payments[1:]
			w.obs.events = w.obs.events[1:]
			w.obs.orders[0].AmountPaid = 0
		},
		want: counts{Acked: 7, Lost: 2},
	}, {
		name: "no final answer",
		mutate: func(w *world) {
			w.ops[0].Final, w.ops[0].ID, w.ops[0].Statuses = 0, "", []int{503, 0}
		},
		want: counts{Acked: 6, Unresolved: 1},
	}, {
		name: "422 for the identical resend",
		mutate: func(w *world) {
			w.ops[6].Final, w.ops[6].Code, w.ops[6].ID = 422, "idempotency_key_reused", ""
		},
		want: counts{Acked: 6, Unexpected: 1},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			w := healthy()
			tc.mutate(w)
			res := w.compare()
			if got := countsOf(res); got != tc.want {
				t.Fatalf("got %+v, want %+v; problems:\n%s", got, tc.want, strings.Join(res.Problems, "\n"))
			}
			if n := tc.want.Lost + tc.want.Duplicated + tc.want.DoubleCharged + tc.want.Unresolved + tc.want.Unexpected; len(res.Problems) != n {
				t.Fatalf("%d problems for %d violations: %q", len(res.Problems), n, res.Problems)
			}
		})
	}
}

func TestCheckListsAtMostMaxListedProblems(t *testing.T) {
	w := &world{}
	for i := range maxListed + 5 {
		w.order(fmt.Sprintf("r%d", i), 100)
	}
	w.obs.orders = nil
	res := w.compare()
	if res.Lost != maxListed+5 || len(res.Problems) != maxListed+1 || res.Problems[maxListed] != "and 5 more" {
		t.Fatalf("lost %d, problems %d, last %q", res.Lost, len(res.Problems), res.Problems[len(res.Problems)-1])
	}
}

func TestCheckQuiescence(t *testing.T) {
	w := healthy()
	if s := w.obs.stuck(); len(s) > 0 {
		t.Fatalf("a healthy run is stuck: %q", s)
	}
	w.obs.processorBusy = true
	w.obs.payments[0].SweepDue = true
	w.obs.payments[1].Status = payments.StatusChargeSent
	w.obs.events[0].Published, w.obs.events[0].Applied = false, false
	w.compensate(0, "ch_late", false)
	w.obs.refunds = append(w.obs.refunds,
		refundRow{ID: "re-1", PaymentID: "pay-r1", Amount: 1, Status: payments.RefundStatusSent},
		refundRow{ID: "re-2", PaymentID: "pay-r1", Amount: 1, Status: payments.RefundStatusSucceeded})
	want := []string{
		"the processor still holds a call that may land",
		"event ev-pay-r1 (payment.succeeded) is not relayed",
		"payment pay-r1 succeeded, and order ord-r1 is not credited with it (its event is not applied)",
		"payment pay-r1: the reconciliation sweep has yet to look at it",
		"payment pay-r2 is charge_sent",
		"refund re-1 is refund_sent",
		"refund re-2 succeeded, and its event is not applied",
		"the compensation of charge ch_late (payment pay-r1) is pending",
	}
	if got := w.obs.stuck(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("stuck:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestLedgerP99AndOutage(t *testing.T) {
	led := newLedger()
	op := &loadOp{Kind: kindOrder}
	led.add(op)
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	ok, failed := loadAnswer{status: 201}, loadAnswer{status: 503}
	// 100 attempts in the first second, taking 1 to 100 ms.
	for i := range 100 {
		led.record(op, t0.Add(time.Duration(i)*10*time.Millisecond), time.Duration(i+1)*time.Millisecond, failed)
	}
	// One slow attempt before the window, which must not count.
	led.record(op, t0.Add(-time.Second), 5*time.Second, failed)
	if got := led.P99(t0, t0.Add(time.Second)); got != 99*time.Millisecond {
		t.Errorf("P99 = %s, want 99ms", got)
	}
	if got := led.P99(t0.Add(time.Hour), t0.Add(2*time.Hour)); got != 0 {
		t.Errorf("P99 of an empty window = %s, want 0", got)
	}

	// No success in [t0, t0+6s] yet: the whole window.
	if got := led.Outage(t0, t0.Add(6*time.Second)); got != 6*time.Second {
		t.Errorf("Outage with no success = %s, want 6s", got)
	}
	// Successes arrive at 1 s, 2 s and 5 s; the 503 at 3.5 s is none.
	for _, at := range []time.Duration{1, 2, 5} {
		led.record(op, t0.Add(at*time.Second-100*time.Millisecond), 100*time.Millisecond, ok)
	}
	led.record(op, t0.Add(3*time.Second), 500*time.Millisecond, failed)
	if got := led.Outage(t0, t0.Add(6*time.Second)); got != 3*time.Second {
		t.Errorf("Outage = %s, want 3s (from 2 s to 5 s)", got)
	}
}

func TestLedgerRetryDelay(t *testing.T) {
	c := &loadClient{rng: rand.New(rand.NewPCG(1, 2))}
	for n := 1; n <= 40; n++ {
		d := c.retryDelay(n, loadAnswer{status: 0})
		ceiling := min(loadBaseBackoff<<min(n-1, 20), loadMaxBackoff)
		if d < ceiling/2 || d >= ceiling {
			t.Fatalf("retry %d without Retry-After waits %s, want [%s, %s)", n, d, ceiling/2, ceiling)
		}
	}
	d := c.retryDelay(1, readAnswer(503, http.Header{"Retry-After": {"30"}}, nil))
	if d < loadMaxRetryAfter || d >= loadMaxRetryAfter+100*time.Millisecond {
		t.Fatalf("Retry-After: 30 waits %s, want the cap %s plus jitter", d, loadMaxRetryAfter)
	}
}

// fakeAPI answers like the API does when faults hit it. Orders: the first
// attempt commits and loses its connection, the second gets a 503, the
// third the replay. Payments: the first attempt finds the key in use,
// the second gets the outcome. It checks that every attempt of a key
// carries the first attempt's body.
type fakeAPI struct {
	t        *testing.T
	mu       sync.Mutex
	attempts map[string]int
	bodies   map[string]string
	served   map[string]int // by server
}

func (f *fakeAPI) handler(server string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		key := r.Header.Get("Idempotency-Key")
		f.mu.Lock()
		f.attempts[key]++
		n := f.attempts[key]
		f.served[server]++
		if first, ok := f.bodies[key]; ok && first != string(body) {
			f.t.Errorf("key %s: attempt %d sent %s, the first sent %s", key, n, body, first)
		}
		f.bodies[key] = string(body)
		f.mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer sk_test" {
			f.t.Errorf("no bearer token on %s", key)
		}
		w.Header().Set("Retry-After", "0")
		switch {
		case r.URL.Path == "/v1/orders" && n == 1:
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		case r.URL.Path == "/v1/orders" && n == 2:
			w.WriteHeader(http.StatusServiceUnavailable)
		case r.URL.Path == "/v1/orders":
			var req struct{ Reference string }
			_ = json.Unmarshal(body, &req)
			w.Header().Set(loadReplayedHeader, "true")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"id":"ord-%s","reference":%q,"status":"pending"}`, req.Reference, req.Reference)
		case n == 1:
			w.WriteHeader(http.StatusConflict)
			fmt.Fprint(w, `{"code":"idempotency_key_in_use"}`)
		case strings.Contains(string(body), processorsim.PaymentMethodDeclined):
			w.WriteHeader(http.StatusPaymentRequired)
			fmt.Fprintf(w, `{"code":"card_declined","payment_id":"pay-%s","decline_code":"generic_decline"}`, key)
		default:
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"id":"pay-%s","status":"succeeded","charge_id":"ch-%s"}`, key, key)
		}
	}
}

func TestLedgerRunLoadFollowsTheRetryRules(t *testing.T) {
	f := &fakeAPI{t: t, attempts: map[string]int{}, bodies: map[string]string{}, served: map[string]int{}}
	a := httptest.NewServer(f.handler("a"))
	defer a.Close()
	b := httptest.NewServer(f.handler("b"))
	defer b.Close()

	led := newLedger()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	runLoad(ctx, loadConfig{APIs: []string{a.URL, b.URL}, APIKey: "sk_test", Clients: 3, Seed: 7,
		Payments: true, DeclineEvery: 2, RetryFor: 10 * time.Second}, led)

	ops := led.Operations()
	orders, pays, declined := 0, 0, 0
	keys := map[string]bool{}
	for _, op := range ops {
		if keys[op.Key] {
			t.Errorf("key %s used by two operations", op.Key)
		}
		keys[op.Key] = true
		switch op.Kind {
		case kindOrder:
			orders++
			if fmt.Sprint(op.Statuses) != "[0 503 201]" || !op.Replayed || !op.AfterUnknown || op.ID != "ord-"+op.Reference {
				t.Errorf("order %s: %+v", op.Key, op)
			}
		case kindPayment:
			pays++
			switch {
			case op.PaymentMethod == processorsim.PaymentMethodDeclined:
				declined++
				if fmt.Sprint(op.Statuses) != "[409 402]" || op.PaymentStatus != payments.StatusDeclined || op.ID != "pay-"+op.Key {
					t.Errorf("declined payment %s: %+v", op.Key, op)
				}
			case fmt.Sprint(op.Statuses) != "[409 201]" || op.PaymentStatus != payments.StatusSucceeded || op.ChargeID != "ch-"+op.Key:
				t.Errorf("payment %s: %+v", op.Key, op)
			}
			if op.OrderID != "ord-"+op.Reference || op.AfterUnknown {
				t.Errorf("payment %s: %+v", op.Key, op)
			}
		}
		if !op.acked() || op.FirstAttempt.IsZero() || op.AckedAt.Before(op.FirstAttempt) {
			t.Errorf("%s %s: %+v", op.Kind, op.Key, op)
		}
	}
	if orders < 3 || pays < 2 || declined == 0 || declined == pays {
		t.Fatalf("%d orders, %d payments, %d declined", orders, pays, declined)
	}
	if got := led.UnknownResolved(); got != orders {
		t.Errorf("UnknownResolved = %d, want one per order (%d)", got, orders)
	}
	if f.served["a"] == 0 || f.served["b"] == 0 {
		t.Errorf("attempts per API: %v; want both used", f.served)
	}
}

func TestLedgerRunLoadStopsRetryingAfterRetryFor(t *testing.T) {
	var final sync.Map
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		if _, seen := final.LoadOrStore(key, true); !seen && strings.HasSuffix(key, "-1-order") {
			// The first operation of each client is refused for good.
			w.WriteHeader(http.StatusUnprocessableEntity)
			fmt.Fprint(w, `{"code":"idempotency_key_reused"}`)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer api.Close()

	led := newLedger()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	runLoad(ctx, loadConfig{APIs: []string{api.URL}, APIKey: "sk_test", Clients: 2, Seed: 1, RetryFor: 300 * time.Millisecond}, led)
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("runLoad took %s with RetryFor 300ms", took)
	}
	ops := led.Operations()
	if len(ops) != 4 {
		t.Fatalf("%d operations, want 2 per client (the refused one, then one that never ends)", len(ops))
	}
	for _, op := range ops {
		switch {
		case strings.HasSuffix(op.Key, "-1-order"):
			if op.Final != 422 || op.Code != "idempotency_key_reused" || op.Attempts != 1 {
				t.Errorf("a 422 was retried, or not recorded: %+v", op)
			}
		case op.Final != 0 || op.Attempts < 3 || !op.AfterUnknown:
			t.Errorf("an operation answered 503 only: %+v", op)
		}
	}
	if res := compare(ops, observed{}); res.Unresolved != 2 || res.Unexpected != 2 {
		t.Errorf("compare: %+v", res)
	}
}
