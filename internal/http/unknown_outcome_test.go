package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/idemref/payments/client/api"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/processor/simproc"
	"github.com/idemref/payments/internal/tooling/processorsim"
)

// Unknown outcomes (S6) against a processor that behaves like a real one:
// a call keeps executing after its caller gave up (late execution), a
// same-key call while the first is held gets 409, lists are paginated.
// Every test asserts on the money the processor moved for the order, read
// from the simulator's own records, and on the rows.

// Modes of the simulator.
const (
	dedupKeys  = false
	ignoreKeys = true
)

func modeName(ignore bool) string {
	if ignore {
		return "IgnoresKeys"
	}
	return "DeduplicatesKeys"
}

// retryUntilFinal resends like a well-behaved client, with the same key,
// while the answer says to retry (503 with processor_outcome_unknown or
// processor_unavailable, 409 idempotency_key_in_use), and returns the first
// other answer with the codes of the answers before it.
func retryUntilFinal(t *testing.T, send func() response) (response, []string) {
	t.Helper()
	var codes []string
	deadline := time.Now().Add(20 * time.Second)
	for {
		res := send()
		code := ""
		if res.status == http.StatusServiceUnavailable || res.status == http.StatusConflict {
			code = decodeProblem(t, res).Code
		}
		switch code {
		case httpapi.CodeOutcomeUnknown, httpapi.CodeProcessorUnavailable, httpapi.CodeKeyInUse:
			codes = append(codes, code)
		default:
			return res, codes
		}
		if time.Now().After(deadline) {
			t.Fatalf("still no final answer after 20 s; answers so far: %v", codes)
		}
		time.Sleep(50 * time.Millisecond) // the client's backoff, not a synchronisation
	}
}

// waitIdle waits until no call is held at the processor: every late call
// has landed.
func (e *bundle) waitIdle(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := e.sim.WaitIdle(ctx); err != nil {
		t.Fatalf("the processor still holds calls: %v", err)
	}
}

