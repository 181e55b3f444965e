package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemref/payments/client/api"
	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/tooling/processorsim"
	"github.com/idemref/payments/internal/webhook"
)

const webhookPath = "/v1/webhooks/processor"

// sendWebhook posts body with the signature header sig ("" sends none).
func (e *bundle) sendWebhook(t *testing.T, body []byte, sig string) response {
	t.Helper()
	var opts []reqOption
	if sig != "" {
		opts = append(opts, withHeader(webhook.Header, sig))
	}
	return e.do(t, http.MethodPost, webhookPath, "", body, opts...)
}

// chargeEvent is a charge.succeeded event about ch, as the processor
// sends it.
func chargeEvent(t *testing.T, ch processor.Charge) []byte {
	t.Helper()
	ev := processor.Event{ID: "evt_" + ch.ID, Object: "event", Type: processor.EventChargeSucceeded, Created: time.Now().Unix()}
	ev.Data.Object = ch
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// lostCharge pays o with the charge's response lost: the charge exists at
// the processor, the payment stays at charge_sent (503 outcome unknown).
// It returns the charge.
func (e *bundle) lostCharge(t *testing.T, o api.Order, key string) processor.Charge {
	t.Helper()
	e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultLostResponse})
	res := e.pay(t, e.a.Key, key, payBody(o.Id.String(), cardVisa))
	wantProblem(t, res, http.StatusServiceUnavailable, "processor_outcome_unknown")
	var found []processor.Charge
	for _, ch := range e.sim.Charges() {
		if ch.Metadata["order_id"] == o.Id.String() {
			found = append(found, ch)
		}
	}
	if len(found) != 1 {
		t.Fatalf("charges for order %s = %d, want 1", o.Id.String(), len(found))
	}
	return found[0]
}

func (e *bundle) paymentStatusOfOrder(t *testing.T, orderID string) (status, chargeID string) {
	t.Helper()
	var ch *string
	if err := e.pool.QueryRow(context.Background(),
		`SELECT status, charge_id FROM payments WHERE order_id::text = $1`, orderID).Scan(&status, &ch); err != nil {
		t.Fatal(err)
	}
	if ch != nil {
		chargeID = *ch
	}
	return status, chargeID
}

// M1, M4, T5: the processor delivers a charge.succeeded five times, held
// back so that another event overtakes it, signed with a retired and the
// current secret (a rotation). The payment whose charge response was lost
// is confirmed once: one payment.succeeded event, one inbox row, one
// charge; the client's retry then records the confirmed payment without
// asking the processor anything.
func TestWebhookDeliveredFiveTimesOutOfOrderDuringRotation(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor(), withWebhooks(webhookSecretRetired, webhookSecret))
	o := e.newOrder(t, e.a, "hooked")
	other := e.newOrder(t, e.a, "other")

	// The first event (the lost charge's) is held 300 ms and delivered 5
	// times; the second payment's event, created meanwhile, goes at once.
	e.sim.InjectWebhookFault(processorsim.WebhookFault{Duplicates: 4, Delay: 300 * time.Millisecond})
	ch := e.lostCharge(t, o, "pay-hooked")
	wantStatus(t, e.pay(t, e.a.Key, "pay-other", payBody(other.Id.String(), cardVisa)), http.StatusCreated)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := e.sim.WaitWebhooks(ctx); err != nil {
		t.Fatal(err)
	}

	var hooked, others []processorsim.Delivery
	for _, d := range e.sim.Deliveries() {
		if d.Status != http.StatusOK {
			t.Errorf("delivery %+v was not answered 200", d)
		}
		if d.Type == processor.EventChargeSucceeded && d.EventID == e.sim.Events()[0].ID {
			hooked = append(hooked, d)
		} else {
			others = append(others, d)
		}
	}
	if len(hooked) != 5 {
		t.Fatalf("deliveries of the held event = %d, want 5", len(hooked))
	}
	if len(others) == 0 || !others[0].At.Before(hooked[0].At) {
		t.Errorf("the second event did not overtake the held one: %+v then %+v", others, hooked)
	}

	if status, chargeID := e.paymentStatusOfOrder(t, o.Id.String()); status != "succeeded" || chargeID != ch.ID {
		t.Errorf("payment = %s with %s, want succeeded with %s", status, chargeID, ch.ID)
	}
	if got := e.orderEvents(t, o.Id.String()); got != (orderEvents{Succeeded: 1, Amount: orderAmount}) {
		t.Errorf("events of the hooked order = %+v, want one payment.succeeded", got)
	}
	if n := e.count(t, `SELECT count(*) FROM processed_messages WHERE consumer = 'processor-webhooks' AND message_id = $1`, hooked[0].EventID); n != 1 {
		t.Errorf("inbox rows of the event = %d, want 1", n)
	}
	if n := len(e.sim.Charges()); n != 2 {
		t.Errorf("charges at the processor = %d, want 2 (one per order)", n)
	}

	// The client retries once its Retry-After passed: the payment is
	// settled already, so the key is completed without a processor call.
	calls := len(e.sim.Calls())
	e.setLease(t, e.a.ID, endpointPayments, "pay-hooked", -time.Second)
	res := e.pay(t, e.a.Key, "pay-hooked", payBody(o.Id.String(), cardVisa))
	wantStatus(t, res, http.StatusCreated)
	if p := decodePayment(t, res); p.ChargeId == nil || *p.ChargeId != ch.ID {
		t.Errorf("the retry answered charge %v, want %s", p.ChargeId, ch.ID)
	}
	if n := len(e.sim.Calls()) - calls; n != 0 {
		t.Errorf("the retry made %d processor calls, want 0 (the webhook confirmed the charge)", n)
	}
	if got := e.orderEvents(t, o.Id.String()); got.Succeeded != 1 {
		t.Errorf("payment.succeeded events after the retry = %d, want 1", got.Succeeded)
	}
}

