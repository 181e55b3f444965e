package payments_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/tooling/processorsim"
)

// The completer (S1) finishes payments whose client went away, from what
// the database says alone. Every test checks the side effects themselves:
// payments, orders and idempotency_keys rows, and the charges and calls
// the processor simulator recorded (T4).

const (
	// shortLease lets a payment abandoned mid-way be taken over soon.
	shortLease = 300 * time.Millisecond
	// shortTimeout bounds one processor call; shorter than the lease, as
	// one step must fit in it.
	shortTimeout = 100 * time.Millisecond
)

// The transient processor failures a charge call can meet.
var chargeFaults = []processorsim.FaultKind{
	processorsim.FaultTimeout,
	processorsim.FaultServerError,
	processorsim.FaultLostResponse,
}

func TestCompleterFinishesAbandonedPayments(t *testing.T) {
	t.Parallel()
	w := setup(t, shortLease, shortTimeout)
	bound := deadline(t)

	// Thirty clients each send a payment, get a 503 because the charge
	// call failed, and never come back.
	const n = 30
	var abandoned []payment
	for i := range n {
		p := w.newPayment(t, fmt.Sprintf("pay-%02d", i), 1000+int64(i))
		w.abandon(t, bound, p, chargeFaults[i%len(chargeFaults)])
		abandoned = append(abandoned, p)
	}
	faulted := map[processorsim.FaultKind]int{}
	for _, c := range w.sim.Calls() {
		if c.Fault != "" {
			faulted[c.Fault]++
		}
	}
	wantFaulted := map[processorsim.FaultKind]int{}
	for i := range n {
		wantFaulted[chargeFaults[i%len(chargeFaults)]]++
	}
	if diff := cmp.Diff(wantFaulted, faulted); diff != "" {
		t.Fatalf("faults taken by the charge calls (-want +got):\n%s", diff)
	}
	// Only the lost responses charged; nobody knows it yet.
	if got, want := len(w.sim.Charges()), wantFaulted[processorsim.FaultLostResponse]; got != want {
		t.Fatalf("the processor has %d charges before the completers ran, want %d", got, want)
	}

	// Three API processes, each running a completer, share the work.
	ctx, stop := context.WithCancel(bound)
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() }) // before the pools close, even on failure
	for range 3 {
		svc := w.process(t)
		wg.Go(func() { payments.NewCompleter(svc, 20*time.Millisecond).Run(ctx) })
	}
	waitFor(t, bound, w.pool, `SELECT count(*) = $1 FROM idempotency_keys WHERE endpoint = $2 AND state = 'completed'`,
		n, payments.EndpointPay)
	stop()
	wg.Wait()

	t.Run("EachPaymentSucceededWithOneCharge", func(t *testing.T) {
		for _, p := range abandoned {
			w.wantPaid(t, p)
		}
		if got := len(w.sim.Charges()); got != n {
			t.Errorf("the processor has %d charges in all, want %d", got, n)
		}
	})

	t.Run("ClientRetryReplaysByteForByte", func(t *testing.T) {
		calls := len(w.sim.Calls())
		for _, p := range abandoned {
			want, _ := w.recorded(t, p.claim)
			res, replayed, err := w.svc.Pay(bound, p.claim, p.in)
			if err != nil || !replayed {
				t.Fatalf("retry of %s: replayed = %v, err = %v; want the replay", p.claim.Key, replayed, err)
			}
			if diff := cmp.Diff(want, res); diff != "" {
				t.Errorf("replay of %s (-recorded +replayed):\n%s", p.claim.Key, diff)
			}
			if !bytes.Equal(want.Body, res.Body) {
				t.Errorf("replay of %s is not byte for byte:\nrecorded: %s\nreplayed: %s", p.claim.Key, want.Body, res.Body)
			}
		}
		if got := len(w.sim.Calls()); got != calls {
			t.Errorf("the replays made %d processor calls, want 0", got-calls)
		}
		if got := len(w.sim.Charges()); got != n {
			t.Errorf("the processor has %d charges after the replays, want %d", got, n)
		}
	})
}