// sweepUntil runs the reconciliation sweep until done holds, as the
// completer would on its ticks; the sweep is due only once the last call
// can no longer land, so this waits for that in real time.
func (e *bundle) sweepUntil(t *testing.T, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !done() {
		if _, err := e.payments.Sweep(t.Context(), 10); err != nil {
			t.Fatalf("sweep: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 15 s of sweeping: still not %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// postedCalls returns the POSTs to path the processor received, in order.
func (e *bundle) postedCalls(path string) []processorsim.Call {
	var out []processorsim.Call
	for _, c := range e.sim.Calls() {
		if c.Method == http.MethodPost && c.Path == path {
			out = append(out, c)
		}
	}
	return out
}

func (e *bundle) compensationsOf(t *testing.T, paymentID string) []api.Compensation {
	t.Helper()
	return decodePayment(t, e.get(t, e.a.Key, "/v1/payments/"+paymentID)).Compensations
}

// A charge that lands after the API gave up on it, with the client
// retrying under the same key, in both modes. The settle window is longer
// than the processor's execution, as configured correctly: the retry finds
// the late charge instead of charging again.
func TestLateChargeWithClientRetry(t *testing.T) {
	t.Parallel()
	for _, ignore := range []bool{dedupKeys, ignoreKeys} {
		t.Run(modeName(ignore), func(t *testing.T) {
			t.Parallel()
			e := setup(t, withProcessor())
			e.sim.SetIgnoreIdempotencyKeys(ignore)
			o := e.newOrder(t, e.a, "inv-1")
			const key = "late-key"
			body := payBody(o.Id.String(), cardVisa)

			e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultLateExecution, Latency: lateDelay})
			first := e.pay(t, e.a.Key, key, body)
			wantProblem(t, first, http.StatusServiceUnavailable, httpapi.CodeOutcomeUnknown)
			row := e.onePayment(t, o.Id.String())
			if got := decodePayment(t, e.get(t, e.a.Key, "/v1/payments/"+row.ID)).Status; got != "processing" {
				t.Errorf("payment status while the charge is held = %q, want processing", got)
			}

			final, codes := retryUntilFinal(t, func() response { return e.pay(t, e.a.Key, key, body) })
			wantStatus(t, final, http.StatusCreated)
			t.Logf("answers before the final one: %v", codes)
			p := decodePayment(t, final)
			e.waitIdle(t)

			if posts := e.postedCalls(processorsim.PathCharges); len(posts) != 1 {
				t.Errorf("charge calls = %+v, want only the first one: the retries must find the late charge", posts)
			}
			ch := e.oneCharge(t, chargeKey(e.a.ID, key))
			if p.ChargeId == nil || *p.ChargeId != ch.ID {
				t.Errorf("charge_id = %v, want the late charge %s", p.ChargeId, ch.ID)
			}
			if net := e.netCharged(o.Id.String()); net != orderAmount {
				t.Errorf("net charged = %d, want %d", net, orderAmount)
			}
			if got := e.onePayment(t, o.Id.String()); got.Status != "succeeded" || got.ChargeID != ch.ID {
				t.Errorf("payment row = %+v, want succeeded with %s", got, ch.ID)
			}
			e.wantKeyState(t, e.a.ID, endpointPayments, key, completed(http.StatusCreated, row.ID))
			if refunds := e.sim.Refunds(); len(refunds) != 0 {
				t.Errorf("refunds = %+v, want none", refunds)
			}
		})
	}
}

// A processor slower than the settle window: the first charge is still
// held when the window has passed, so the retry sends again. A processor
// that deduplicates answers that call 409 (the first one is in flight): not
// an outcome, so nothing final is recorded, the payment is never failed,
// and the later lookup finds the one charge.
func TestLateChargeAnsweredInProgress(t *testing.T) {
	t.Parallel()
	const window = 700 * time.Millisecond
	const delay = 2500 * time.Millisecond
	e := setup(t, withProcessor(), withSettleWindow(window))
	o := e.newOrder(t, e.a, "inv-1")
	const key = "held-key"
	body := payBody(o.Id.String(), cardVisa)

	e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultLateExecution, Latency: delay})
	wantProblem(t, e.pay(t, e.a.Key, key, body), http.StatusServiceUnavailable, httpapi.CodeOutcomeUnknown)
	row := e.onePayment(t, o.Id.String())

	// Retry until the resend has been answered 409, then look at the state.
	deadline := time.Now().Add(10 * time.Second)
	for !answered409(e) {
		res := e.pay(t, e.a.Key, key, body)
		if res.status != http.StatusServiceUnavailable && res.status != http.StatusConflict {
			t.Fatalf("answer while the first charge is held: %d %s", res.status, res.body)
		}
		if time.Now().After(deadline) {
			t.Fatal("the resend never reached the processor")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Run("The409IsNotFinal", func(t *testing.T) {
		e.wantKeyState(t, e.a.ID, endpointPayments, key, keyState{
			State: "in_progress", RecoveryPoint: "charge_sent", LeaseHeld: e.keyState(t, e.a.ID, endpointPayments, key).LeaseHeld, ResourceID: row.ID,
		})
		if got := e.onePayment(t, o.Id.String()).Status; got != "charge_sent" {
			t.Errorf("payment row status = %s, want charge_sent: a 409 in progress says nothing about the charge", got)
		}
		if got := decodePayment(t, e.get(t, e.a.Key, "/v1/payments/"+row.ID)).Status; got != "processing" {
			t.Errorf("payment status = %q, want processing", got)
		}
	})

	final, _ := retryUntilFinal(t, func() response { return e.pay(t, e.a.Key, key, body) })
	wantStatus(t, final, http.StatusCreated)
	e.waitIdle(t)
	ch := e.oneCharge(t, chargeKey(e.a.ID, key))
	if p := decodePayment(t, final); p.ChargeId == nil || *p.ChargeId != ch.ID {
		t.Errorf("charge_id = %v, want %s", p.ChargeId, ch.ID)
	}
	if net := e.netCharged(o.Id.String()); net != orderAmount {
		t.Errorf("net charged = %d, want %d", net, orderAmount)
	}
	e.wantKeyState(t, e.a.ID, endpointPayments, key, completed(http.StatusCreated, row.ID))
	if got := e.onePayment(t, o.Id.String()).Status; got != "succeeded" {
		t.Errorf("payment row status = %s, want succeeded", got)
	}
}

func answered409(e *bundle) bool {
	for _, c := range e.postedCalls(processorsim.PathCharges) {
		if c.Status == http.StatusConflict && !c.Executed {
			return true
		}
	}
	return false
}

// A processor that ignores keys and is slower than the settle window: the
// retry's charge lands, then the held one lands beside it. The sweep finds
// the late duplicate and refunds it: net one charge, and the payment shows
// the compensation.
func TestLateDuplicateChargeIsRefundedBySweep(t *testing.T) {
	t.Parallel()
	const window = 700 * time.Millisecond
	const delay = 2 * time.Second
	e := setup(t, withProcessor(), withSettleWindow(window))
	e.sim.SetIgnoreIdempotencyKeys(true)
	o := e.newOrder(t, e.a, "inv-1")
	const key = "dup-key"
	body := payBody(o.Id.String(), cardVisa)

	e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultLateExecution, Latency: delay})
	wantProblem(t, e.pay(t, e.a.Key, key, body), http.StatusServiceUnavailable, httpapi.CodeOutcomeUnknown)
	final, _ := retryUntilFinal(t, func() response { return e.pay(t, e.a.Key, key, body) })
	wantStatus(t, final, http.StatusCreated)
	p := decodePayment(t, final)
	e.waitIdle(t)

	charges := e.chargesUnder(chargeKey(e.a.ID, key))
	if len(charges) != 2 {
		t.Fatalf("charges under the key = %+v, want the retry's and the late one", charges)
	}
	late := charges[1] // the processor lists charges as they landed: the held one last
	if p.ChargeId == nil || *p.ChargeId != charges[0].ID {
		t.Fatalf("the payment recorded %v; want the retry's charge, not the late %s", p.ChargeId, late.ID)
	}
	if net := e.netCharged(o.Id.String()); net != 2*orderAmount {
		t.Fatalf("net charged before the sweep = %d, want %d (the double charge the sweep must undo)", net, 2*orderAmount)
	}

	e.sweepUntil(t, "the late charge refunded", func() bool { return e.netCharged(o.Id.String()) == orderAmount })
	if metrics := string(metricsText(t)); !regexp.MustCompile(`(?m)^payments_compensations_total\{reason="duplicate_charge"\} [1-9]`).MatchString(metrics) {
		t.Errorf("/metrics does not count the compensation:\n%s", grepLines(metrics, "payments_"))
	}
	refunds := e.sim.Refunds()
	if len(refunds) != 1 || refunds[0].Charge != late.ID || refunds[0].Amount != late.Amount {
		t.Errorf("refunds = %+v, want the late charge %s refunded in full", refunds, late.ID)
	}
	want := []api.Compensation{{ChargeId: late.ID, Amount: late.Amount, Reason: api.DuplicateCharge, Status: api.CompensationStatusSucceeded, RefundId: &refunds[0].ID}}
	if diff := cmp.Diff(want, e.compensationsOf(t, p.Id.String())); diff != "" {
		t.Errorf("compensations (-want +got):\n%s", diff)
	}
	if got := e.onePayment(t, o.Id.String()); got.Status != "succeeded" || got.RefundedAmount != 0 {
		t.Errorf("payment row = %+v: the compensation is not a refund of the payment", got)
	}
	if n := e.count(t, "SELECT count(*) FROM payments WHERE sweep_at IS NOT NULL"); n != 0 {
		t.Errorf("payments still due for a sweep = %d, want 0", n)
	}

	t.Run("SweepingAgainChangesNothing", func(t *testing.T) {
		if err := e.pool.QueryRow(t.Context(), `UPDATE payments SET sweep_at = now() RETURNING 1`).Scan(new(int)); err != nil {
			t.Fatal(err)
		}
		if _, err := e.payments.Sweep(t.Context(), 10); err != nil {
			t.Fatal(err)
		}
		if n := len(e.sim.Refunds()); n != 1 {
			t.Errorf("refunds after a second sweep = %d, want 1", n)
		}
		if net := e.netCharged(o.Id.String()); net != orderAmount {
			t.Errorf("net charged = %d, want %d", net, orderAmount)
		}
	})
}

