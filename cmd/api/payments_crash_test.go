package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/tooling/processorsim"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// bundle is one database, one tenant with one unpaid order, and a
// processor simulator that lives in the test process: it survives every
// API process the test kills, as a real processor would.
type bundle struct {
	pool    *pgxpool.Pool
	url     string
	apiKey  string
	sim     *processorsim.Simulator
	simURL  string
	orderID string
	// chargeGate, when armed, holds the next charge call at the
	// processor until released (see holdNextCharge).
	chargeArmed   atomic.Bool
	chargeArrived chan struct{}
	chargeRelease chan struct{}
}

const orderAmount = 4200

func setup(t *testing.T) *bundle {
	t.Helper()
	pool, url := testdb.NewPool(t)
	e := &bundle{pool: pool, url: url, apiKey: runTenantCreate(t, url, "payer"), sim: processorsim.New(processorsim.Config{})}
	e.chargeArrived, e.chargeRelease = make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == processorsim.PathCharges && e.chargeArmed.CompareAndSwap(true, false) {
			close(e.chargeArrived)
			<-e.chargeRelease
			// The API that sent this call is dead by now; the processor
			// still executes it, as a real one would.
			r = r.WithContext(context.WithoutCancel(r.Context()))
		}
		e.sim.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	e.simURL = srv.URL

	api := e.start(t)
	res, err := postOrder(api.base, e.apiKey, "order-key", fmt.Sprintf(`{"reference":"pay-me","customer_id":"c","amount":%d,"currency":"EUR"}`, orderAmount))
	if err != nil || res.status != http.StatusCreated {
		t.Fatalf("create order: %v %d %s", err, res.status, res.body)
	}
	var o struct{ ID string }
	_ = json.Unmarshal(res.body, &o)
	e.orderID = o.ID
	// Only the processes a test starts itself may take part in its payment
	// (relay and consumer included).
	if err := api.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-api.exited
	return e
}

// start runs an API process for this environment. Leases and the settle
// window are short so takeovers and resends happen within the test; the
// completer is off unless asked for.
func (e *bundle) start(t *testing.T, env ...string) *serverProcess {
	base := []string{"PROCESSOR_URL=" + e.simURL, "PROCESSOR_TIMEOUT=500ms", "PAYMENT_LEASE=1500ms",
		"PROCESSOR_SETTLE_WINDOW=1s", "COMPLETER_INTERVAL=0",
		// Redeliveries and relay takeovers within the test's time.
		"EVENTS_ACK_WAIT=300ms", "OUTBOX_CLAIM_HOLD=500ms"}
	return startServer(t, e.url, append(base, env...)...)
}

func (e *bundle) payBody() string {
	return fmt.Sprintf(`{"order_id":%q,"amount":%d,"currency":"EUR","payment_method":"pm_card_visa"}`, e.orderID, orderAmount)
}

func (e *bundle) pay(base, key string) (response, error) {
	return post(base, e.apiKey, "/v1/payments", key, e.payBody())
}

// payUntilDone retries like a well-behaved client: on 409 in progress, or
// 503 while the charge's outcome is not known yet, it waits and tries again
// with the same key.
func (e *bundle) payUntilDone(t *testing.T, base, key string) response {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := e.pay(base, key)
		if err != nil {
			t.Fatal(err)
		}
		switch code := problemCode(t, res.body); {
		case res.status == http.StatusConflict && code == "idempotency_key_in_use":
		case res.status == http.StatusServiceUnavailable && code == "processor_outcome_unknown":
		default:
			return res
		}
		if time.Now().After(deadline) {
			t.Fatal("still in progress after 20s")
		}
		time.Sleep(200 * time.Millisecond) // the client's backoff, not a synchronisation
	}
}

