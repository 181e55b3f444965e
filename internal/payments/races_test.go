package payments_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/reaper"
	"github.com/idemref/payments/internal/tooling/processorsim"
)

// Interleavings of our own writers (a resumed attempt, a webhook, the
// completer, the reaper), each pinned by hand at the point where it broke
// the books before the transitions were guarded. The schedule explorer
// (explorer_test.go) looks for the ones nobody thought of.

// A resumed attempt looks its earlier call up and finds nothing, the
// settle window having passed; right then the earlier call lands and its
// webhook settles the payment. The attempt's resend must not move the
// settled payment back to charge_sent: it would be settled again, with a
// second payment.succeeded event, and the order credited twice.
func TestResendAfterAWebhookSettledThePaymentCreditsOnce(t *testing.T) {
	t.Parallel()
	w := setup(t, shortLease, shortTimeout)
	bound := deadline(t)
	p := w.newPayment(t, "pay-webhook-race", 1500)
	w.abandon(t, bound, p, processorsim.FaultTimeout)
	w.passSettleWindow(t, p)
	pay := w.onePayment(t, p)

	// The retry's lookup finds nothing; after it answered, the earlier call
	// lands at the processor with the same derived key and parameters, and
	// the processor's webhook for it is delivered.
	w.gate.interceptOnce(func(rw http.ResponseWriter, r *http.Request, next http.Handler) bool {
		if r.Method != http.MethodGet || r.URL.Path != processorsim.PathCharges {
			return false
		}
		lookup := httptest.NewRecorder()
		next.ServeHTTP(lookup, r)
		body, _ := json.Marshal(processor.ChargeRequest{
			Amount: p.in.Amount, Currency: p.in.Currency, PaymentMethod: p.in.PaymentMethod,
			Metadata: map[string]string{"payment_id": pay.ID.String(), "order_id": p.order.ID.String()},
		})
		late := httptest.NewRequest(http.MethodPost, processorsim.PathCharges, bytes.NewReader(body))
		late.Header.Set("Content-Type", "application/json")
		late.Header.Set("Idempotency-Key", p.chargeKey())
		landed := httptest.NewRecorder()
		next.ServeHTTP(landed, late)
		var ch processor.Charge
		if err := json.Unmarshal(landed.Body.Bytes(), &ch); landed.Code != http.StatusOK || err != nil {
			t.Errorf("the late call got %d %s: %v", landed.Code, landed.Body, err)
		}
		w.deliverChargeSucceeded(t, ch)
		for k, v := range lookup.Header() {
			rw.Header()[k] = v
		}
		rw.WriteHeader(lookup.Code)
		_, _ = rw.Write(lookup.Body.Bytes())
		return true
	})

	res, replayed, err := w.svc.Pay(bound, p.claim, p.in)
	if err != nil || replayed || res.Status != http.StatusCreated {
		t.Fatalf("retry = %d %s, replayed %v, %v; want a fresh 201", res.Status, res.Body, replayed, err)
	}
	w.wantPaid(t, p)
	if calls := w.chargeCalls(p.chargeKey()); len(calls) != 2 {
		t.Errorf("charge calls = %d, want 2 (the timed-out call and its late landing; no resend): %+v", len(calls), calls)
	}
}