// M4: a delivery that is not signed right is a 400 problem and writes
// nothing: no inbox row, no change to the payment.
func TestWebhookRejectedWritesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	o := e.newOrder(t, e.a, "unsigned")
	ch := e.lostCharge(t, o, "pay-unsigned")
	body := chargeEvent(t, ch)
	now := time.Now()
	altered := []byte(strings.Replace(string(body), `"amount":2500`, `"amount":1`, 1))
	if string(altered) == string(body) {
		t.Fatal("the event has no amount to alter")
	}

	for _, tc := range []struct {
		name string
		body []byte
		sig  string
		code string
	}{
		{"NoSignature", body, "", "webhook_signature_invalid"},
		{"Malformed", body, "v1=abc", "webhook_signature_invalid"},
		{"WrongSecret", body, webhook.Sign(body, now, webhookSecretRetired), "webhook_signature_invalid"},
		{"StaleTimestamp", body, webhook.Sign(body, now.Add(-6*time.Minute), webhookSecret), "webhook_timestamp_out_of_tolerance"},
		{"FutureTimestamp", body, webhook.Sign(body, now.Add(6*time.Minute), webhookSecret), "webhook_timestamp_out_of_tolerance"},
		{"BodyAlteredAfterSigning", altered, webhook.Sign(body, now, webhookSecret), "webhook_signature_invalid"},
		{"ReEncodedBody", []byte(" " + string(body)), webhook.Sign(body, now, webhookSecret), "webhook_signature_invalid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantProblem(t, e.sendWebhook(t, tc.body, tc.sig), http.StatusBadRequest, tc.code)
		})
	}
	if n := e.count(t, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Errorf("inbox rows = %d, want 0", n)
	}
	if status, _ := e.paymentStatusOfOrder(t, o.Id.String()); status != "charge_sent" {
		t.Errorf("payment = %s, want still charge_sent", status)
	}
	if n := e.count(t, `SELECT count(*) FROM outbox`); n != 0 {
		t.Errorf("outbox rows = %d, want 0", n)
	}

	// The same event, signed right, is applied.
	res := e.sendWebhook(t, body, webhook.Sign(body, now, webhookSecret))
	wantStatus(t, res, http.StatusOK)
	if status, _ := e.paymentStatusOfOrder(t, o.Id.String()); status != "succeeded" {
		t.Errorf("payment = %s after the signed delivery, want succeeded", status)
	}
	// Delivered again (signed anew, as a retry is): the inbox skips it.
	// The payment's state would make a second confirmation a no-op anyway;
	// the answer says it was never applied a second time.
	again := e.sendWebhook(t, body, webhook.Sign(body, time.Now(), webhookSecret))
	wantStatus(t, again, http.StatusOK)
	if !strings.Contains(string(again.body), `"result":"duplicate"`) {
		t.Errorf("second delivery answered %s, want result duplicate", again.body)
	}
	if n := e.count(t, `SELECT count(*) FROM processed_messages`); n != 1 {
		t.Errorf("inbox rows after two deliveries = %d, want 1", n)
	}
	if got := e.orderEvents(t, o.Id.String()); got.Succeeded != 1 {
		t.Errorf("payment.succeeded events after two deliveries = %d, want 1", got.Succeeded)
	}
}