// assertPaidOnce checks the side effects of one payment: one charge at the
// processor, one succeeded payment row, the order paid once.
func (e *bundle) assertPaidOnce(t *testing.T) {
	t.Helper()
	if n := len(e.sim.Charges()); n != 1 {
		t.Errorf("charges at the processor = %d, want 1", n)
	}
	if n := count(t, e.pool, `SELECT count(*) FROM payments WHERE status = 'succeeded'`); n != 1 {
		t.Errorf("succeeded payments = %d, want 1", n)
	}
	if n := count(t, e.pool, `SELECT count(*) FROM payments`); n != 1 {
		t.Errorf("payment rows = %d, want 1", n)
	}
	// The order follows the payment.succeeded event through the relay and
	// the orders consumer: eventually, and once.
	testkit.WaitFor(t, 20*time.Second, func() bool {
		return count(t, e.pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'orders'`) == 1
	})
	if paid := count(t, e.pool, `SELECT amount_paid FROM orders WHERE id = $1`, e.orderID); paid != orderAmount {
		t.Errorf("order amount_paid = %d, want %d", paid, orderAmount)
	}
}

// T4: the API process is killed (SIGKILL) between the payment's steps.
// After a restart, a client retry, or separately the completer with no
// client at all, finishes the payment with exactly one charge.
func TestPaymentSurvivesCrashBetweenSteps(t *testing.T) {
	t.Parallel()
	windows := []struct {
		name          string
		failpoint     string // "" = killed by the test during the charge call
		chargesBefore int    // charges at the processor when the process died
	}{
		// Transaction 1 commits the payment marked charge_sent: a crash
		// before the call leaves a mark with nothing behind it, which the
		// finisher waits out (the settle window) before it charges.
		{"AfterTransaction1BeforeCall", "payment-after-create", 0},
		{"DuringTheChargeCall", "", 1},
		{"AfterChargeBeforeTransaction2", "payment-after-charge", 1},
	}
	for _, w := range windows {
		for _, finisher := range []string{"ClientRetry", "Completer"} {
			t.Run(w.name+"/"+finisher, func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				crash(t, e, w.failpoint)
				if n := len(e.sim.Charges()); n != w.chargesBefore {
					t.Fatalf("charges when the process died = %d, want %d", n, w.chargesBefore)
				}
				if n := count(t, e.pool, `SELECT count(*) FROM idempotency_keys WHERE endpoint = 'POST /v1/payments' AND state = 'in_progress'`); n != 1 {
					t.Fatalf("unfinished payment keys = %d, want 1", n)
				}

				var final response
				switch finisher {
				case "ClientRetry":
					api := e.start(t)
					final = e.payUntilDone(t, api.base, "pay-key")
				case "Completer":
					api := e.start(t, "COMPLETER_INTERVAL=100ms")
					testkit.WaitFor(t, 20*time.Second, func() bool {
						return count(t, e.pool, `SELECT count(*) FROM idempotency_keys WHERE endpoint = 'POST /v1/payments' AND state = 'completed'`) == 1
					})
					// The client comes back late and gets what the completer recorded.
					var err error
					if final, err = e.pay(api.base, "pay-key"); err != nil {
						t.Fatal(err)
					}
					if final.header.Get("Idempotent-Replayed") != "true" {
						t.Errorf("late retry was not a replay of the completer's record")
					}
				}
				if final.status != http.StatusCreated {
					t.Fatalf("final answer %d: %s", final.status, final.body)
				}
				e.assertPaidOnce(t)
			})
		}
	}
}

// crash sends the payment to an API process and kills it at the window:
// through a failpoint, or (failpoint "") by SIGKILL while the charge call
// is held at the processor, which executes it after the API died.
func crash(t *testing.T, e *bundle, failpoint string) {
	t.Helper()
	if failpoint != "" {
		api := e.start(t, "FAILPOINTS="+failpoint+"=kill")
		if _, err := e.pay(api.base, "pay-key"); err == nil {
			t.Fatal("the payment answered; the failpoint should have killed the server first")
		}
		if !api.killedBySIGKILL(t) {
			t.Fatalf("server exit: %v, want death by SIGKILL", api.cmd.ProcessState)
		}
		return
	}
	e.chargeArmed.Store(true)
	api := e.start(t)
	go func() { _, _ = e.pay(api.base, "pay-key") }()
	<-e.chargeArrived
	if err := api.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if !api.killedBySIGKILL(t) {
		t.Fatalf("server exit: %v", api.cmd.ProcessState)
	}
	close(e.chargeRelease)
	testkit.WaitFor(t, 20*time.Second, func() bool { return len(e.sim.Charges()) == 1 })
}

// T2 for payments: 50 identical payment requests under one key, in
// parallel over three API processes: one charge.
func TestConcurrentPaymentsAcrossProcesses(t *testing.T) {
	t.Parallel()
	e := setup(t)
	apis := []*serverProcess{e.start(t), e.start(t), e.start(t)}
	results := testkit.Fire(t, 50, func(i int) (response, error) { return e.pay(apis[i%3].base, "same-pay-key") })
	var fresh int
	for _, r := range results {
		switch {
		case r.status == http.StatusCreated && r.header.Get("Idempotent-Replayed") != "true":
			fresh++
		case r.status == http.StatusCreated:
		case r.status == http.StatusConflict && problemCode(t, r.body) == "idempotency_key_in_use":
		default:
			t.Fatalf("unexpected response %d: %s", r.status, r.body)
		}
	}
	if fresh != 1 {
		t.Errorf("fresh 201s = %d, want 1", fresh)
	}
	// Requests that got 409 retry until done; all agree.
	final := e.payUntilDone(t, apis[0].base, "same-pay-key")
	if final.status != http.StatusCreated {
		t.Fatalf("final %d %s", final.status, final.body)
	}
	e.assertPaidOnce(t)
	if calls := chargeCalls(e); calls != 1 {
		t.Errorf("charge calls at the processor = %d, want 1", calls)
	}
}

func chargeCalls(e *bundle) int {
	n := 0
	for _, c := range e.sim.Calls() {
		if c.Method == http.MethodPost && c.Path == processorsim.PathCharges {
			n++
		}
	}
	return n
}

// S3: an attempt that stalls past its lease is fenced off. Process A pauses
// after the charge returned (a long GC pause, a stuck disk); its lease
// expires; the client's retry on process B takes over (generation 2),
// finds the charge and completes. When A wakes up, its write finds a newer
// generation and stops without touching anything: the order is not paid
// twice and the recorded response is B's.
func TestStalledAttemptCannotOverwriteTakeover(t *testing.T) {
	t.Parallel()
	e := setup(t)
	stalled := e.start(t, "FAILPOINTS=payment-after-charge=sleep:4s")
	fresh := e.start(t)

	first := make(chan response, 1)
	go func() {
		res, err := e.pay(stalled.base, "fenced-key")
		if err != nil {
			t.Error(err)
		}
		first <- res
	}()
	testkit.WaitFor(t, 20*time.Second, func() bool { return len(e.sim.Charges()) == 1 })
	testkit.WaitFor(t, 20*time.Second, func() bool {
		return count(t, e.pool, `SELECT count(*) FROM idempotency_keys WHERE idem_key = 'fenced-key' AND locked_until < now()`) == 1
	})

	second, err := e.pay(fresh.base, "fenced-key")
	if err != nil {
		t.Fatal(err)
	}
	if second.status != http.StatusCreated {
		t.Fatalf("takeover answered %d: %s", second.status, second.body)
	}
	stalledRes := <-first
	if stalledRes.status != http.StatusConflict || problemCode(t, stalledRes.body) != "idempotency_key_in_use" {
		t.Errorf("the stalled attempt answered %d %s, want 409 idempotency_key_in_use", stalledRes.status, stalledRes.body)
	}

	var gen int
	var stored []byte
	if err := e.pool.QueryRow(context.Background(),
		`SELECT lease_generation, response_body FROM idempotency_keys WHERE idem_key = 'fenced-key' AND state = 'completed'`).
		Scan(&gen, &stored); err != nil {
		t.Fatal(err)
	}
	if gen != 2 {
		t.Errorf("lease generation = %d, want 2 (one takeover)", gen)
	}
	if string(stored) != string(second.body) {
		t.Errorf("recorded response is not the takeover's:\n%s\n%s", stored, second.body)
	}
	e.assertPaidOnce(t)
}

// The completer also runs on its own (`api completer`), without the HTTP
// server: it finishes a payment abandoned after transaction 1.
func TestStandaloneCompleterFinishesAbandonedPayment(t *testing.T) {
	t.Parallel()
	e := setup(t)
	crash(t, e, "payment-after-create")

	cmd := exec.Command(apiBinary(t), "completer")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+e.url, "PROCESSOR_URL="+e.simURL,
		"PROCESSOR_TIMEOUT=500ms", "PAYMENT_LEASE=1500ms", "PROCESSOR_SETTLE_WINDOW=1s", "COMPLETER_INTERVAL=100ms")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	testkit.WaitFor(t, 20*time.Second, func() bool {
		return count(t, e.pool, `SELECT count(*) FROM idempotency_keys WHERE endpoint = 'POST /v1/payments' AND state = 'completed'`) == 1
	})
	// The completer wrote the payment's event to the outbox; the order
	// follows once an API process relays and consumes it.
	e.start(t)
	e.assertPaidOnce(t)
}
