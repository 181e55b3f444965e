package httpapi_test

import (
	"bytes"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// held is a payment whose first attempt the processor holds: the charge
// takes hold, so its key stays in flight that long.
const held = 2 * time.Second

// setupHeld is a world whose processor takes held over every charge, and
// an order of tenant a to pay.
func setupHeld(t *testing.T, limits idem.WaitLimits) (*bundle, string) {
	t.Helper()
	e := setup(t, withProcessor(), withProcessorTimeout(held+3*time.Second), withSettleWindow(held+4*time.Second), withPreferWait(limits))
	order := e.newOrder(t, e.a, "held")
	e.sim.SetLatency(held)
	return e, idString(&order.Id)
}

// L7 within one process: the duplicate that asks to wait gets the first
// attempt's 201, replayed, with Preference-Applied; without the header,
// the 409 of today; with a wait too short, the 409 after the wait, with
// Preference-Applied saying how long it waited. One charge, one payment.
func TestPreferWaitReplaysOrTimesOut(t *testing.T) {
	t.Parallel()
	e, orderID := setupHeld(t, idem.WaitLimits{Max: 5 * time.Second, PerTenant: 8, PerProcess: 8})
	body := payBody(orderID, cardVisa)
	first := make(chan response, 1)
	go func() { first <- e.pay(t, e.a.Key, "pay-held", body) }()
	testkit.WaitFor(t, 5*time.Second, func() bool { return len(e.sim.Calls()) > 0 })

	step(t, "WithoutPreferenceIs409AtOnce", func(t *testing.T) {
		res := e.pay(t, e.a.Key, "pay-held", body)
		wantProblem(t, res, http.StatusConflict, "idempotency_key_in_use")
		if got := res.header.Get("Preference-Applied"); got != "" {
			t.Errorf("Preference-Applied = %q without a preference", got)
		}
	})
	step(t, "ShortWaitIs409AfterIt", func(t *testing.T) {
		start := time.Now()
		res := e.pay(t, e.a.Key, "pay-held", body, withHeader("Prefer", "wait=1"))
		wantProblem(t, res, http.StatusConflict, "idempotency_key_in_use")
		wantRetryAfter(t, res)
		if got := res.header.Get("Preference-Applied"); got != "wait=1" {
			t.Errorf("Preference-Applied = %q, want wait=1", got)
		}
		if took := time.Since(start); took < time.Second || took > 1500*time.Millisecond {
			t.Errorf("answered after %s, want about the second it asked for", took)
		}
	})
	step(t, "LongWaitReplaysTheFirstAnswer", func(t *testing.T) {
		// Asks for more than the maximum: capped to it.
		res := e.pay(t, e.a.Key, "pay-held", body, withHeader("Prefer", "respond-async, wait=60"))
		firstRes := <-first
		wantStatus(t, firstRes, http.StatusCreated)
		wantReplay(t, firstRes, res)
		if got := res.header.Get("Preference-Applied"); got != "wait=5" {
			t.Errorf("Preference-Applied = %q, want wait=5 (the maximum)", got)
		}
		if !bytes.Equal(res.body, firstRes.body) {
			t.Errorf("replayed body differs")
		}
	})
	if n := len(e.sim.Charges()); n != 1 {
		t.Errorf("charges at the processor = %d, want 1", n)
	}
	if n := e.count(t, `SELECT count(*) FROM payments`); n != 1 {
		t.Errorf("payment rows = %d, want 1", n)
	}
}

// L7's bounds: waiters are counted per tenant and per process; a duplicate
// past either bound gets the 409 at once, without Preference-Applied, and
// is counted as refused, while the one within the bound still gets the
// replay. Not parallel: it reads the process's waiter gauge.
func TestPreferWaitRefusesPastTheBound(t *testing.T) {
	for _, tt := range []struct {
		name   string
		limits idem.WaitLimits
	}{
		{"PerTenant", idem.WaitLimits{Max: 5 * time.Second, PerTenant: 1, PerProcess: 8}},
		{"PerProcess", idem.WaitLimits{Max: 5 * time.Second, PerTenant: 8, PerProcess: 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e, orderID := setupHeld(t, tt.limits)
			body := payBody(orderID, cardVisa)
			first := make(chan response, 1)
			go func() { first <- e.pay(t, e.a.Key, "pay-bound", body) }()
			testkit.WaitFor(t, 5*time.Second, func() bool { return len(e.sim.Calls()) > 0 })

			waiting := make(chan response, 1)
			go func() { waiting <- e.pay(t, e.a.Key, "pay-bound", body, withHeader("Prefer", "wait=5")) }()
			testkit.WaitFor(t, 5*time.Second, func() bool { return testkit.Gauge(t, "idempotency_waiters") == 1 })
			refusedBefore := counter(t, "idempotency_waits_total", "refused")

			start := time.Now()
			res := e.pay(t, e.a.Key, "pay-bound", body, withHeader("Prefer", "wait=5"))
			wantProblem(t, res, http.StatusConflict, "idempotency_key_in_use")
			if took := time.Since(start); took > time.Second {
				t.Errorf("the refused duplicate took %s, want its 409 at once", took)
			}
			if got := res.header.Get("Preference-Applied"); got != "" {
				t.Errorf("Preference-Applied = %q on a refused wait", got)
			}
			if got := counter(t, "idempotency_waits_total", "refused") - refusedBefore; got != 1 {
				t.Errorf("refused waits counted %v, want 1", got)
			}

			firstRes := <-first
			wantStatus(t, firstRes, http.StatusCreated)
			wantReplay(t, firstRes, <-waiting)
			if n := len(e.sim.Charges()); n != 1 {
				t.Errorf("charges at the processor = %d, want 1", n)
			}
			if n := e.count(t, `SELECT count(*) FROM payments`); n != 1 {
				t.Errorf("payment rows = %d, want 1", n)
			}
			testkit.WaitFor(t, 5*time.Second, func() bool { return testkit.Gauge(t, "idempotency_waiters") == 0 })
		})
	}
}

// counter sums a counter's series whose outcome label is outcome.
func counter(t *testing.T, name, outcome string) float64 {
	t.Helper()
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}