// The race of webhook, lookup and sweep (docs/messages.md). For each of
// several payments whose charge response was lost, the webhook and the
// client's retry (which looks the charge up) run at once: whichever
// commits first settles the payment, and there is one event and one
// charge either way. Then a second charge under one payment's key (a
// processor that ignored the key) is reported by webhook: the sweep
// refunds it, and the money taken is one charge.
func TestWebhookLookupAndSweepRace(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	const n = 8
	type racer struct {
		o    api.Order
		key  string
		ch   processor.Charge
		body []byte
	}
	racers := make([]racer, n)
	for i := range racers {
		r := &racers[i]
		r.o = e.newOrder(t, e.a, "race-"+string(rune('a'+i)))
		r.key = "pay-race-" + string(rune('a'+i))
		r.ch = e.lostCharge(t, r.o, r.key)
		r.body = chargeEvent(t, r.ch)
		e.setLease(t, e.a.ID, endpointPayments, r.key, -time.Second)
	}
	var wg sync.WaitGroup
	for i := range racers {
		r := racers[i]
		wg.Go(func() {
			res, err := e.send(t.Context(), http.MethodPost, webhookPath, "", r.body, withHeader(webhook.Header, webhook.Sign(r.body, time.Now(), webhookSecret)))
			if err != nil || res.status != http.StatusOK {
				t.Errorf("webhook: %v %d %s", err, res.status, res.body)
			}
		})
		wg.Go(func() {
			res, err := e.send(t.Context(), http.MethodPost, "/v1/payments", e.a.Key, []byte(payBody(r.o.Id.String(), cardVisa)), withHeader("Idempotency-Key", r.key))
			if err != nil || res.status != http.StatusCreated {
				t.Errorf("retry: %v %d %s", err, res.status, res.body)
			}
		})
	}
	wg.Wait()
	for _, r := range racers {
		if status, chargeID := e.paymentStatusOfOrder(t, r.o.Id.String()); status != "succeeded" || chargeID != r.ch.ID {
			t.Errorf("payment of %s = %s with %s, want succeeded with %s", r.o.Reference, status, chargeID, r.ch.ID)
		}
		if got := e.orderEvents(t, r.o.Id.String()); got != (orderEvents{Succeeded: 1, Amount: orderAmount}) {
			t.Errorf("events of %s = %+v, want one payment.succeeded", r.o.Reference, got)
		}
	}

	// A late duplicate: a second succeeded charge under the first key.
	first := racers[0]
	dup := e.sim.CreateChargeDirect(processor.ChargeRequest{Amount: orderAmount, Currency: "EUR", PaymentMethod: cardVisa}, first.ch.IdempotencyKey)
	body := chargeEvent(t, dup)
	res := e.sendWebhook(t, body, webhook.Sign(body, time.Now(), webhookSecret))
	wantStatus(t, res, http.StatusOK)
	if !strings.Contains(string(res.body), `"result":"compensating"`) {
		t.Errorf("late duplicate answered %s, want result compensating", res.body)
	}
	if _, err := e.payments.Sweep(t.Context(), 10); err != nil {
		t.Fatal(err)
	}
	var refunded bool
	for _, c := range e.sim.Charges() {
		if c.ID == dup.ID {
			refunded = c.RefundedAmount == c.Amount
		}
		if c.ID == first.ch.ID && c.RefundedAmount != 0 {
			t.Errorf("the recorded charge %s was refunded", c.ID)
		}
	}
	if !refunded {
		t.Errorf("the late duplicate %s was not refunded by the sweep", dup.ID)
	}
	if got := e.orderEvents(t, first.o.Id.String()); got.Succeeded != 1 {
		t.Errorf("payment.succeeded events after the duplicate = %d, want 1", got.Succeeded)
	}
}

