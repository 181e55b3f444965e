package payments_test

import (
	"errors"
	"testing"
	"time"

	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/processor/stripeproc"
	"github.com/idemref/payments/internal/tooling/stripefake"
)

// Stripe's Search API lags (S7): a PaymentIntent that exists may not be
// found for up to a minute. A charge whose answer was lost (a 500 after
// it executed) and whose search stays empty past the settle window, but
// inside the lag, must not be charged again: the payment waits until the
// window plus the adapter's LookupLag has passed, by which time the search
// shows the charge, and settles with it. The recorded Stripe here ignores
// keys (as Stripe does once a key is past its 24 hours, and as the rule
// must hold for any processor, S4), so a resend would be a second
// PaymentIntent, not a replay.
func TestEmptySearchInsideStripesLagMakesNoSecondCharge(t *testing.T) {
	t.Parallel()
	const (
		timeout = 500 * time.Millisecond
		settle  = time.Second     // how long the call may still land
		lag     = 3 * time.Second // how long the search may not show it
	)
	w := setup(t, 2*time.Second, timeout)
	fake := stripefake.Start(t)
	fake.IgnoreKeys()
	fake.SetSearchLag(lag)
	adapter := stripeproc.New(stripeproc.Config{APIKey: "sk_test_lag", URL: fake.URL, Timeout: timeout, SearchLag: lag})
	svc := payments.NewService(w.pool, idem.NewStore(w.pool, idem.Config{Lease: w.lease}), adapter, httpapi.Renderer{}, w.log,
		payments.Config{SettleWindow: settle})
	p := w.newPayment(t, "pay-lag", 2500)

	// The charge executes at Stripe; its answer is a 500.
	fake.Queue("/v1/payment_intents", stripefake.After, stripefake.ServerError)
	if _, _, err := svc.Pay(t.Context(), p.claim, p.in); !errors.Is(err, payments.ErrOutcomeUnknown) {
		t.Fatalf("Pay with a 500 after the charge = %v, want ErrOutcomeUnknown", err)
	}
	// When the attempt marked its call as sent: the settle window runs
	// from here.
	var sent time.Time
	if err := w.pool.QueryRow(t.Context(), `SELECT charge_sent_at FROM payments WHERE tenant_id = $1 AND order_id = $2`,
		w.tenant, p.order.ID).Scan(&sent); err != nil {
		t.Fatal(err)
	}

	// The client retries until it gets an answer, as long as the window
	// and the lag together, and some more.
	deadline := sent.Add(settle + lag + 5*time.Second)
	for {
		res, _, err := svc.Pay(t.Context(), p.claim, p.in)
		if err == nil {
			if res.Status != 201 {
				t.Fatalf("the payment answered %d: %s; want 201", res.Status, res.Body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer %s after the charge: %v", time.Since(sent).Round(time.Millisecond), err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	var posts, searchesInLag int
	for _, c := range fake.Calls() {
		switch {
		case c.Method == "POST" && c.Path == "/v1/payment_intents":
			posts++
		case c.Path == "/v1/payment_intents/search" && c.At.Sub(sent) > settle && c.At.Sub(sent) < lag:
			searchesInLag++ // empty by construction: the fake hides it for lag
		}
	}
	intents := fake.PaymentIntents()
	if posts != 1 || len(intents) != 1 {
		t.Fatalf("Stripe got %d charge calls and has %d PaymentIntents, want 1 and 1: an empty search inside the lag led to a resend", posts, len(intents))
	}
	// The case was there: searches found nothing after the settle window
	// had passed, while the lag had not.
	if searchesInLag == 0 {
		t.Fatal("no search ran between the settle window and the end of the lag: the test did not test the case")
	}
	if row := w.onePayment(t, p); row.Status != payments.StatusSucceeded || row.ChargeID != intents[0].ID {
		t.Errorf("payment = %+v, want succeeded with %s", row, intents[0].ID)
	}
}