// The client never comes back after the first 503: the completer alone
// finishes the payment, in each mode, whether the processor is faster or
// slower than the settle window. Net one charge every time.
func TestLateChargeWithCompleterOnly(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		ignore        bool
		window, delay time.Duration
		// charges made in all: 2 when the processor outlasted the window
		// and ignores keys, so the sweep must refund one.
		charges int
	}{
		{"IgnoresKeys/ProcessorWithinTheWindow", ignoreKeys, settleWindow, lateDelay, 1},
		{"IgnoresKeys/ProcessorSlowerThanTheWindow", ignoreKeys, 700 * time.Millisecond, 2 * time.Second, 2},
		{"DeduplicatesKeys/ProcessorSlowerThanTheWindow", dedupKeys, 700 * time.Millisecond, 2 * time.Second, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, withProcessor(), withSettleWindow(tt.window))
			e.sim.SetIgnoreIdempotencyKeys(tt.ignore)
			o := e.newOrder(t, e.a, "inv-1")
			const key = "abandoned-key"
			body := payBody(o.Id.String(), cardVisa)

			e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultLateExecution, Latency: tt.delay})
			wantProblem(t, e.pay(t, e.a.Key, key, body), http.StatusServiceUnavailable, httpapi.CodeOutcomeUnknown)

			ctx, stop := context.WithCancel(t.Context())
			var wg sync.WaitGroup
			wg.Go(func() { payments.NewCompleter(e.payments, 50*time.Millisecond).Run(ctx) })
			t.Cleanup(func() { stop(); wg.Wait() })

			deadline := time.Now().Add(20 * time.Second)
			for e.keyState(t, e.a.ID, endpointPayments, key).State != "completed" || e.netCharged(o.Id.String()) != orderAmount ||
				len(e.chargesUnder(chargeKey(e.a.ID, key))) != tt.charges {
				if time.Now().After(deadline) {
					t.Fatalf("after 20 s: key %+v, net %d, charges %+v", e.keyState(t, e.a.ID, endpointPayments, key), e.netCharged(o.Id.String()), e.sim.Charges())
				}
				time.Sleep(50 * time.Millisecond)
			}
			e.waitIdle(t)
			stop()
			wg.Wait()

			if net := e.netCharged(o.Id.String()); net != orderAmount {
				t.Errorf("net charged = %d, want %d", net, orderAmount)
			}
			if got := len(e.chargesUnder(chargeKey(e.a.ID, key))); got != tt.charges {
				t.Errorf("charges = %d, want %d", got, tt.charges)
			}
			late := e.replayOf(t, key, body)
			if got := len(e.compensationsOf(t, late.Id.String())); got != tt.charges-1 {
				t.Errorf("compensations = %d, want %d", got, tt.charges-1)
			}
			if diff := cmp.Diff(orderEvents{Succeeded: 1, Amount: orderAmount}, e.orderEvents(t, o.Id.String())); diff != "" {
				t.Errorf("order row (-want +got):\n%s", diff)
			}
		})
	}
}