// The Standard Webhooks scheme, chosen by configuration: the simulator
// signs its deliveries with webhook-id, webhook-timestamp and
// webhook-signature during a rotation (a retired and the current secret),
// the server verifies them and confirms the payment once; a delivery
// signed the other way, with the wrong secret, stale or altered is a 400
// and writes nothing.
func TestStandardWebhooks(t *testing.T) {
	t.Parallel()
	const retired = "whsec_" + "cmV0aXJlZC1zZWNyZXQtcmV0aXJlZC1zZWNyZXQ="
	e := setup(t, withProcessor(), withStandardWebhooks(retired, standardWebhookSecret))
	o := e.newOrder(t, e.a, "standard-hooked")
	ch := e.lostCharge(t, o, "pay-standard")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := e.sim.WaitWebhooks(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range e.sim.Deliveries() {
		if d.Status != http.StatusOK {
			t.Errorf("delivery %+v was not answered 200", d)
		}
	}
	if status, chargeID := e.paymentStatusOfOrder(t, o.Id.String()); status != "succeeded" || chargeID != ch.ID {
		t.Errorf("payment = %s with %s, want succeeded with %s (confirmed by the webhook)", status, chargeID, ch.ID)
	}

	// The simulator stops delivering: the test sends the next deliveries.
	e.sim.SetWebhooks(processorsim.WebhookConfig{})
	other := e.newOrder(t, e.a, "standard-refused")
	och := e.lostCharge(t, other, "pay-standard-refused")
	body := chargeEvent(t, och)
	inbox := e.count(t, `SELECT count(*) FROM processed_messages`)
	now := time.Now()
	standard := func(id string, at time.Time, secret string, payload []byte) reqOption {
		sig, err := webhook.SignStandard(id, at, payload, secret)
		if err != nil {
			t.Fatal(err)
		}
		return func(r *http.Request) {
			r.Header.Set(webhook.StandardIDHeader, id)
			r.Header.Set(webhook.StandardTimestampHeader, strconv.FormatInt(at.Unix(), 10))
			r.Header.Set(webhook.StandardSignatureHeader, sig)
		}
	}
	for name, tt := range map[string]struct {
		opt  reqOption
		code string
	}{
		"ProcessorSignature": {withHeader(webhook.Header, webhook.Sign(body, now, standardWebhookSecret)), "webhook_signature_invalid"},
		"WrongSecret":        {standard("msg_1", now, retired, body), "webhook_signature_invalid"},
		"SignedOtherBody":    {standard("msg_1", now, standardWebhookSecret, []byte(`{}`)), "webhook_signature_invalid"},
		"Stale":              {standard("msg_1", now.Add(-time.Hour), standardWebhookSecret, body), "webhook_timestamp_out_of_tolerance"},
	} {
		res := e.do(t, http.MethodPost, webhookPath, "", body, tt.opt)
		if res.status != http.StatusBadRequest || !strings.Contains(string(res.body), tt.code) {
			t.Errorf("%s: %d %s, want 400 %s", name, res.status, res.body, tt.code)
		}
	}
	if n := e.count(t, `SELECT count(*) FROM processed_messages`); n != inbox {
		t.Errorf("inbox rows went from %d to %d after refused deliveries", inbox, n)
	}
	if status, _ := e.paymentStatusOfOrder(t, other.Id.String()); status != "charge_sent" {
		t.Errorf("the payment of the refused deliveries is %s, want charge_sent", status)
	}
	if res := e.do(t, http.MethodPost, webhookPath, "", body, standard("msg_2", now, standardWebhookSecret, body)); res.status != http.StatusOK {
		t.Errorf("a delivery signed right = %d %s, want 200", res.status, res.body)
	}
}