// A charge call lands twice at a processor that ignores keys, its answer
// lost, and the webhook of one charge settles the payment before the
// attempt that resumed records it; the other charge's webhook never comes.
// Whatever the attempt knows of the second charge (its lookup found it), or
// could not know (it never looked after the payment was settled), must
// reach the sweep: with one marked call nothing else makes it look, and the
// customer would stay charged twice (issue 27, part 4; the explorer's
// double-charge-webhook scenario finds the first two schedules).
func TestASecondChargeIsRefundedWhenAWebhookSettledThePaymentFirst(t *testing.T) {
	t.Parallel()

	// twice puts the two charges of one call in place, as the processor
	// made them, and returns them in the order the lookup lists them.
	twice := func(w *bundle, p payment) (kept, second processor.Charge) {
		pay := w.onePayment(t, p)
		req := processor.ChargeRequest{
			Amount: p.in.Amount, Currency: p.in.Currency, PaymentMethod: p.in.PaymentMethod,
			Metadata: map[string]string{"payment_id": pay.ID.String(), "order_id": p.order.ID.String()},
		}
		if made := w.chargesWithKey(p.chargeKey()); len(made) == 0 {
			w.sim.CreateChargeDirect(req, p.chargeKey())
		}
		w.sim.CreateChargeDirect(req, p.chargeKey())
		made := w.chargesWithKey(p.chargeKey())
		return made[0], made[1]
	}
	// settledOnce runs the retry and checks that it recorded the payment
	// as the webhook settled it, and that the sweep, due at once with no
	// webhook of the second charge, refunds that one and only that one.
	// kept and second are read once the retry returned.
	settledOnce := func(t *testing.T, w *bundle, ctx context.Context, p payment, keptAt, secondAt *processor.Charge) {
		t.Helper()
		res, replayed, err := w.svc.Pay(ctx, p.claim, p.in)
		kept, second := *keptAt, *secondAt
		if err != nil || replayed || res.Status != http.StatusCreated {
			t.Fatalf("retry = %d %s, replayed %v, %v; want a fresh 201", res.Status, res.Body, replayed, err)
		}
		if pay := w.onePayment(t, p); pay.Status != payments.StatusSucceeded || pay.ChargeID != kept.ID {
			t.Fatalf("payment = %+v, want succeeded with the webhook's charge %s", pay, kept.ID)
		}
		if n, err := w.svc.Sweep(ctx, 10); err != nil || n != 1 {
			t.Fatalf("Sweep = %d, %v; want the payment swept", n, err)
		}
		refunded := map[string]int64{}
		for _, ch := range w.chargesWithKey(p.chargeKey()) {
			refunded[ch.ID] = ch.RefundedAmount
		}
		if diff := cmp.Diff(map[string]int64{kept.ID: 0, second.ID: second.Amount}, refunded); diff != "" {
			t.Errorf("refunded per charge (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(orderEvents{Succeeded: 1, Amount: p.order.Amount}, w.orderOf(t, p)); diff != "" {
			t.Errorf("order (-want +got):\n%s", diff)
		}
		if calls := w.chargeCalls(p.chargeKey()); len(calls) != 1 {
			t.Errorf("charge calls = %d, want the first one only (no resend): %+v", len(calls), calls)
		}
	}

	t.Run("BetweenTheLookupAndItsRecord", func(t *testing.T) {
		t.Parallel()
		w := setup(t, shortLease, shortTimeout)
		bound := deadline(t)
		w.sim.SetIgnoreIdempotencyKeys(true)
		p := w.newPayment(t, "pay-lookup-webhook-record", 1500)
		w.abandon(t, bound, p, processorsim.FaultLostResponse)
		kept, second := twice(w, p)
		// The retry's lookup finds both and keeps the first; before the
		// retry records it, the first's webhook settles the payment.
		w.gate.interceptOnce(func(rw http.ResponseWriter, r *http.Request, next http.Handler) bool {
			if r.Method != http.MethodGet || r.URL.Path != processorsim.PathCharges {
				return false
			}
			next.ServeHTTP(rw, r)
			w.deliverChargeSucceeded(t, kept)
			return true
		})
		settledOnce(t, w, bound, p, &kept, &second)
	})

	t.Run("BeforeTheResumedAttemptLooked", func(t *testing.T) {
		t.Parallel()
		w := setup(t, shortLease, shortTimeout)
		bound := deadline(t)
		w.sim.SetIgnoreIdempotencyKeys(true)
		p := w.newPayment(t, "pay-webhook-before-lookup", 1500)
		w.abandon(t, bound, p, processorsim.FaultLostResponse)
		kept, second := twice(w, p)
		// Settled before the retry comes: it has nothing to look up for
		// the payment, and sees nothing of the second charge.
		w.deliverChargeSucceeded(t, kept)
		settledOnce(t, w, bound, p, &kept, &second)
	})

	t.Run("BeforeTheResendIsMarked", func(t *testing.T) {
		t.Parallel()
		w := setup(t, shortLease, shortTimeout)
		bound := deadline(t)
		w.sim.SetIgnoreIdempotencyKeys(true)
		p := w.newPayment(t, "pay-webhook-before-resend", 1500)
		w.abandon(t, bound, p, processorsim.FaultTimeout)
		w.passSettleWindow(t, p)
		// The retry's lookup finds nothing; right after it, the earlier
		// call lands twice and the first charge's webhook settles the
		// payment, so the resend's mark finds it settled.
		var kept, second processor.Charge
		w.gate.interceptOnce(func(rw http.ResponseWriter, r *http.Request, next http.Handler) bool {
			if r.Method != http.MethodGet || r.URL.Path != processorsim.PathCharges {
				return false
			}
			next.ServeHTTP(rw, r)
			kept, second = twice(w, p)
			w.deliverChargeSucceeded(t, kept)
			return true
		})
		settledOnce(t, w, bound, p, &kept, &second)
	})
}

// deliverChargeSucceeded hands the service the processor's
// charge.succeeded webhook for ch, as the processor's delivery does.
func (w *bundle) deliverChargeSucceeded(t *testing.T, ch processor.Charge) {
	t.Helper()
	ev := processor.Event{ID: "evt_" + ch.ID, Object: "event", Type: processor.EventChargeSucceeded, Created: time.Now().Unix()}
	ev.Data.Object = ch
	if _, err := w.svc.HandleProcessorEvent(context.Background(), ev); err != nil {
		t.Errorf("webhook %s: %v", ev.ID, err)
	}
}

// A payment that finishes (here by the completer, after an outage) later
// than the horizons set at its claim keeps its key for a TTL and a
// retention counted from its completion: the reaper neither prunes nor
// deletes it, and the client's retry replays the recorded 201 instead of
// running the request again.
func TestAKeyCompletedPastItsClaimHorizonsIsKept(t *testing.T) {
	t.Parallel()
	w := setup(t, shortLease, shortTimeout)
	bound := deadline(t)
	p := w.newPayment(t, "pay-late-completion", 2500)
	w.abandon(t, bound, p, processorsim.FaultServerError)
	if _, err := w.pool.Exec(bound, `UPDATE idempotency_keys
		SET created_at = now() - interval '100 hours', expires_at = now() - interval '1 second',
		    retain_until = now() - interval '1 second'
		WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3`, p.claim.TenantID, p.claim.Endpoint, p.claim.Key); err != nil {
		t.Fatal(err)
	}
	w.passSettleWindow(t, p)
	if got := payments.NewCompleter(w.svc, shortLease).RunOnce(bound); got != 1 {
		t.Fatalf("the completer finished %d payments, want 1", got)
	}
	recorded := w.wantPaid(t, p)

	res, err := reaper.New(w.pool, reaper.Config{}).RunOnce(bound)
	if err != nil {
		t.Fatal(err)
	}
	if res.Pruned != 0 || res.Deleted != 0 {
		t.Errorf("reaper pass = %+v, want the completed key neither pruned nor deleted", res)
	}
	var expiresIn time.Duration
	if err := w.pool.QueryRow(bound, `SELECT extract(epoch FROM expires_at - now())::float8 * interval '1 second'
		FROM idempotency_keys WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3`,
		p.claim.TenantID, p.claim.Endpoint, p.claim.Key).Scan(&expiresIn); err != nil {
		t.Fatal(err)
	}
	if expiresIn < idem.DefaultTTL-time.Minute {
		t.Errorf("the completed key expires in %s, want a TTL (%s) from its completion", expiresIn, idem.DefaultTTL)
	}

	again, replayed, err := w.svc.Pay(bound, p.claim, p.in)
	if err != nil || !replayed {
		t.Fatalf("retry = %d %s, replayed %v, %v; want the recorded 201 replayed", again.Status, again.Body, replayed, err)
	}
	if again.Status != recorded.Status || !bytes.Equal(again.Body, recorded.Body) {
		t.Errorf("retry answered %d %s, want the recorded %d %s", again.Status, again.Body, recorded.Status, recorded.Body)
	}
	w.wantPaid(t, p)
}

// A key past its retention is forgotten and may be claimed again (E3), but
// its derived charge key names one payment only: the request that made a
// declined payment, sent again under the forgotten key, gets 409
// payment_exists naming that payment, never a second payment row that a
// webhook for the same charge key could settle instead.
func TestAForgottenKeyNeverMakesASecondPayment(t *testing.T) {
	t.Parallel()
	w := setup(t, shortLease, shortTimeout)
	bound := deadline(t)
	p := w.newPayment(t, "pay-forgotten", 1200)
	p.in.PaymentMethod = processorsim.PaymentMethodDeclined
	fp, err := idem.Fingerprint(payments.EndpointPay, nil, p.in)
	if err != nil {
		t.Fatal(err)
	}
	p.claim.Fingerprint = fp
	res, _, err := w.svc.Pay(bound, p.claim, p.in)
	if err != nil || res.Status != http.StatusPaymentRequired {
		t.Fatalf("Pay = %d %s, %v; want 402", res.Status, res.Body, err)
	}
	declined := w.onePayment(t, p)
	// Past its retention: the reaper would delete it, or the claim claims
	// it over, whichever comes first.
	if _, err := w.pool.Exec(bound, `UPDATE idempotency_keys
		SET created_at = now() - interval '100 hours', expires_at = now() - interval '1 second',
		    retain_until = now() - interval '1 second'
		WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3`, p.claim.TenantID, p.claim.Endpoint, p.claim.Key); err != nil {
		t.Fatal(err)
	}

	again, replayed, err := w.svc.Pay(bound, p.claim, p.in)
	if err != nil || replayed || again.Status != http.StatusConflict {
		t.Fatalf("the same request under the forgotten key = %d %s, replayed %v, %v; want a fresh 409", again.Status, again.Body, replayed, err)
	}
	var body struct {
		Code      string `json:"code"`
		PaymentID string `json:"payment_id"`
	}
	if err := json.Unmarshal(again.Body, &body); err != nil {
		t.Fatal(err)
	}
	if body.Code != "payment_exists" || body.PaymentID != declined.ID.String() {
		t.Errorf("409 body = %s, want payment_exists naming %s", again.Body, declined.ID)
	}
	if rows := w.paymentRows(t, p); len(rows) != 1 {
		t.Errorf("payments of the order = %+v, want only the declined one", rows)
	}
	if calls := w.chargeCalls(p.chargeKey()); len(calls) != 1 {
		t.Errorf("charge calls = %d, want 1", len(calls))
	}
}

// Suspicion a: a 2xx whose JSON parses but names no charge is no outcome.
// Taken as final, the payment would be recorded succeeded with an empty
// charge id, and the sweep would then take every real charge under the
// key for an extra one and refund it. It is an unknown outcome instead:
// the retry's lookup finds the real charge.
func TestAnIncompleteProcessorAnswerIsNoOutcome(t *testing.T) {
	t.Parallel()
	w := setup(t, shortLease, shortTimeout)
	bound := deadline(t)
	p := w.newPayment(t, "pay-empty-answer", 1800)
	w.gate.interceptOnce(func(rw http.ResponseWriter, r *http.Request, next http.Handler) bool {
		if r.Method != http.MethodPost || r.URL.Path != processorsim.PathCharges {
			return false
		}
		next.ServeHTTP(httptest.NewRecorder(), r) // the charge executes
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write([]byte(`{}`))
		return true
	})
	res, _, err := w.svc.Pay(bound, p.claim, p.in)
	if !errors.Is(err, payments.ErrOutcomeUnknown) {
		t.Fatalf("Pay with a {} answer = %d %s, %v; want ErrOutcomeUnknown", res.Status, res.Body, err)
	}
	w.wantPaymentStatus(t, p, payments.StatusChargeSent)

	w.waitLeaseExpired(t, bound, p.claim)
	res, _, err = w.svc.Pay(bound, p.claim, p.in)
	if err != nil || res.Status != http.StatusCreated {
		t.Fatalf("retry = %d %s, %v; want 201 from the lookup", res.Status, res.Body, err)
	}
	w.wantPaid(t, p)
	if _, err := w.svc.Sweep(bound, 10); err != nil {
		t.Fatal(err)
	}
	if refunds := w.sim.Refunds(); len(refunds) != 0 {
		t.Errorf("the sweep refunded %+v, want nothing refunded", refunds)
	}
}

// Suspicion c: a compensation the processor refuses with a final error is
// recorded as refused (not left "pending" for ever), the sweep looks again
// after an hour instead of never, and a later try that goes through
// records it succeeded.
func TestARefusedCompensationIsRecordedAndTriedAgain(t *testing.T) {
	t.Parallel()
	w := setup(t, shortLease, shortTimeout)
	bound := deadline(t)
	p := w.newPayment(t, "pay-refused-compensation", 900)
	if res, _, err := w.svc.Pay(bound, p.claim, p.in); err != nil || res.Status != http.StatusCreated {
		t.Fatalf("Pay = %d %s, %v", res.Status, res.Body, err)
	}
	pay := w.onePayment(t, p)
	extra := w.sim.CreateChargeDirect(processor.ChargeRequest{Amount: p.in.Amount, Currency: p.in.Currency, PaymentMethod: p.in.PaymentMethod}, p.chargeKey())
	w.deliverChargeSucceeded(t, extra) // the extra charge's webhook makes the sweep due

	refuse := func(rw http.ResponseWriter, r *http.Request, _ http.Handler) bool {
		if r.Method != http.MethodPost || r.URL.Path != processorsim.PathRefunds {
			return false
		}
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(http.StatusBadRequest)
		_, _ = rw.Write([]byte(`{"error":{"type":"invalid_request_error","code":"charge_disputed","message":"The charge is disputed."}}`))
		return true
	}
	w.gate.interceptOnce(refuse)
	if _, err := w.svc.Sweep(bound, 10); err != nil {
		t.Fatal(err)
	}
	type comp struct {
		Status, Failure string
		DueIn           time.Duration
	}
	read := func() comp {
		var c comp
		if err := w.pool.QueryRow(bound, `
			SELECT c.status, coalesce(c.failure_message, ''),
			       coalesce(extract(epoch FROM p.sweep_at - now()), -1)::float8 * interval '1 second'
			FROM payment_compensations c JOIN payments p ON p.tenant_id = c.tenant_id AND p.id = c.payment_id
			WHERE c.tenant_id = $1 AND c.payment_id = $2 AND c.charge_id = $3`, w.tenant, pay.ID, extra.ID).Scan(&c.Status, &c.Failure, &c.DueIn); err != nil {
			t.Fatal(err)
		}
		return c
	}
	got := read()
	if got.Status != "refused" || got.Failure != "charge_disputed: The charge is disputed." || got.DueIn < 50*time.Minute {
		t.Fatalf("after a refusal the compensation is %+v; want refused with the processor's message, looked at again in about an hour", got)
	}
	if refunds := w.sim.Refunds(); len(refunds) != 0 {
		t.Fatalf("refunds = %+v, want none yet", refunds)
	}

	// An hour later the processor takes the refund.
	if _, err := w.pool.Exec(bound, `UPDATE payments SET sweep_at = now() WHERE tenant_id = $1 AND id = $2`, w.tenant, pay.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := w.svc.Sweep(bound, 10); err != nil {
		t.Fatal(err)
	}
	if got := read(); got.Status != "succeeded" || got.Failure != "" {
		t.Errorf("after the retry the compensation is %+v, want succeeded", got)
	}
	refunds := w.sim.Refunds()
	want := []string{extra.ID}
	var gotCharges []string
	for _, re := range refunds {
		gotCharges = append(gotCharges, re.Charge)
	}
	if diff := cmp.Diff(want, gotCharges); diff != "" {
		t.Errorf("refunded charges (-want +got):\n%s", diff)
	}
}

// The refund's derived key names one refund only: the same refund request
// sent again under a key past its retention gets 409 refund_exists naming
// the refund it made, never a second refund.
func TestAForgottenKeyNeverMakesASecondRefund(t *testing.T) {
	t.Parallel()
	w := setup(t, shortLease, shortTimeout)
	bound := deadline(t)
	p := w.newPayment(t, "pay-refunded", 1000)
	if res, _, err := w.svc.Pay(bound, p.claim, p.in); err != nil || res.Status != http.StatusCreated {
		t.Fatalf("Pay = %d %s, %v", res.Status, res.Body, err)
	}
	pay := w.onePayment(t, p)
	c := refundClaim(t, w, "refund-forgotten", pay.ID, 300)
	if res, _, err := w.svc.Refund(bound, c, pay.ID, 300); err != nil || res.Status != http.StatusCreated {
		t.Fatalf("Refund = %d %s, %v", res.Status, res.Body, err)
	}
	if _, err := w.pool.Exec(bound, `UPDATE idempotency_keys
		SET created_at = now() - interval '100 hours', expires_at = now() - interval '1 second', retain_until = now() - interval '1 second'
		WHERE tenant_id = $1 AND idem_key = 'refund-forgotten'`, w.tenant); err != nil {
		t.Fatal(err)
	}
	res, replayed, err := w.svc.Refund(bound, c, pay.ID, 300)
	if err != nil || replayed || res.Status != http.StatusConflict || !strings.Contains(string(res.Body), `"code":"refund_exists"`) {
		t.Fatalf("the same refund under the forgotten key = %d %s, replayed %v, %v; want a fresh 409 refund_exists", res.Status, res.Body, replayed, err)
	}
	var refunds int
	if err := w.pool.QueryRow(bound, `SELECT count(*) FROM refunds WHERE tenant_id = $1`, w.tenant).Scan(&refunds); err != nil {
		t.Fatal(err)
	}
	if refunds != 1 || len(w.sim.Refunds()) != 1 {
		t.Errorf("refunds: %d rows, %d at the processor; want 1 and 1", refunds, len(w.sim.Refunds()))
	}
}