// replayOf sends the request again, expects the replay of what the
// completer recorded, and returns the payment.
func (e *bundle) replayOf(t *testing.T, key, body string) api.Payment {
	t.Helper()
	res := e.pay(t, e.a.Key, key, body)
	wantStatus(t, res, http.StatusCreated)
	if res.header.Get(httpapi.ReplayedHeader) != "true" {
		t.Errorf("the client's late retry was not a replay")
	}
	return decodePayment(t, res)
}

// A refund that lands after the API gave up on it, in both modes: the
// retry finds it, and the money sent back never exceeds what was asked.
func TestLateRefundWithClientRetry(t *testing.T) {
	t.Parallel()
	for _, ignore := range []bool{dedupKeys, ignoreKeys} {
		t.Run(modeName(ignore), func(t *testing.T) {
			t.Parallel()
			e := setup(t, withProcessor())
			o, p := e.paidOrder(t, e.a, "inv-1")
			e.sim.SetIgnoreIdempotencyKeys(ignore)
			const key = "late-refund"
			body := refundBody(1000)

			e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathRefunds, Kind: processorsim.FaultLateExecution, Latency: lateDelay})
			wantProblem(t, e.refund(t, e.a.Key, key, p.Id.String(), body), http.StatusServiceUnavailable, httpapi.CodeOutcomeUnknown)
			final, _ := retryUntilFinal(t, func() response { return e.refund(t, e.a.Key, key, p.Id.String(), body) })
			wantStatus(t, final, http.StatusCreated)
			e.waitIdle(t)

			if posts := e.postedCalls(processorsim.PathRefunds); len(posts) != 1 {
				t.Errorf("refund calls = %+v, want only the first one", posts)
			}
			var refunded int64
			for _, re := range e.sim.Refunds() {
				refunded += re.Amount
			}
			if refunded != 1000 {
				t.Errorf("refunded at the processor = %d, want exactly the 1000 asked", refunded)
			}
			if net := e.netCharged(o.Id.String()); net != orderAmount-1000 {
				t.Errorf("net charged = %d, want %d", net, orderAmount-1000)
			}
			if got := e.onePayment(t, o.Id.String()).RefundedAmount; got != 1000 {
				t.Errorf("refunded_amount = %d, want 1000", got)
			}
		})
	}
}