func TestCompleterLeavesLiveAndCompletedKeysAlone(t *testing.T) {
	t.Parallel()
	// A lease that outlives the test: the in-flight payment's lease is
	// live however slow the machine is. The processor timeout stays
	// below it, as it must.
	w := setup(t, time.Hour, 30*time.Second)
	bound := deadline(t)
	completer := payments.NewCompleter(w.process(t), time.Hour)

	done := w.newPayment(t, "pay-done", 2500)
	if res, replayed, err := w.svc.Pay(bound, done.claim, done.in); err != nil || replayed || res.Status != http.StatusCreated {
		t.Fatalf("Pay = %d %s, replayed %v, %v; want 201", res.Status, res.Body, replayed, err)
	}
	doneKey := w.snapshot(t, done.claim)

	// A payment in flight: its charge call is held at the processor.
	flying := w.newPayment(t, "pay-in-flight", 4200)
	w.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultTimeout})
	flightCtx, cancelFlight := context.WithCancel(bound)
	defer cancelFlight()
	flight := make(chan error, 1)
	go func() {
		_, _, err := w.svc.Pay(flightCtx, flying.claim, flying.in)
		flight <- err
	}()
	eventually(t, bound, "the charge call to reach the processor", func() bool {
		return len(w.chargeCalls(flying.chargeKey())) == 1
	})
	w.wantKey(t, flying.claim, keyRow{State: "in_progress", RecoveryPoint: "charge_sent", Generation: 1, Lock: "live"})
	flyingKey := w.snapshot(t, flying.claim)

	t.Run("SkipsLiveLeaseAndCompletedKey", func(t *testing.T) {
		calls := len(w.sim.Calls())
		if got := completer.RunOnce(bound); got != 0 {
			t.Errorf("RunOnce finished %d payments, want 0", got)
		}
		if diff := cmp.Diff(flyingKey, w.snapshot(t, flying.claim)); diff != "" {
			t.Errorf("the completer changed a live lease (-before +after):\n%s", diff)
		}
		if diff := cmp.Diff(doneKey, w.snapshot(t, done.claim)); diff != "" {
			t.Errorf("the completer changed a completed key (-before +after):\n%s", diff)
		}
		if got := len(w.sim.Calls()); got != calls {
			t.Errorf("the completer made %d processor calls, want 0", got-calls)
		}
		w.wantPaymentStatus(t, flying, payments.StatusChargeSent)
		w.wantPaid(t, done)
	})

	// The client gives up: its attempt releases the key.
	cancelFlight()
	if err := <-flight; !errors.Is(err, payments.ErrOutcomeUnknown) {
		t.Fatalf("Pay whose client gave up: %v; want ErrOutcomeUnknown", err)
	}
	w.wantKey(t, flying.claim, keyRow{State: "in_progress", RecoveryPoint: "charge_sent", Generation: 1, Lock: "expired"})

	t.Run("WaitsWhileTheCallMayStillLand", func(t *testing.T) {
		calls := len(w.sim.Calls())
		if got := completer.RunOnce(bound); got != 0 {
			t.Errorf("RunOnce finished %d payments inside the settle window, want 0", got)
		}
		if got := len(w.chargeCalls(flying.chargeKey())); got != 1 {
			t.Errorf("%d charge calls inside the settle window, want the first one only", got)
		}
		if got := len(w.sim.Calls()) - calls; got != 1 {
			t.Errorf("the completer made %d processor calls, want 1 (the lookup)", got)
		}
		w.wantPaymentStatus(t, flying, payments.StatusChargeSent)
	})

	t.Run("FinishesItOnceSettled", func(t *testing.T) {
		w.passSettleWindow(t, flying)
		if got := completer.RunOnce(bound); got != 1 {
			t.Fatalf("RunOnce finished %d payments, want 1", got)
		}
		w.wantPaid(t, flying)
		w.wantKey(t, flying.claim, keyRow{State: "completed", RecoveryPoint: "finished", Generation: 3, Lock: "none"})
		if diff := cmp.Diff(doneKey, w.snapshot(t, done.claim)); diff != "" {
			t.Errorf("the completer changed a completed key (-before +after):\n%s", diff)
		}
		if got := len(w.sim.Charges()); got != 2 {
			t.Errorf("the processor has %d charges, want 2", got)
		}
	})
}