// A processor that ignores keys and is slower than the settle window
// refunds twice: money sent back cannot be pulled back, so the sweep
// reports it on the refund (and in the log at error).
func TestDoubleRefundIsReported(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor(), withSettleWindow(700*time.Millisecond))
	_, p := e.paidOrder(t, e.a, "inv-1")
	e.sim.SetIgnoreIdempotencyKeys(true)
	const key = "double-refund"
	body := refundBody(1000)

	e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathRefunds, Kind: processorsim.FaultLateExecution, Latency: 2 * time.Second})
	wantProblem(t, e.refund(t, e.a.Key, key, p.Id.String(), body), http.StatusServiceUnavailable, httpapi.CodeOutcomeUnknown)
	final, _ := retryUntilFinal(t, func() response { return e.refund(t, e.a.Key, key, p.Id.String(), body) })
	wantStatus(t, final, http.StatusCreated)
	r := decodeRefund(t, final)
	e.waitIdle(t)
	if n := len(e.refundsUnder(refundKey(e.a.ID, key))); n != 2 {
		t.Fatalf("refunds under the key = %d, want 2 (the processor outlasted the window)", n)
	}

	duplicate := func() int {
		return e.count(t, `SELECT duplicate_amount::int FROM refunds WHERE id::text = $1`, r.Id.String())
	}
	e.sweepUntil(t, "the double refund flagged", func() bool { return duplicate() != 0 })
	if got := duplicate(); got != 1000 {
		t.Errorf("duplicate_amount = %d, want 1000", got)
	}
	if metrics := string(metricsText(t)); !regexp.MustCompile(`(?m)^payments_duplicate_refunds_total [1-9]`).MatchString(metrics) {
		t.Errorf("/metrics does not count the duplicate refund:\n%s", grepLines(metrics, "payments_"))
	}
	if n := len(e.sim.Refunds()); n != 2 {
		t.Errorf("refunds = %d, want 2: the sweep reports, it cannot pull money back", n)
	}
}

// Lookups read every page: the succeeded charge a lost call made sits on
// the second page, behind ten failed ones, and a second succeeded one
// beside it is a double charge the sweep refunds.
func TestReconciliationReadsEveryPage(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	e.sim.SetIgnoreIdempotencyKeys(true)
	o := e.newOrder(t, e.a, "inv-1")
	const key = "paged-key"
	body := payBody(o.Id.String(), cardVisa)
	derived := chargeKey(e.a.ID, key)

	e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultTimeout})
	wantProblem(t, e.pay(t, e.a.Key, key, body), http.StatusServiceUnavailable, httpapi.CodeOutcomeUnknown)
	row := e.onePayment(t, o.Id.String())
	md := map[string]string{"payment_id": row.ID, "order_id": o.Id.String()}
	for range simproc.DefaultListLimit + 1 {
		e.sim.CreateChargeDirect(processor.ChargeRequest{Amount: orderAmount, Currency: "EUR", PaymentMethod: cardDeclined, Metadata: md}, derived)
	}
	kept := e.sim.CreateChargeDirect(processor.ChargeRequest{Amount: orderAmount, Currency: "EUR", PaymentMethod: cardVisa, Metadata: md}, derived)
	dup := e.sim.CreateChargeDirect(processor.ChargeRequest{Amount: orderAmount, Currency: "EUR", PaymentMethod: cardVisa, Metadata: md}, derived)
	e.passSettleWindow(t, e.a.ID, endpointPayments, key)

	res := e.pay(t, e.a.Key, key, body)
	wantStatus(t, res, http.StatusCreated)
	p := decodePayment(t, res)
	if p.ChargeId == nil || *p.ChargeId != kept.ID {
		t.Errorf("charge_id = %v, want %s from the second page", p.ChargeId, kept.ID)
	}
	if posts := e.postedCalls(processorsim.PathCharges); len(posts) != 1 {
		t.Errorf("charge calls = %d, want 1: the charge existed, none may be added", len(posts))
	}
	e.sweepUntil(t, "the double charge refunded", func() bool { return e.netCharged(o.Id.String()) == orderAmount })
	refunds := e.sim.Refunds()
	if len(refunds) != 1 || refunds[0].Charge != dup.ID {
		t.Errorf("refunds = %+v, want the duplicate %s refunded", refunds, dup.ID)
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// decodeProblem reads a problem body without asserting on it.
func decodeProblem(t *testing.T, res response) api.Problem {
	t.Helper()
	var p api.Problem
	if err := json.Unmarshal(res.body, &p); err != nil {
		t.Fatalf("decode problem: %v; status %d, body: %s", err, res.status, res.body)
	}
	return p
}