func TestCompleterWhileProcessorFails(t *testing.T) {
	t.Parallel()

	t.Run("ProcessorDown", func(t *testing.T) {
		t.Parallel()
		w := setup(t, shortLease, shortTimeout)
		bound := deadline(t)
		completer := payments.NewCompleter(w.svc, time.Hour)
		p := w.newPayment(t, "pay-1", 2500)
		w.abandon(t, bound, p, processorsim.FaultServerError)

		w.gate.down.Store(true)
		for attempt := range 3 {
			w.waitLeaseExpired(t, bound, p.claim)
			refused := w.gate.refused.Load()
			if got := completer.RunOnce(bound); got != 0 {
				t.Fatalf("attempt %d: RunOnce finished %d payments with the processor down, want 0", attempt, got)
			}
			if w.gate.refused.Load() == refused {
				t.Errorf("attempt %d: the completer never called the processor", attempt)
			}
			// Taken over (a new generation), then released at charge_sent
			// for the next try.
			w.wantKey(t, p.claim, keyRow{State: "in_progress", RecoveryPoint: "charge_sent", Generation: int64(2 + attempt), Lock: "expired"})
			w.wantPaymentStatus(t, p, payments.StatusChargeSent)
			if o := w.orderOf(t, p); o.Succeeded != 0 {
				t.Errorf("attempt %d: %d payment.succeeded events with the processor down", attempt, o.Succeeded)
			}
		}
		if got := w.sim.Charges(); len(got) != 0 {
			t.Fatalf("charges while the processor was down: %+v", got)
		}

		w.gate.down.Store(false)
		t.Run("FinishesWhenTheProcessorIsBack", func(t *testing.T) {
			w.passSettleWindow(t, p)
			if got := completer.RunOnce(bound); got != 1 {
				t.Fatalf("RunOnce finished %d payments, want 1", got)
			}
			w.wantPaid(t, p)
			if got := len(w.chargeCalls(p.chargeKey())); got != 2 {
				t.Errorf("%d charge calls reached the processor, want 2 (the first attempt's and the completer's)", got)
			}
		})
	})

	t.Run("ChargeFaults", func(t *testing.T) {
		t.Parallel()
		w := setup(t, shortLease, shortTimeout)
		bound := deadline(t)
		completer := payments.NewCompleter(w.svc, time.Hour)
		p := w.newPayment(t, "pay-1", 2500)
		w.abandon(t, bound, p, processorsim.FaultServerError)

		for attempt, fault := range chargeFaults {
			w.passSettleWindow(t, p)
			w.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: fault})
			if got := completer.RunOnce(bound); got != 0 {
				t.Fatalf("RunOnce with a %s fault finished %d payments, want 0", fault, got)
			}
			calls := w.chargeCalls(p.chargeKey())
			if len(calls) != 2+attempt || calls[len(calls)-1].Fault != fault {
				t.Fatalf("after the %s fault the charge calls are %+v; want %d, the last one faulted", fault, calls, 2+attempt)
			}
			w.wantKey(t, p.claim, keyRow{State: "in_progress", RecoveryPoint: "charge_sent", Generation: int64(2 + attempt), Lock: "expired"})
			w.wantPaymentStatus(t, p, payments.StatusChargeSent)
		}
		// The lost response charged the card; the payment does not know.
		lost := w.chargesWithKey(p.chargeKey())
		if len(lost) != 1 || lost[0].Status != processor.StatusSucceeded {
			t.Fatalf("charges after a lost response: %+v; want one succeeded", lost)
		}

		t.Run("FinishesWithTheChargeAlreadyMade", func(t *testing.T) {
			w.passSettleWindow(t, p)
			if got := completer.RunOnce(bound); got != 1 {
				t.Fatalf("RunOnce finished %d payments, want 1", got)
			}
			w.wantPaid(t, p)
			if got := w.onePayment(t, p).ChargeID; got != lost[0].ID {
				t.Errorf("payment records charge %s, want the one the lost response made, %s", got, lost[0].ID)
			}
			// Reconciliation found the charge: no charge call this time.
			if got := len(w.chargeCalls(p.chargeKey())); got != 1+len(chargeFaults) {
				t.Errorf("%d charge calls reached the processor, want %d", got, 1+len(chargeFaults))
			}
		})
	})
}
