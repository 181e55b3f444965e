package httpapi_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	"github.com/idemref/payments/client/api"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/tooling/processorsim"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// Payments and refunds through the HTTP API, against a processor simulator
// in this process (setup's withProcessor). Every test looks at the side
// effects themselves: the rows in payments, refunds, orders and
// idempotency_keys, and the calls, charges and refunds the simulator
// recorded (T4).

// How the multi-step endpoints are named in idempotency_keys (K2).
const (
	endpointPayments = "POST /v1/payments"
	endpointRefunds  = "POST /v1/payments/{id}/refunds"
)

// Test payment methods of the simulator.
const (
	cardVisa              = processorsim.PaymentMethodVisa
	cardDeclined          = processorsim.PaymentMethodDeclined
	cardInsufficientFunds = processorsim.PaymentMethodInsufficientFunds
)

// orderAmount is what orderBody orders cost, in EUR cents.
const orderAmount = 2500

func paymentBody(orderID string, amount int64, currency, method string) string {
	return fmt.Sprintf(`{"order_id":%q,"amount":%d,"currency":%q,"payment_method":%q}`, orderID, amount, currency, method)
}

// payBody pays an order made from orderBody in full.
func payBody(orderID, method string) string {
	return paymentBody(orderID, orderAmount, "EUR", method)
}

func refundBody(amount int64) string { return fmt.Sprintf(`{"amount":%d}`, amount) }

// pay sends POST /v1/payments. idemKey "" sends no Idempotency-Key header.
func (e *bundle) pay(t *testing.T, apiKey, idemKey, body string, opts ...reqOption) response {
	t.Helper()
	if idemKey != "" {
		opts = append([]reqOption{withHeader(idem.HeaderName, idemKey)}, opts...)
	}
	return e.do(t, http.MethodPost, "/v1/payments", apiKey, []byte(body), opts...)
}

// refund sends POST /v1/payments/{paymentID}/refunds.
func (e *bundle) refund(t *testing.T, apiKey, idemKey, paymentID, body string, opts ...reqOption) response {
	t.Helper()
	if idemKey != "" {
		opts = append([]reqOption{withHeader(idem.HeaderName, idemKey)}, opts...)
	}
	return e.do(t, http.MethodPost, "/v1/payments/"+paymentID+"/refunds", apiKey, []byte(body), opts...)
}

// newOrder creates an order of orderAmount EUR for tn.
func (e *bundle) newOrder(t *testing.T, tn tenant, ref string) api.Order {
	t.Helper()
	res := e.post(t, tn.Key, "order-"+ref, orderBody(ref))
	wantStatus(t, res, http.StatusCreated)
	return decodeOrder(t, res)
}

// paidOrder creates an order for tn and pays it in full under the key
// "pay-"+ref.
func (e *bundle) paidOrder(t *testing.T, tn tenant, ref string) (api.Order, api.Payment) {
	t.Helper()
	o := e.newOrder(t, tn, ref)
	res := e.pay(t, tn.Key, "pay-"+ref, payBody(o.Id.String(), cardVisa))
	wantStatus(t, res, http.StatusCreated)
	return o, decodePayment(t, res)
}

func decodePayment(t *testing.T, res response) api.Payment {
	t.Helper()
	var p api.Payment
	decodeJSON(t, res, &p)
	return p
}

func decodeRefund(t *testing.T, res response) api.Refund {
	t.Helper()
	var r api.Refund
	decodeJSON(t, res, &r)
	return r
}

// decodeJSON decodes a response body into v; a member v does not know
// fails the test, so a field added to the wire shows up here.
func decodeJSON(t *testing.T, res response, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(res.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decode %T: %v; status %d, body: %s", v, err, res.status, res.body)
	}
}

// chargeKey is the derived key a payment made under the client's key
// must send with its charge: a hash of the scoped key and the step name.
func chargeKey(tenantID uuid.UUID, key string) string {
	return idem.DeriveKey(idem.Claim{TenantID: tenantID, Endpoint: endpointPayments, Key: key}, "charge")
}

// refundKey is the derived key a refund made under the client's key must
// send.
func refundKey(tenantID uuid.UUID, key string) string {
	return idem.DeriveKey(idem.Claim{TenantID: tenantID, Endpoint: endpointRefunds, Key: key}, "refund")
}

// wantDerivedKey checks the shape of a derived key: 64 hex digits, never
// the client's key itself.
func wantDerivedKey(t *testing.T, derived, clientKey string) {
	t.Helper()
	if b, err := hex.DecodeString(derived); err != nil || len(b) != 32 {
		t.Errorf("derived key %q is not 64 hex digits", derived)
	}
	if derived == clientKey {
		t.Errorf("the client's key %q was forwarded to the processor unchanged", clientKey)
	}
}

// --- Rows ---

// paymentRow is a payments row; NULLs read as "".
type paymentRow struct {
	ID             string
	Status         string
	Amount         int64
	Currency       string
	PaymentMethod  string
	ChargeKey      string
	ChargeID       string
	DeclineCode    string
	RefundedAmount int64
}

// paymentRows returns the payments of an order, oldest first.
func (e *bundle) paymentRows(t *testing.T, orderID string) []paymentRow {
	t.Helper()
	return testkit.Rows[paymentRow](t, e.pool,
		`SELECT id::text, status, amount, currency, payment_method, charge_key, coalesce(charge_id, ''),
		        coalesce(decline_code, ''), refunded_amount
		 FROM payments WHERE order_id::text = $1 ORDER BY created_at, id`, orderID)
}

// onePayment returns the order's only payment row.
func (e *bundle) onePayment(t *testing.T, orderID string) paymentRow {
	t.Helper()
	rows := e.paymentRows(t, orderID)
	if len(rows) != 1 {
		t.Fatalf("payments of order %s: %+v, want exactly one", orderID, rows)
	}
	return rows[0]
}

// refundRow is a refunds row; NULLs read as "".
type refundRow struct {
	ID                string
	Amount            int64
	Status            string
	RefundKey         string
	ProcessorRefundID string
}

// refundRows returns the refunds of a payment, oldest first.
func (e *bundle) refundRows(t *testing.T, paymentID string) []refundRow {
	t.Helper()
	return testkit.Rows[refundRow](t, e.pool,
		`SELECT id::text, amount, status, refund_key, coalesce(processor_refund_id, '')
		 FROM refunds WHERE payment_id::text = $1 ORDER BY created_at, id`, paymentID)
}

// orderEvents is what the outbox says happened to an order: how many
// payment.succeeded events name it, and their total. The payment's final
// transaction writes them; the order row follows them through the orders
// consumer (internal/orders, tested with the broker in internal/consumer
// and cmd/api), which these in-process tests do not run.
type orderEvents struct {
	Succeeded int
	Amount    int64
}

func (e *bundle) orderEvents(t *testing.T, orderID string) orderEvents {
	t.Helper()
	var o orderEvents
	if err := e.pool.QueryRow(context.Background(),
		`SELECT count(*), coalesce(sum((convert_from(payload, 'UTF8')::jsonb #>> '{data,amount}')::bigint), 0)
		 FROM outbox WHERE event_type = 'payment.succeeded' AND convert_from(payload, 'UTF8')::jsonb #>> '{data,order_id}' = $1`,
		orderID).Scan(&o.Succeeded, &o.Amount); err != nil {
		t.Fatalf("read the events of order %s: %v", orderID, err)
	}
	return o
}

// keyState is what the payment tests look at in a multi-step key's row.
type keyState struct {
	State         string
	Status        int // 0 while in progress
	RecoveryPoint string
	// LeaseHeld: locked_until is in the future, so a retry gets 409.
	LeaseHeld bool
	// ResourceID is the payment or refund the key created, "" if none.
	ResourceID string
}

// keyState reads the (tenant, endpoint, key) row; it fails the test when
// there is none.
func (e *bundle) keyState(t *testing.T, tenantID uuid.UUID, endpoint, key string) keyState {
	t.Helper()
	k, ok := testkit.ReadKeyRow(t, e.pool, tenantID, endpoint, key)
	if !ok {
		t.Fatalf("no idempotency key %q of %s", key, endpoint)
	}
	st := keyState{State: k.State, Status: k.ResponseStatus, RecoveryPoint: k.RecoveryPoint, LeaseHeld: k.Lock == "live"}
	if k.ResourceID != uuid.Nil {
		st.ResourceID = k.ResourceID.String()
	}
	return st
}

// wantKeyState compares the key's row with want.
func (e *bundle) wantKeyState(t *testing.T, tenantID uuid.UUID, endpoint, key string, want keyState) {
	t.Helper()
	if diff := cmp.Diff(want, e.keyState(t, tenantID, endpoint, key)); diff != "" {
		t.Errorf("idempotency_keys row for %q on %s (-want +got):\n%s", key, endpoint, diff)
	}
}

// completed is the state of a key whose response was recorded.
func completed(status int, resourceID string) keyState {
	return keyState{State: "completed", Status: status, RecoveryPoint: "finished", ResourceID: resourceID}
}

func (e *bundle) countKeysOf(t *testing.T, endpoint string) int {
	t.Helper()
	return e.count(t, "SELECT count(*) FROM idempotency_keys WHERE endpoint = $1", endpoint)
}

func (e *bundle) leaseGeneration(t *testing.T, tenantID uuid.UUID, endpoint, key string) int64 {
	t.Helper()
	var gen int64
	if err := e.pool.QueryRow(context.Background(),
		`SELECT lease_generation FROM idempotency_keys WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3`,
		tenantID, endpoint, key).Scan(&gen); err != nil {
		t.Fatal(err)
	}
	return gen
}

// setLease moves the key's lease to end at now() + d (d < 0: in the past).
func (e *bundle) setLease(t *testing.T, tenantID uuid.UUID, endpoint, key string, d time.Duration) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(),
		`UPDATE idempotency_keys SET locked_until = now() + make_interval(secs => $4)
		 WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3`,
		tenantID, endpoint, key, d.Seconds()); err != nil {
		t.Fatal(err)
	}
}

// passSettleWindow makes the settle window of the key's payment or
// refund pass now, as if its last processor call had been sent a window
// ago, and ends the lease a key holds between two lookups: what waiting
// would do, without the wait.
func (e *bundle) passSettleWindow(t *testing.T, tenantID uuid.UUID, endpoint, key string) {
	t.Helper()
	ctx := context.Background()
	for _, sql := range []string{
		`UPDATE payments SET charge_sent_at = charge_sent_at - make_interval(secs => $4)
		 FROM idempotency_keys k
		 WHERE k.tenant_id = $1 AND k.endpoint = $2 AND k.idem_key = $3 AND payments.tenant_id = k.tenant_id AND payments.id = k.resource_id`,
		`UPDATE refunds SET refund_sent_at = refund_sent_at - make_interval(secs => $4)
		 FROM idempotency_keys k
		 WHERE k.tenant_id = $1 AND k.endpoint = $2 AND k.idem_key = $3 AND refunds.tenant_id = k.tenant_id AND refunds.id = k.resource_id`,
		`UPDATE idempotency_keys SET locked_until = now()
		 WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3 AND state = 'in_progress' AND $4 > 0`,
	} {
		if _, err := e.pool.Exec(ctx, sql, tenantID, endpoint, key, settleWindow.Seconds()); err != nil {
			t.Fatal(err)
		}
	}
}

// --- The processor's records ---

// netCharged is the money the processor moved for an order: its succeeded
// charges less what was refunded of them, read from the simulator's own
// records (the metadata the API puts on every charge names the order).
func (e *bundle) netCharged(orderID string) int64 {
	var net int64
	for _, ch := range e.sim.Charges() {
		if ch.Metadata["order_id"] == orderID && ch.Status == processor.StatusSucceeded {
			net += ch.Amount - ch.RefundedAmount
		}
	}
	return net
}

// call is what the tests compare of a call the simulator recorded.
type call struct {
	Method   string
	Path     string
	Key      string
	Fault    processorsim.FaultKind
	Executed bool
	Replayed bool
}

func (e *bundle) processorCalls() []call {
	var out []call
	for _, c := range e.sim.Calls() {
		out = append(out, call{c.Method, c.Path, c.IdempotencyKey, c.Fault, c.Executed, c.Replayed})
	}
	return out
}

// chargeCall is a POST /v1/charges with key.
func chargeCall(key string, fault processorsim.FaultKind, executed bool) call {
	return call{Method: http.MethodPost, Path: processorsim.PathCharges, Key: key, Fault: fault, Executed: executed}
}

// lookupCall is the GET /v1/charges?idempotency_key=... a resumed payment
// sends before charging again (S4).
var lookupCall = call{Method: http.MethodGet, Path: processorsim.PathCharges}

func refundCall(key string, fault processorsim.FaultKind, executed bool) call {
	return call{Method: http.MethodPost, Path: processorsim.PathRefunds, Key: key, Fault: fault, Executed: executed}
}

// wantCalls compares every call the simulator recorded with want.
func (e *bundle) wantCalls(t *testing.T, want ...call) {
	t.Helper()
	if diff := cmp.Diff(want, e.processorCalls()); diff != "" {
		t.Errorf("processor calls (-want +got):\n%s", diff)
	}
}

func (e *bundle) chargesUnder(key string) []processor.Charge {
	var out []processor.Charge
	for _, ch := range e.sim.Charges() {
		if ch.IdempotencyKey == key {
			out = append(out, ch)
		}
	}
	return out
}

func (e *bundle) refundsUnder(key string) []processor.Refund {
	var out []processor.Refund
	for _, re := range e.sim.Refunds() {
		if re.IdempotencyKey == key {
			out = append(out, re)
		}
	}
	return out
}

// oneCharge returns the simulator's only charge under key.
func (e *bundle) oneCharge(t *testing.T, key string) processor.Charge {
	t.Helper()
	charges := e.chargesUnder(key)
	if len(charges) != 1 {
		t.Fatalf("charges under %s: %+v, want exactly one", key, charges)
	}
	return charges[0]
}

// --- Paying ---

// S1, S2, L3, L4: a payment charges the card once, with a derived key,
// records the exact response and replays it.
func TestPayOrder(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	o := e.newOrder(t, e.a, "inv-1")
	const key = "8e03978e-40d5-43e8-bc93-6894a57f9324"
	body := payBody(o.Id.String(), cardVisa)
	derived := chargeKey(e.a.ID, key)

	first := e.pay(t, e.a.Key, key, body)
	wantStatus(t, first, http.StatusCreated)
	p := decodePayment(t, first)
	ch := e.oneCharge(t, derived)

	t.Run("AnswersWithTheSucceededPayment", func(t *testing.T) {
		want := api.Payment{
			Id: p.Id, OrderId: o.Id, Amount: orderAmount, Currency: "EUR", PaymentMethod: cardVisa,
			Status: api.PaymentStatusSucceeded, ChargeId: &ch.ID, DeclineCode: nil, RefundedAmount: 0, Compensations: []api.Compensation{}, CreatedAt: p.CreatedAt,
		}
		if diff := cmp.Diff(want, p); diff != "" {
			t.Errorf("payment (-want +got):\n%s", diff)
		}
		if got, want := first.header.Get("Location"), "/v1/payments/"+p.Id.String(); got != want {
			t.Errorf("Location = %q, want %q", got, want)
		}
		if got := first.header.Get("Content-Type"); got != "application/json" {
			t.Errorf("Content-Type = %q, want application/json", got)
		}
	})

	t.Run("ReplaysStoredResponseByteForByte", func(t *testing.T) {
		replay := e.pay(t, e.a.Key, key, body)
		wantReplay(t, first, replay)
	})

	t.Run("ExactlyOneChargeUnderADerivedKey", func(t *testing.T) {
		wantDerivedKey(t, derived, key)
		// The replay above sent nothing to the processor.
		e.wantCalls(t, chargeCall(derived, "", true))
		if n := len(e.sim.Charges()); n != 1 {
			t.Errorf("charges at the processor = %d, want 1", n)
		}
		want := processor.Charge{
			ID: ch.ID, Object: "charge", Amount: orderAmount, Currency: "EUR", PaymentMethod: cardVisa,
			Status: processor.StatusSucceeded, Metadata: map[string]string{"tenant_id": e.a.ID.String(), "payment_id": p.Id.String(), "order_id": o.Id.String()},
			IdempotencyKey: derived, Created: ch.Created,
		}
		if diff := cmp.Diff(want, ch); diff != "" {
			t.Errorf("charge (-want +got):\n%s", diff)
		}
	})

	t.Run("PaymentOrderAndKeyRows", func(t *testing.T) {
		want := []paymentRow{{
			ID: p.Id.String(), Status: "succeeded", Amount: orderAmount, Currency: "EUR", PaymentMethod: cardVisa,
			ChargeKey: derived, ChargeID: ch.ID,
		}}
		if diff := cmp.Diff(want, e.paymentRows(t, o.Id.String())); diff != "" {
			t.Errorf("payments rows (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(orderEvents{Succeeded: 1, Amount: orderAmount}, e.orderEvents(t, o.Id.String())); diff != "" {
			t.Errorf("order row (-want +got):\n%s", diff)
		}
		e.wantKeyState(t, e.a.ID, endpointPayments, key, completed(http.StatusCreated, p.Id.String()))
		e.wantRows(t, 1, 2) // the order's key and the payment's
		if n := e.count(t, "SELECT count(*) FROM payments"); n != 1 {
			t.Errorf("payments rows = %d, want 1", n)
		}
	})

	t.Run("ReadsShowThePaymentAndTheOrderLeftToItsEvent", func(t *testing.T) {
		res := e.get(t, e.a.Key, "/v1/payments/"+p.Id.String())
		wantStatus(t, res, http.StatusOK)
		if diff := cmp.Diff(p, decodePayment(t, res)); diff != "" {
			t.Errorf("GET differs from the created payment (-created +get):\n%s", diff)
		}
		// The payment does not touch the order: the orders consumer applies
		// its payment.succeeded event (run here by no one), so the order is
		// still pending and its event is waiting in the outbox.
		got := decodeOrder(t, e.get(t, e.a.Key, "/v1/orders/"+o.Id.String()))
		if got.Status != "pending" || got.AmountPaid != 0 {
			t.Errorf("order status/amount_paid = %s/%d, want pending/0 until its event is applied", got.Status, got.AmountPaid)
		}
	})
}

// O1: a decline is deterministic: recorded, replayed, and no second charge
// attempt for the key. It does not block the order: a new key may pay it.
func TestPayDeclined(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		method      string
		declineCode string
	}{
		{name: "GenericDecline", method: cardDeclined, declineCode: "generic_decline"},
		{name: "InsufficientFunds", method: cardInsufficientFunds, declineCode: "insufficient_funds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, withProcessor())
			o := e.newOrder(t, e.a, "inv-1")
			const key = "declined-key"
			body := payBody(o.Id.String(), tt.method)
			derived := chargeKey(e.a.ID, key)

			first := e.pay(t, e.a.Key, key, body)
			p := wantProblem(t, first, http.StatusPaymentRequired, httpapi.CodeCardDeclined)
			if deref(p.DeclineCode) != tt.declineCode {
				t.Errorf("decline_code = %q, want %q", deref(p.DeclineCode), tt.declineCode)
			}
			ch := e.oneCharge(t, derived)

			t.Run("PaymentIsDeclinedAndTheOrderUnpaid", func(t *testing.T) {
				if ch.Status != processor.StatusFailed || ch.DeclineCode != tt.declineCode {
					t.Errorf("processor charge status/decline_code = %s/%s, want failed/%s", ch.Status, ch.DeclineCode, tt.declineCode)
				}
				want := []paymentRow{{
					ID: idString(p.PaymentId), Status: "declined", Amount: orderAmount, Currency: "EUR", PaymentMethod: tt.method,
					ChargeKey: derived, ChargeID: ch.ID, DeclineCode: tt.declineCode,
				}}
				if diff := cmp.Diff(want, e.paymentRows(t, o.Id.String())); diff != "" {
					t.Errorf("payments rows (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(orderEvents{}, e.orderEvents(t, o.Id.String())); diff != "" {
					t.Errorf("order row (-want +got):\n%s", diff)
				}
				e.wantKeyState(t, e.a.ID, endpointPayments, key, completed(http.StatusPaymentRequired, idString(p.PaymentId)))
			})

			t.Run("DeclineIsReplayedWithoutCallingTheProcessor", func(t *testing.T) {
				replay := e.pay(t, e.a.Key, key, body)
				wantReplay(t, first, replay)
				e.wantCalls(t, chargeCall(derived, "", true))
			})

			t.Run("GetShowsTheDeclinedPayment", func(t *testing.T) {
				res := e.get(t, e.a.Key, "/v1/payments/"+idString(p.PaymentId))
				wantStatus(t, res, http.StatusOK)
				got := decodePayment(t, res)
				if got.Status != "declined" || got.DeclineCode == nil || *got.DeclineCode != tt.declineCode ||
					got.ChargeId == nil || *got.ChargeId != ch.ID {
					t.Errorf("payment = %+v, want declined with decline_code %s and charge_id %s", got, tt.declineCode, ch.ID)
				}
			})

			t.Run("NewKeyMayPayWithAnotherCard", func(t *testing.T) {
				res := e.pay(t, e.a.Key, "second-try", payBody(o.Id.String(), cardVisa))
				wantStatus(t, res, http.StatusCreated)
				paid := decodePayment(t, res)
				retryKey := chargeKey(e.a.ID, "second-try")
				ok := e.oneCharge(t, retryKey)
				want := []paymentRow{
					{ID: idString(p.PaymentId), Status: "declined", Amount: orderAmount, Currency: "EUR", PaymentMethod: tt.method,
						ChargeKey: derived, ChargeID: ch.ID, DeclineCode: tt.declineCode},
					{ID: paid.Id.String(), Status: "succeeded", Amount: orderAmount, Currency: "EUR", PaymentMethod: cardVisa,
						ChargeKey: retryKey, ChargeID: ok.ID},
				}
				if diff := cmp.Diff(want, e.paymentRows(t, o.Id.String())); diff != "" {
					t.Errorf("payments rows (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(orderEvents{Succeeded: 1, Amount: orderAmount}, e.orderEvents(t, o.Id.String())); diff != "" {
					t.Errorf("order row (-want +got):\n%s", diff)
				}
				e.wantCalls(t, chargeCall(derived, "", true), chargeCall(retryKey, "", true))
			})
		})
	}
}

// N1: a client that minted a new key for an order already paid gets 409
// naming the payment; nothing reaches the processor.
func TestPayNaturalKeyBackstop(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	o, p := e.paidOrder(t, e.a, "inv-1")
	firstKey := chargeKey(e.a.ID, "pay-inv-1")

	conflict := e.pay(t, e.a.Key, "another-key", payBody(o.Id.String(), cardVisa))
	pr := wantProblem(t, conflict, http.StatusConflict, httpapi.CodePaymentExists)
	if idString(pr.PaymentId) != p.Id.String() {
		t.Errorf("payment_id = %q, want the existing payment %q", idString(pr.PaymentId), p.Id.String())
	}
	e.wantKeyState(t, e.a.ID, endpointPayments, "another-key", completed(http.StatusConflict, ""))

	t.Run("ConflictIsReplayed", func(t *testing.T) {
		replay := e.pay(t, e.a.Key, "another-key", payBody(o.Id.String(), cardVisa))
		wantReplay(t, conflict, replay)
	})

	t.Run("AnyCardAndAmountConflict", func(t *testing.T) {
		// The backstop is the order, not the request: it is checked first.
		res := e.pay(t, e.a.Key, "third-key", paymentBody(o.Id.String(), 1, "EUR", processorsim.PaymentMethodMastercard))
		pr := wantProblem(t, res, http.StatusConflict, httpapi.CodePaymentExists)
		if idString(pr.PaymentId) != p.Id.String() {
			t.Errorf("payment_id = %q, want %q", idString(pr.PaymentId), p.Id.String())
		}
	})

	t.Run("NoSecondPaymentNorCharge", func(t *testing.T) {
		if rows := e.paymentRows(t, o.Id.String()); len(rows) != 1 || rows[0].ID != p.Id.String() {
			t.Errorf("payments rows = %+v, want only %s", rows, p.Id.String())
		}
		e.wantCalls(t, chargeCall(firstKey, "", true))
		if diff := cmp.Diff(orderEvents{Succeeded: 1, Amount: orderAmount}, e.orderEvents(t, o.Id.String())); diff != "" {
			t.Errorf("order row (-want +got):\n%s", diff)
		}
		if n := e.countKeysOf(t, endpointPayments); n != 3 {
			t.Errorf("payment keys = %d, want 3", n)
		}
	})
}

// O1: failures decided against our own database are recorded and
// replayed, and neither leave a payment row nor call the processor.
func TestPayRejectedBeforeTheProcessor(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	o := e.newOrder(t, e.a, "inv-1")
	otherTenants := e.newOrder(t, e.b, "inv-b")
	tests := []struct {
		name   string
		body   string
		status int
		code   string
		detail string   // a substring of the detail, when it matters
		fields []string // for validation_failed
	}{
		{name: "AmountBelowWhatIsOwed", body: paymentBody(o.Id.String(), orderAmount-1, "EUR", cardVisa),
			status: 422, code: httpapi.CodeAmountMismatch, detail: "owes 2500 EUR"},
		{name: "AmountAboveWhatIsOwed", body: paymentBody(o.Id.String(), orderAmount+1, "EUR", cardVisa),
			status: 422, code: httpapi.CodeAmountMismatch, detail: "owes 2500 EUR"},
		{name: "WrongCurrency", body: paymentBody(o.Id.String(), orderAmount, "USD", cardVisa),
			status: 422, code: httpapi.CodeAmountMismatch, detail: "owes 2500 EUR"},
		{name: "UnknownOrder", body: payBody(uuid.NewString(), cardVisa),
			status: 422, code: httpapi.CodeOrderNotFound},
		{name: "OtherTenantsOrder", body: payBody(otherTenants.Id.String(), cardVisa),
			status: 422, code: httpapi.CodeOrderNotFound},
		{name: "PaymentMethodWithoutPrefix", body: payBody(o.Id.String(), "card_visa"),
			status: 400, code: httpapi.CodeValidationFailed, fields: []string{"payment_method"}},
		{name: "AmountZero", body: paymentBody(o.Id.String(), 0, "EUR", cardVisa),
			status: 400, code: httpapi.CodeValidationFailed, fields: []string{"amount"}},
		{name: "MissingOrderID", body: `{"amount":2500,"currency":"EUR","payment_method":"pm_card_visa"}`,
			status: 400, code: httpapi.CodeValidationFailed, fields: []string{"order_id"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "rejected-" + tt.name
			first := e.pay(t, e.a.Key, key, tt.body)
			p := wantProblem(t, first, tt.status, tt.code)
			if !strings.Contains(deref(p.Detail), tt.detail) {
				t.Errorf("detail = %q, want it to contain %q", deref(p.Detail), tt.detail)
			}
			if tt.fields != nil {
				var got []string
				for _, f := range deref(p.Errors) {
					got = append(got, f.Field)
				}
				if diff := cmp.Diff(tt.fields, got); diff != "" {
					t.Errorf("errors[].field (-want +got):\n%s", diff)
				}
			}
			e.wantKeyState(t, e.a.ID, endpointPayments, key, completed(tt.status, ""))

			replay := e.pay(t, e.a.Key, key, tt.body)
			wantReplay(t, first, replay)

			if n := e.count(t, "SELECT count(*) FROM payments"); n != 0 {
				t.Errorf("payments rows = %d, want 0", n)
			}
			e.wantCalls(t)
			if n := e.countKeysOf(t, endpointPayments); n != i+1 {
				t.Errorf("payment keys = %d, want %d", n, i+1)
			}
			if diff := cmp.Diff(orderEvents{}, e.orderEvents(t, o.Id.String())); diff != "" {
				t.Errorf("order row (-want +got):\n%s", diff)
			}
		})
	}
}

// O1: a request the processor refuses (not a decline) fails the payment
// for good: recorded and replayed; the order stays payable.
func TestPayRejectedByTheProcessor(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	o := e.newOrder(t, e.a, "inv-1")
	const key = "unknown-card"
	body := payBody(o.Id.String(), "pm_card_unknown")
	derived := chargeKey(e.a.ID, key)

	first := e.pay(t, e.a.Key, key, body)
	wantProblem(t, first, http.StatusUnprocessableEntity, httpapi.CodeProcessorRejected)
	row := e.onePayment(t, o.Id.String())
	want := paymentRow{ID: row.ID, Status: "failed", Amount: orderAmount, Currency: "EUR", PaymentMethod: "pm_card_unknown", ChargeKey: derived}
	if diff := cmp.Diff(want, row); diff != "" {
		t.Errorf("payment row (-want +got):\n%s", diff)
	}
	e.wantKeyState(t, e.a.ID, endpointPayments, key, completed(http.StatusUnprocessableEntity, row.ID))
	e.wantCalls(t, chargeCall(derived, "", false))
	if n := len(e.sim.Charges()); n != 0 {
		t.Errorf("charges at the processor = %d, want 0", n)
	}

	t.Run("RejectionIsReplayed", func(t *testing.T) {
		wantReplay(t, first, e.pay(t, e.a.Key, key, body))
		e.wantCalls(t, chargeCall(derived, "", false))
	})

	t.Run("NewKeyMayPayWithAKnownCard", func(t *testing.T) {
		wantStatus(t, e.pay(t, e.a.Key, "second-try", payBody(o.Id.String(), cardVisa)), http.StatusCreated)
		e.oneCharge(t, chargeKey(e.a.ID, "second-try"))
		if diff := cmp.Diff(orderEvents{Succeeded: 1, Amount: orderAmount}, e.orderEvents(t, o.Id.String())); diff != "" {
			t.Errorf("order row (-want +got):\n%s", diff)
		}
	})
}

// F4, O3, H: requests rejected before the claim record nothing and never
// reach the processor, so the key stays free for the corrected request.
func TestPayRejectedBeforeTheClaim(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	o := e.newOrder(t, e.a, "inv-1")
	const key = "pre-claim-key"
	valid := payBody(o.Id.String(), cardVisa)
	tests := []struct {
		name   string
		apiKey string
		key    string
		body   string
		opts   []reqOption
		status int
		code   string
	}{
		{name: "Unauthenticated", apiKey: "", key: key, body: valid, status: 401, code: httpapi.CodeUnauthorized},
		{name: "KeyMissing", apiKey: e.a.Key, key: "", body: valid, status: 400, code: httpapi.CodeKeyMissing},
		{name: "KeyInvalid", apiKey: e.a.Key, key: `"unterminated`, body: valid, status: 400, code: httpapi.CodeKeyInvalid},
		{name: "UnknownField", apiKey: e.a.Key, key: key, body: `{"order_id":"` + o.Id.String() + `","amount":2500,"currency":"EUR","payment_method":"pm_card_visa","tip":1}`,
			status: 400, code: httpapi.CodeInvalidJSON},
		{name: "OrderIDNotAUUID", apiKey: e.a.Key, key: key, body: payBody("not-a-uuid", cardVisa), status: 400, code: httpapi.CodeInvalidJSON},
		{name: "AmountAsString", apiKey: e.a.Key, key: key, body: `{"order_id":"` + o.Id.String() + `","amount":"2500","currency":"EUR","payment_method":"pm_card_visa"}`,
			status: 400, code: httpapi.CodeInvalidJSON},
		{name: "DuplicateMember", apiKey: e.a.Key, key: key, body: `{"order_id":"` + o.Id.String() + `","amount":2500,"amount":1,"currency":"EUR","payment_method":"pm_card_visa"}`,
			status: 400, code: httpapi.CodeInvalidJSON},
		{name: "TooLarge", apiKey: e.a.Key, key: key, body: `{"payment_method":"` + strings.Repeat("x", httpapi.MaxBodyBytes) + `"}`,
			status: 413, code: httpapi.CodeBodyTooLarge},
		{name: "TextPlain", apiKey: e.a.Key, key: key, body: valid, opts: []reqOption{withContentType("text/plain")},
			status: 415, code: httpapi.CodeUnsupportedMediaType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantProblem(t, e.pay(t, tt.apiKey, tt.key, tt.body, tt.opts...), tt.status, tt.code)
			if n := e.countKeysOf(t, endpointPayments); n != 0 {
				t.Errorf("payment keys = %d, want 0", n)
			}
			if n := e.count(t, "SELECT count(*) FROM payments"); n != 0 {
				t.Errorf("payments rows = %d, want 0", n)
			}
			e.wantCalls(t)
		})
	}

	t.Run("KeyStillWorksForAValidBody", func(t *testing.T) {
		res := e.pay(t, e.a.Key, key, valid)
		wantStatus(t, res, http.StatusCreated)
		if res.header.Get(httpapi.ReplayedHeader) != "" {
			t.Error("the first valid request was answered as a replay")
		}
		e.oneCharge(t, chargeKey(e.a.ID, key))
	})
}

// T4, O2, S1-S3, S6: when the processor times out, fails, loses its
// answer or rate-limits, the key is released at charge_sent (not
// completed, not deleted) and the payment shows processing; the retry with
// the same key looks the charge up, sends again with the same derived key
// only once the first call can no longer land (or, after a 429, at once),
// and the card is charged exactly once.
func TestPayProcessorFailure(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		fault processorsim.Fault
		code  string
		// charged: the failed call made the charge; only its answer was lost.
		charged bool
		// unknown: the failed call's outcome is unknown, so the retry looks
		// it up and, finding nothing, waits out the settle window.
		unknown bool
		// held: the key is held for the processor's Retry-After, so that
		// neither a retry nor the completer calls it sooner.
		held bool
	}{
		{name: "Timeout", fault: processorsim.Fault{Kind: processorsim.FaultTimeout}, code: httpapi.CodeOutcomeUnknown, unknown: true},
		{name: "ServerError", fault: processorsim.Fault{Kind: processorsim.FaultServerError}, code: httpapi.CodeOutcomeUnknown, unknown: true},
		{name: "BadGateway", fault: processorsim.Fault{Kind: processorsim.FaultStatus, Status: http.StatusBadGateway}, code: httpapi.CodeOutcomeUnknown, unknown: true},
		{name: "RequestTimeout", fault: processorsim.Fault{Kind: processorsim.FaultStatus, Status: http.StatusRequestTimeout}, code: httpapi.CodeOutcomeUnknown, unknown: true},
		{name: "TooEarly", fault: processorsim.Fault{Kind: processorsim.FaultStatus, Status: http.StatusTooEarly}, code: httpapi.CodeOutcomeUnknown, unknown: true},
		{name: "LostResponse", fault: processorsim.Fault{Kind: processorsim.FaultLostResponse}, code: httpapi.CodeOutcomeUnknown, charged: true, unknown: true},
		{name: "RateLimited", fault: processorsim.Fault{Kind: processorsim.FaultStatus, Status: http.StatusTooManyRequests, RetryAfter: 2 * time.Second}, code: httpapi.CodeProcessorUnavailable, held: true},
		// S8: the processor refusing our own credentials is not the
		// payment's outcome: nothing ran, and the retry pays.
		{name: "Unauthorized", fault: processorsim.Fault{Kind: processorsim.FaultStatus, Status: http.StatusUnauthorized}, code: httpapi.CodeProcessorUnavailable},
		{name: "Forbidden", fault: processorsim.Fault{Kind: processorsim.FaultStatus, Status: http.StatusForbidden}, code: httpapi.CodeProcessorUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, withProcessor())
			o := e.newOrder(t, e.a, "inv-1")
			const key = "pay-key"
			body := payBody(o.Id.String(), cardVisa)
			derived := chargeKey(e.a.ID, key)
			failed := chargeCall(derived, tt.fault.Kind, tt.charged)

			tt.fault.Path = processorsim.PathCharges
			e.sim.InjectFault(tt.fault)
			res := e.pay(t, e.a.Key, key, body)
			wantProblem(t, res, http.StatusServiceUnavailable, tt.code)
			wantRetryAfter(t, res)
			if tt.fault.RetryAfter > 0 {
				if got := res.header.Get("Retry-After"); got != "2" {
					t.Errorf("Retry-After = %q, want the processor's 2", got)
				}
			}
			if res.header.Get(httpapi.ReplayedHeader) != "" {
				t.Error("a 503 must not be marked as a replay")
			}
			row := e.onePayment(t, o.Id.String())

			t.Run("KeyIsReleasedAtChargeSent", func(t *testing.T) {
				e.wantKeyState(t, e.a.ID, endpointPayments, key, keyState{
					State: "in_progress", RecoveryPoint: "charge_sent", LeaseHeld: tt.held, ResourceID: row.ID,
				})
				want := paymentRow{ID: row.ID, Status: "charge_sent", Amount: orderAmount, Currency: "EUR", PaymentMethod: cardVisa, ChargeKey: derived}
				if diff := cmp.Diff(want, row); diff != "" {
					t.Errorf("payment row (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(orderEvents{}, e.orderEvents(t, o.Id.String())); diff != "" {
					t.Errorf("order row (-want +got):\n%s", diff)
				}
				if got := decodePayment(t, e.get(t, e.a.Key, "/v1/payments/"+row.ID)).Status; got != "processing" {
					t.Errorf("GET payment status = %q, want processing: the charge may still land", got)
				}
				e.wantCalls(t, failed)
				wantCharges := 0
				if tt.charged {
					wantCharges = 1
				}
				if n := len(e.sim.Charges()); n != wantCharges {
					t.Errorf("charges at the processor = %d, want %d", n, wantCharges)
				}
			})

			calls := []call{failed}
			if tt.unknown && !tt.charged {
				// Nothing found, and the first call may still land: no
				// second charge call, nothing final.
				res := e.pay(t, e.a.Key, key, body)
				wantProblem(t, res, http.StatusServiceUnavailable, httpapi.CodeOutcomeUnknown)
				wantRetryAfter(t, res)
				calls = append(calls, lookupCall)
				e.wantCalls(t, calls...)
				e.wantKeyState(t, e.a.ID, endpointPayments, key, keyState{
					State: "in_progress", RecoveryPoint: "charge_sent", LeaseHeld: true, ResourceID: row.ID,
				})
				e.passSettleWindow(t, e.a.ID, endpointPayments, key)
			}
			if tt.held {
				// The client waits out Retry-After.
				e.setLease(t, e.a.ID, endpointPayments, key, -time.Second)
			}

			retry := e.pay(t, e.a.Key, key, body)
			wantStatus(t, retry, http.StatusCreated)
			if retry.header.Get(httpapi.ReplayedHeader) != "" {
				t.Error("the retry after a processor failure was answered as a replay")
			}
			p := decodePayment(t, retry)

			t.Run("RetryResumesAndChargesExactlyOnce", func(t *testing.T) {
				if p.Id.String() != row.ID {
					t.Errorf("the retry answered payment %s, want the resumed payment %s", p.Id.String(), row.ID)
				}
				// The resumed attempt asks the processor first (S4); it
				// charges again, with the same derived key, only when there
				// is no charge and the first call can no longer land. After
				// a 429 nothing can land, so it charges at once.
				switch {
				case tt.charged:
					calls = append(calls, lookupCall)
				case tt.unknown:
					calls = append(calls, lookupCall, chargeCall(derived, "", true))
				default:
					calls = append(calls, chargeCall(derived, "", true))
				}
				e.wantCalls(t, calls...)
				ch := e.oneCharge(t, derived)
				if n := len(e.sim.Charges()); n != 1 || ch.Status != processor.StatusSucceeded {
					t.Errorf("charges at the processor = %+v, want one succeeded charge", e.sim.Charges())
				}
				if net := e.netCharged(o.Id.String()); net != orderAmount {
					t.Errorf("net charged for the order = %d, want %d", net, orderAmount)
				}
				if p.ChargeId == nil || *p.ChargeId != ch.ID {
					t.Errorf("charge_id = %v, want %s", p.ChargeId, ch.ID)
				}
				want := []paymentRow{{ID: row.ID, Status: "succeeded", Amount: orderAmount, Currency: "EUR", PaymentMethod: cardVisa, ChargeKey: derived, ChargeID: ch.ID}}
				if diff := cmp.Diff(want, e.paymentRows(t, o.Id.String())); diff != "" {
					t.Errorf("payments rows (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(orderEvents{Succeeded: 1, Amount: orderAmount}, e.orderEvents(t, o.Id.String())); diff != "" {
					t.Errorf("order row (-want +got):\n%s", diff)
				}
				e.wantKeyState(t, e.a.ID, endpointPayments, key, completed(http.StatusCreated, row.ID))
				if refunds := e.sim.Refunds(); len(refunds) != 0 {
					t.Errorf("refunds at the processor: %+v, want none", refunds)
				}
			})

			t.Run("FurtherRetryReplays", func(t *testing.T) {
				before := len(e.sim.Calls())
				wantReplay(t, retry, e.pay(t, e.a.Key, key, body))
				if after := len(e.sim.Calls()); after != before {
					t.Errorf("the replay called the processor %d times", after-before)
				}
			})
		})
	}
}

// O2: a transient database failure between two steps releases the key at
// the last committed recovery point; the retry resumes from there. Here the
// record (transaction 2) fails once, after the charge call: the key stays
// at charge_sent, and the retry finds the charge by its derived key instead
// of charging again.
func TestPayTransientDatabaseFailureReleasesTheKey(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	o := e.newOrder(t, e.a, "inv-1")
	ctx := context.Background()
	for _, sql := range []string{
		`CREATE SEQUENCE fail_once`,
		`CREATE FUNCTION fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN
		     -- nextval is not rolled back, so only the first record of the outcome fails.
		     IF NEW.status = 'succeeded' AND nextval('fail_once') = 1 THEN
		         RAISE EXCEPTION 'injected serialization failure' USING ERRCODE = '40001';
		     END IF;
		     RETURN NEW;
		 END $$`,
		`CREATE TRIGGER payments_fail_once BEFORE UPDATE ON payments FOR EACH ROW EXECUTE FUNCTION fail_once()`,
	} {
		if _, err := e.pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	const key = "transient-key"
	body := payBody(o.Id.String(), cardVisa)
	derived := chargeKey(e.a.ID, key)

	res := e.pay(t, e.a.Key, key, body)
	wantProblem(t, res, http.StatusServiceUnavailable, httpapi.CodeUnavailable)
	wantRetryAfter(t, res)
	row := e.onePayment(t, o.Id.String())
	if row.Status != "charge_sent" {
		t.Errorf("payment status = %s, want charge_sent (the record of the outcome rolled back)", row.Status)
	}
	e.wantKeyState(t, e.a.ID, endpointPayments, key, keyState{State: "in_progress", RecoveryPoint: "charge_sent", ResourceID: row.ID})
	e.wantCalls(t, chargeCall(derived, "", true))

	t.Run("RetryResumesAndChargesOnce", func(t *testing.T) {
		res := e.pay(t, e.a.Key, key, body)
		wantStatus(t, res, http.StatusCreated)
		if p := decodePayment(t, res); p.Id.String() != row.ID {
			t.Errorf("the retry answered payment %s, want the resumed payment %s", p.Id.String(), row.ID)
		}
		// The charge call was marked as sent: the resumed attempt looks it
		// up by the derived key, finds it, and records it without a second
		// charge call.
		e.wantCalls(t, chargeCall(derived, "", true), lookupCall)
		e.oneCharge(t, derived)
		e.wantKeyState(t, e.a.ID, endpointPayments, key, completed(http.StatusCreated, row.ID))
		if n := e.count(t, "SELECT last_value FROM fail_once"); n != 2 {
			t.Errorf("trigger ran %d times, want 2", n)
		}
	})
}

// S4: a decline whose answer was lost is found by the resumed attempt and
// recorded as the decline, not charged again.
func TestPayLostDeclineIsFound(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	o := e.newOrder(t, e.a, "inv-1")
	const key = "lost-decline"
	body := payBody(o.Id.String(), cardInsufficientFunds)
	derived := chargeKey(e.a.ID, key)

	e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultLostResponse})
	wantProblem(t, e.pay(t, e.a.Key, key, body), http.StatusServiceUnavailable, httpapi.CodeOutcomeUnknown)

	res := e.pay(t, e.a.Key, key, body)
	p := wantProblem(t, res, http.StatusPaymentRequired, httpapi.CodeCardDeclined)
	if deref(p.DeclineCode) != "insufficient_funds" {
		t.Errorf("decline_code = %q, want insufficient_funds", deref(p.DeclineCode))
	}
	ch := e.oneCharge(t, derived)
	e.wantCalls(t, chargeCall(derived, processorsim.FaultLostResponse, true), lookupCall)
	want := []paymentRow{{
		ID: idString(p.PaymentId), Status: "declined", Amount: orderAmount, Currency: "EUR", PaymentMethod: cardInsufficientFunds,
		ChargeKey: derived, ChargeID: ch.ID, DeclineCode: "insufficient_funds",
	}}
	if diff := cmp.Diff(want, e.paymentRows(t, o.Id.String())); diff != "" {
		t.Errorf("payments rows (-want +got):\n%s", diff)
	}
	e.wantKeyState(t, e.a.ID, endpointPayments, key, completed(http.StatusPaymentRequired, idString(p.PaymentId)))
	wantReplay(t, res, e.pay(t, e.a.Key, key, body))
}

// L5, S3: while another attempt holds the key's lease, a retry gets 409 and
// changes nothing; once the lease runs out, the retry takes the key over
// with a new fencing token and finishes the payment.
func TestPayKeyInUseWhileTheLeaseIsHeld(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	o := e.newOrder(t, e.a, "inv-1")
	const key = "leased-key"
	body := payBody(o.Id.String(), cardVisa)
	derived := chargeKey(e.a.ID, key)

	e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultServerError})
	wantStatus(t, e.pay(t, e.a.Key, key, body), http.StatusServiceUnavailable)
	row := e.onePayment(t, o.Id.String())
	// Another attempt took the key over and is running: its lease is live.
	e.setLease(t, e.a.ID, endpointPayments, key, time.Hour)
	gen := e.leaseGeneration(t, e.a.ID, endpointPayments, key)

	res := e.pay(t, e.a.Key, key, body)
	wantProblem(t, res, http.StatusConflict, httpapi.CodeKeyInUse)
	wantRetryAfter(t, res)
	e.wantKeyState(t, e.a.ID, endpointPayments, key, keyState{
		State: "in_progress", RecoveryPoint: "charge_sent", LeaseHeld: true, ResourceID: row.ID,
	})
	if got := e.leaseGeneration(t, e.a.ID, endpointPayments, key); got != gen {
		t.Errorf("lease generation = %d, want %d: a 409 must not take the key over", got, gen)
	}
	e.wantCalls(t, chargeCall(derived, processorsim.FaultServerError, false))

	t.Run("RetryAfterTheLeaseExpiredTakesOver", func(t *testing.T) {
		e.passSettleWindow(t, e.a.ID, endpointPayments, key) // ends the lease too
		res := e.pay(t, e.a.Key, key, body)
		wantStatus(t, res, http.StatusCreated)
		if got := e.leaseGeneration(t, e.a.ID, endpointPayments, key); got != gen+1 {
			t.Errorf("lease generation = %d, want %d (the takeover fences the earlier attempt)", got, gen+1)
		}
		e.oneCharge(t, derived)
		e.wantKeyState(t, e.a.ID, endpointPayments, key, completed(http.StatusCreated, row.ID))
	})
}

// T3: the same key with another request is refused, completed or not, and
// nothing new is written or charged. K2: another tenant's same key is
// another key.
func TestPayKeyReuse(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	o1 := e.newOrder(t, e.a, "inv-1")
	o2 := e.newOrder(t, e.a, "inv-2")

	const key = "reused-key"
	first := e.pay(t, e.a.Key, key, payBody(o1.Id.String(), cardVisa))
	wantStatus(t, first, http.StatusCreated)
	p := decodePayment(t, first)

	t.Run("CompletedKeyWithAnotherBodyIsRejected", func(t *testing.T) {
		res := e.pay(t, e.a.Key, key, payBody(o2.Id.String(), cardVisa))
		wantProblem(t, res, http.StatusUnprocessableEntity, httpapi.CodeKeyReused)
		if res.header.Get(httpapi.ReplayedHeader) != "" {
			t.Error("a 422 must not be marked as a replay")
		}
		if rows := e.paymentRows(t, o2.Id.String()); len(rows) != 0 {
			t.Errorf("payments of the second order: %+v, want none", rows)
		}
		e.wantKeyState(t, e.a.ID, endpointPayments, key, completed(http.StatusCreated, p.Id.String()))
		e.wantCalls(t, chargeCall(chargeKey(e.a.ID, key), "", true))
	})

	t.Run("ReleasedKeyWithAnotherBodyIsNotTakenOver", func(t *testing.T) {
		const key = "released-key"
		derived := chargeKey(e.a.ID, key)
		e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultServerError})
		wantStatus(t, e.pay(t, e.a.Key, key, payBody(o2.Id.String(), cardVisa)), http.StatusServiceUnavailable)
		row := e.onePayment(t, o2.Id.String())
		gen := e.leaseGeneration(t, e.a.ID, endpointPayments, key)
		calls := len(e.sim.Calls())

		res := e.pay(t, e.a.Key, key, payBody(o2.Id.String(), processorsim.PaymentMethodMastercard))
		wantProblem(t, res, http.StatusUnprocessableEntity, httpapi.CodeKeyReused)
		e.wantKeyState(t, e.a.ID, endpointPayments, key, keyState{State: "in_progress", RecoveryPoint: "charge_sent", ResourceID: row.ID})
		if got := e.leaseGeneration(t, e.a.ID, endpointPayments, key); got != gen {
			t.Errorf("lease generation = %d, want %d: another request must never take the key over", got, gen)
		}
		if n := len(e.sim.Calls()); n != calls {
			t.Errorf("processor calls = %d, want %d", n, calls)
		}

		// The original request still resumes.
		e.passSettleWindow(t, e.a.ID, endpointPayments, key)
		wantStatus(t, e.pay(t, e.a.Key, key, payBody(o2.Id.String(), cardVisa)), http.StatusCreated)
		e.oneCharge(t, derived)
	})

	t.Run("SameKeyOnAnotherTenantIsAnotherKey", func(t *testing.T) {
		ob := e.newOrder(t, e.b, "inv-1")
		res := e.pay(t, e.b.Key, key, payBody(ob.Id.String(), cardVisa))
		wantStatus(t, res, http.StatusCreated)
		if res.header.Get(httpapi.ReplayedHeader) != "" {
			t.Error("tenant b got a replay of tenant a's response")
		}
		// The tenant is part of the derived key, so the processor does not
		// take tenant b's charge for a retry of tenant a's.
		if chargeKey(e.b.ID, key) == chargeKey(e.a.ID, key) {
			t.Fatal("two tenants' keys derive the same processor key")
		}
		e.oneCharge(t, chargeKey(e.b.ID, key))
		e.oneCharge(t, chargeKey(e.a.ID, key))
	})
}

// S4: against a processor that ignores idempotency keys, a resumed payment
// looks its charge up instead of charging again, and refunds any duplicate.
func TestPayAgainstAProcessorWithoutIdempotency(t *testing.T) {
	t.Parallel()

	t.Run("LostResponseIsLookedUpNotChargedAgain", func(t *testing.T) {
		t.Parallel()
		e := setup(t, withProcessor())
		e.sim.SetIgnoreIdempotencyKeys(true)
		o := e.newOrder(t, e.a, "inv-1")
		const key = "pay-key"
		body := payBody(o.Id.String(), cardVisa)
		derived := chargeKey(e.a.ID, key)

		e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultLostResponse})
		wantProblem(t, e.pay(t, e.a.Key, key, body), http.StatusServiceUnavailable, httpapi.CodeOutcomeUnknown)
		res := e.pay(t, e.a.Key, key, body)
		wantStatus(t, res, http.StatusCreated)

		ch := e.oneCharge(t, derived)
		if n := len(e.sim.Charges()); n != 1 {
			t.Errorf("charges at the processor = %d, want 1", n)
		}
		e.wantCalls(t, chargeCall(derived, processorsim.FaultLostResponse, true), lookupCall)
		if p := decodePayment(t, res); p.ChargeId == nil || *p.ChargeId != ch.ID {
			t.Errorf("charge_id = %v, want the charge the lost call made, %s", p.ChargeId, ch.ID)
		}
		if n := len(e.sim.Refunds()); n != 0 {
			t.Errorf("refunds at the processor = %d, want 0", n)
		}
		if diff := cmp.Diff(orderEvents{Succeeded: 1, Amount: orderAmount}, e.orderEvents(t, o.Id.String())); diff != "" {
			t.Errorf("order row (-want +got):\n%s", diff)
		}
	})

	t.Run("DuplicateChargeIsRefunded", func(t *testing.T) {
		t.Parallel()
		e := setup(t, withProcessor())
		e.sim.SetIgnoreIdempotencyKeys(true)
		o := e.newOrder(t, e.a, "inv-1")
		const key = "pay-key"
		body := payBody(o.Id.String(), cardVisa)

		e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultLostResponse})
		wantProblem(t, e.pay(t, e.a.Key, key, body), http.StatusServiceUnavailable, httpapi.CodeOutcomeUnknown)
		calls := e.sim.Calls()
		if len(calls) != 1 {
			t.Fatalf("processor calls = %+v, want the one lost charge", calls)
		}
		derived := calls[0].IdempotencyKey
		if derived != chargeKey(e.a.ID, key) {
			t.Errorf("charge key = %q, want the derived key %q", derived, chargeKey(e.a.ID, key))
		}
		kept := e.oneCharge(t, derived)
		// Some earlier attempt charged twice under the one key, as a
		// processor without deduplication allows.
		dup := e.sim.CreateChargeDirect(processor.ChargeRequest{
			Amount: kept.Amount, Currency: kept.Currency, PaymentMethod: kept.PaymentMethod, Metadata: kept.Metadata,
		}, derived)

		retry := e.pay(t, e.a.Key, key, body)
		wantStatus(t, retry, http.StatusCreated)
		p := decodePayment(t, retry)
		// The lookup saw the double charge: the sweep is due at once.
		if n, err := e.payments.Sweep(t.Context(), 10); err != nil || n != 1 {
			t.Fatalf("Sweep = %d, %v; want the one payment swept", n, err)
		}

		t.Run("TheFirstChargeIsKept", func(t *testing.T) {
			if p.ChargeId == nil || *p.ChargeId != kept.ID {
				t.Errorf("charge_id = %v, want the first charge %s", p.ChargeId, kept.ID)
			}
			row := e.onePayment(t, o.Id.String())
			if row.Status != "succeeded" || row.ChargeID != kept.ID || row.RefundedAmount != 0 {
				t.Errorf("payment row = %+v, want succeeded with charge %s and nothing refunded", row, kept.ID)
			}
			if diff := cmp.Diff(orderEvents{Succeeded: 1, Amount: orderAmount}, e.orderEvents(t, o.Id.String())); diff != "" {
				t.Errorf("order row (-want +got):\n%s", diff)
			}
			if rows := e.refundRows(t, p.Id.String()); len(rows) != 0 {
				t.Errorf("refunds rows = %+v; the duplicate's refund is not a refund of the payment", rows)
			}
		})

		t.Run("TheDuplicateIsRefundedInFull", func(t *testing.T) {
			refunds := e.sim.Refunds()
			if len(refunds) != 1 {
				t.Fatalf("refunds at the processor = %+v, want one", refunds)
			}
			re := refunds[0]
			if re.Charge != dup.ID || re.Amount != dup.Amount || re.Status != processor.StatusSucceeded {
				t.Errorf("refund = %+v, want the whole duplicate %s (%d) refunded", re, dup.ID, dup.Amount)
			}
			wantDerivedKey(t, re.IdempotencyKey, key)
			if re.IdempotencyKey == derived {
				t.Error("the compensating refund reused the charge's derived key")
			}
			e.wantCalls(t,
				chargeCall(derived, processorsim.FaultLostResponse, true),
				lookupCall,
				lookupCall, // the sweep's
				refundCall(re.IdempotencyKey, "", true))
			if net := e.netCharged(o.Id.String()); net != orderAmount {
				t.Errorf("net charged = %d, want %d", net, orderAmount)
			}
		})

		t.Run("ThePaymentShowsTheCompensation", func(t *testing.T) {
			got := decodePayment(t, e.get(t, e.a.Key, "/v1/payments/"+p.Id.String())).Compensations
			refundID := e.sim.Refunds()[0].ID
			want := []api.Compensation{{ChargeId: dup.ID, Amount: dup.Amount, Reason: api.DuplicateCharge, Status: api.CompensationStatusSucceeded, RefundId: &refundID}}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("compensations (-want +got):\n%s", diff)
			}
		})

		t.Run("FurtherRetryReplays", func(t *testing.T) {
			before := len(e.sim.Calls())
			wantReplay(t, retry, e.pay(t, e.a.Key, key, body))
			if after := len(e.sim.Calls()); after != before {
				t.Errorf("the replay called the processor %d times", after-before)
			}
		})
	})
}

// S1: a client that never retries still gets its payment finished: the
// completer takes the released key over and records the response, which a
// late retry replays.
func TestCompleterFinishesAnAbandonedPayment(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	o := e.newOrder(t, e.a, "inv-1")
	const key = "abandoned-key"
	body := payBody(o.Id.String(), cardVisa)
	derived := chargeKey(e.a.ID, key)

	e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathCharges, Kind: processorsim.FaultServerError})
	wantStatus(t, e.pay(t, e.a.Key, key, body), http.StatusServiceUnavailable)
	row := e.onePayment(t, o.Id.String())
	e.passSettleWindow(t, e.a.ID, endpointPayments, key)

	if n := payments.NewCompleter(e.payments, time.Hour).RunOnce(t.Context()); n != 1 {
		t.Fatalf("the completer took over %d keys, want 1", n)
	}
	e.wantKeyState(t, e.a.ID, endpointPayments, key, completed(http.StatusCreated, row.ID))
	ch := e.oneCharge(t, derived)
	e.wantCalls(t, chargeCall(derived, processorsim.FaultServerError, false), lookupCall, chargeCall(derived, "", true))
	if got := e.onePayment(t, o.Id.String()); got.Status != "succeeded" || got.ChargeID != ch.ID {
		t.Errorf("payment row = %+v, want succeeded with charge %s", got, ch.ID)
	}
	if diff := cmp.Diff(orderEvents{Succeeded: 1, Amount: orderAmount}, e.orderEvents(t, o.Id.String())); diff != "" {
		t.Errorf("order row (-want +got):\n%s", diff)
	}

	t.Run("LateRetryReplaysTheCompletersResponse", func(t *testing.T) {
		res := e.pay(t, e.a.Key, key, body)
		wantStatus(t, res, http.StatusCreated)
		if got := res.header.Get(httpapi.ReplayedHeader); got != "true" {
			t.Errorf("%s = %q, want true", httpapi.ReplayedHeader, got)
		}
		if got, want := res.header.Get("Location"), "/v1/payments/"+row.ID; got != want {
			t.Errorf("Location = %q, want %q", got, want)
		}
		got := e.get(t, e.a.Key, "/v1/payments/"+row.ID)
		if diff := cmp.Diff(decodePayment(t, got), decodePayment(t, res)); diff != "" {
			t.Errorf("recorded payment differs from GET (-get +recorded):\n%s", diff)
		}
		if n := len(e.sim.Calls()); n != 3 {
			t.Errorf("processor calls = %d, want 3", n)
		}
	})
}

// T2: identical requests in parallel under one key charge once; requests
// under new keys for one order are stopped by the backstop (N1).
func TestPayConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	const n = 8

	t.Run("OneKey", func(t *testing.T) {
		o := e.newOrder(t, e.a, "inv-1")
		const key = "concurrent-key"
		body := []byte(payBody(o.Id.String(), cardVisa))
		results := testkit.Fire(t, n, func(int) (response, error) {
			return e.send(t.Context(), http.MethodPost, "/v1/payments", e.a.Key, body, withHeader(idem.HeaderName, key))
		})
		fresh := 0
		for i, res := range results {
			switch {
			case res.status == http.StatusCreated && res.header.Get(httpapi.ReplayedHeader) == "":
				fresh++
			case res.status == http.StatusCreated:
			case res.status == http.StatusConflict:
				wantProblem(t, res, http.StatusConflict, httpapi.CodeKeyInUse)
				wantRetryAfter(t, res)
			default:
				t.Errorf("request %d: status %d, want 201 or 409; body: %s", i, res.status, res.body)
			}
		}
		if fresh != 1 {
			t.Errorf("fresh 201s = %d, want 1", fresh)
		}
		derived := chargeKey(e.a.ID, key)
		e.oneCharge(t, derived)
		var posts int
		for _, c := range e.processorCalls() {
			if c.Key == derived {
				posts++
			}
		}
		if posts != 1 {
			t.Errorf("charge calls under the key = %d, want 1", posts)
		}
		if rows := e.paymentRows(t, o.Id.String()); len(rows) != 1 {
			t.Errorf("payments rows = %+v, want one", rows)
		}
	})

	t.Run("NewKeyPerRequest", func(t *testing.T) {
		o := e.newOrder(t, e.a, "inv-2")
		body := []byte(payBody(o.Id.String(), cardVisa))
		results := testkit.Fire(t, n, func(i int) (response, error) {
			return e.send(t.Context(), http.MethodPost, "/v1/payments", e.a.Key, body, withHeader(idem.HeaderName, fmt.Sprintf("new-key-%d", i)))
		})
		var created []api.Payment
		var conflicts []api.Problem
		for i, res := range results {
			switch res.status {
			case http.StatusCreated:
				created = append(created, decodePayment(t, res))
			case http.StatusConflict:
				conflicts = append(conflicts, wantProblem(t, res, http.StatusConflict, httpapi.CodePaymentExists))
			default:
				t.Errorf("request %d: status %d, want 201 or 409; body: %s", i, res.status, res.body)
			}
		}
		if len(created) != 1 {
			t.Fatalf("201s = %d, want 1", len(created))
		}
		for _, p := range conflicts {
			if idString(p.PaymentId) != created[0].Id.String() {
				t.Errorf("payment_id = %q, want %q", idString(p.PaymentId), created[0].Id.String())
			}
		}
		rows := e.paymentRows(t, o.Id.String())
		if len(rows) != 1 {
			t.Fatalf("payments rows = %+v, want one", rows)
		}
		e.oneCharge(t, rows[0].ChargeKey)
		if diff := cmp.Diff(orderEvents{Succeeded: 1, Amount: orderAmount}, e.orderEvents(t, o.Id.String())); diff != "" {
			t.Errorf("order row (-want +got):\n%s", diff)
		}
	})
}

// H: one tenant's payments are invisible to another; unknown and malformed
// ids are indistinguishable from them.
func TestGetPayment(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	_, p := e.paidOrder(t, e.a, "inv-1")

	t.Run("OwnerSeesThePayment", func(t *testing.T) {
		res := e.get(t, e.a.Key, "/v1/payments/"+p.Id.String())
		wantStatus(t, res, http.StatusOK)
		if diff := cmp.Diff(p, decodePayment(t, res)); diff != "" {
			t.Errorf("payment (-created +get):\n%s", diff)
		}
	})

	tests := []struct {
		name string
		key  string
		path string
	}{
		{name: "OtherTenantsPayment", key: e.b.Key, path: "/v1/payments/" + p.Id.String()},
		{name: "UnknownID", key: e.a.Key, path: "/v1/payments/" + uuid.NewString()},
		{name: "MalformedID", key: e.a.Key, path: "/v1/payments/not-a-uuid"},
		{name: "IDWithTrailingJunk", key: e.a.Key, path: "/v1/payments/" + p.Id.String() + "x"},
	}
	for _, tt := range tests {
		t.Run(tt.name+"IsNotFound", func(t *testing.T) {
			res := e.get(t, tt.key, tt.path)
			wantProblem(t, res, http.StatusNotFound, httpapi.CodeNotFound)
			if strings.Contains(string(res.body), p.Id.String()) {
				t.Errorf("the 404 mentions the payment id: %s", res.body)
			}
		})
	}

	t.Run("UnauthenticatedIsRejected", func(t *testing.T) {
		wantProblem(t, e.get(t, "", "/v1/payments/"+p.Id.String()), http.StatusUnauthorized, httpapi.CodeUnauthorized)
	})
}

// --- Refunds ---

// S1, S2, O1: partial refunds up to the payment's amount, each once at the
// processor under its own derived key; more is refused before the
// processor is called.
func TestRefund(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	_, p := e.paidOrder(t, e.a, "inv-1")
	chargeID := *p.ChargeId
	payKey := chargeKey(e.a.ID, "pay-inv-1")

	// refundCalls counts the POST /v1/refunds the simulator saw.
	refundCalls := func() int {
		n := 0
		for _, c := range e.processorCalls() {
			if c.Method == http.MethodPost && c.Path == processorsim.PathRefunds {
				n++
			}
		}
		return n
	}
	wantRefunded := func(t *testing.T, amount int64) {
		t.Helper()
		res := e.get(t, e.a.Key, "/v1/payments/"+p.Id.String())
		wantStatus(t, res, http.StatusOK)
		if got := decodePayment(t, res).RefundedAmount; got != amount {
			t.Errorf("refunded_amount = %d, want %d", got, amount)
		}
		ch := e.oneCharge(t, payKey)
		if ch.RefundedAmount != amount {
			t.Errorf("refunded at the processor = %d, want %d", ch.RefundedAmount, amount)
		}
	}

	var r1 api.Refund
	t.Run("PartialRefund", func(t *testing.T) {
		const key = "refund-1"
		first := e.refund(t, e.a.Key, key, p.Id.String(), refundBody(1000))
		wantStatus(t, first, http.StatusCreated)
		r1 = decodeRefund(t, first)
		want := api.Refund{Id: r1.Id, PaymentId: p.Id, Amount: 1000, Status: api.RefundStatusSucceeded, CreatedAt: r1.CreatedAt}
		if diff := cmp.Diff(want, r1); diff != "" {
			t.Errorf("refund (-want +got):\n%s", diff)
		}

		wantReplay(t, first, e.refund(t, e.a.Key, key, p.Id.String(), refundBody(1000)))

		derived := refundKey(e.a.ID, key)
		wantDerivedKey(t, derived, key)
		if derived == payKey {
			t.Error("the refund's derived key equals the charge's")
		}
		refunds := e.refundsUnder(derived)
		if len(refunds) != 1 || refunds[0].Charge != chargeID || refunds[0].Amount != 1000 {
			t.Fatalf("processor refunds under the derived key: %+v, want one of 1000 on %s", refunds, chargeID)
		}
		if n := refundCalls(); n != 1 {
			t.Errorf("refund calls = %d, want 1", n)
		}
		wantRows := []refundRow{{ID: r1.Id.String(), Amount: 1000, Status: "succeeded", RefundKey: derived, ProcessorRefundID: refunds[0].ID}}
		if diff := cmp.Diff(wantRows, e.refundRows(t, p.Id.String())); diff != "" {
			t.Errorf("refunds rows (-want +got):\n%s", diff)
		}
		e.wantKeyState(t, e.a.ID, endpointRefunds, key, completed(http.StatusCreated, r1.Id.String()))
		wantRefunded(t, 1000)
	})

	t.Run("MoreThanIsLeftIsRejectedAndRecorded", func(t *testing.T) {
		const key = "refund-too-much"
		first := e.refund(t, e.a.Key, key, p.Id.String(), refundBody(1501))
		pr := wantProblem(t, first, http.StatusUnprocessableEntity, httpapi.CodeRefundExceeds)
		if !strings.Contains(deref(pr.Detail), "1500") {
			t.Errorf("detail = %q, want it to say 1500 can still be refunded", deref(pr.Detail))
		}
		e.wantKeyState(t, e.a.ID, endpointRefunds, key, completed(http.StatusUnprocessableEntity, ""))
		wantReplay(t, first, e.refund(t, e.a.Key, key, p.Id.String(), refundBody(1501)))
		if n := refundCalls(); n != 1 {
			t.Errorf("refund calls = %d, want still 1", n)
		}
		if rows := e.refundRows(t, p.Id.String()); len(rows) != 1 {
			t.Errorf("refunds rows = %+v, want only the first", rows)
		}
		wantRefunded(t, 1000)
	})

	t.Run("SecondPartialRefundUpToTheTotal", func(t *testing.T) {
		const key = "refund-2"
		res := e.refund(t, e.a.Key, key, p.Id.String(), refundBody(1500))
		wantStatus(t, res, http.StatusCreated)
		r2 := decodeRefund(t, res)
		refunds := e.refundsUnder(refundKey(e.a.ID, key))
		if len(refunds) != 1 || refunds[0].Amount != 1500 {
			t.Fatalf("processor refunds under the second key: %+v, want one of 1500", refunds)
		}
		wantRows := []refundRow{
			{ID: r1.Id.String(), Amount: 1000, Status: "succeeded", RefundKey: refundKey(e.a.ID, "refund-1"), ProcessorRefundID: e.refundsUnder(refundKey(e.a.ID, "refund-1"))[0].ID},
			{ID: r2.Id.String(), Amount: 1500, Status: "succeeded", RefundKey: refundKey(e.a.ID, key), ProcessorRefundID: refunds[0].ID},
		}
		if diff := cmp.Diff(wantRows, e.refundRows(t, p.Id.String())); diff != "" {
			t.Errorf("refunds rows (-want +got):\n%s", diff)
		}
		if n := refundCalls(); n != 2 {
			t.Errorf("refund calls = %d, want 2", n)
		}
		wantRefunded(t, orderAmount)
	})

	t.Run("NothingLeftToRefund", func(t *testing.T) {
		pr := wantProblem(t, e.refund(t, e.a.Key, "refund-3", p.Id.String(), refundBody(1)), http.StatusUnprocessableEntity, httpapi.CodeRefundExceeds)
		if !strings.Contains(deref(pr.Detail), "At most 0") {
			t.Errorf("detail = %q, want it to say nothing can be refunded", deref(pr.Detail))
		}
		if n := refundCalls(); n != 2 {
			t.Errorf("refund calls = %d, want 2", n)
		}
	})

	t.Run("AmountZeroIsRecordedAsAValidationFailure", func(t *testing.T) {
		first := e.refund(t, e.a.Key, "refund-zero", p.Id.String(), refundBody(0))
		pr := wantProblem(t, first, http.StatusBadRequest, httpapi.CodeValidationFailed)
		if len(deref(pr.Errors)) != 1 || deref(pr.Errors)[0].Field != "amount" {
			t.Errorf("errors = %+v, want one for amount", deref(pr.Errors))
		}
		e.wantKeyState(t, e.a.ID, endpointRefunds, "refund-zero", completed(http.StatusBadRequest, ""))
		wantReplay(t, first, e.refund(t, e.a.Key, "refund-zero", p.Id.String(), refundBody(0)))
	})

	t.Run("SameKeyForAnotherPaymentIsReused", func(t *testing.T) {
		// The payment id is a path parameter, part of the fingerprint (F2).
		_, p2 := e.paidOrder(t, e.a, "inv-2")
		res := e.refund(t, e.a.Key, "refund-1", p2.Id.String(), refundBody(1000))
		wantProblem(t, res, http.StatusUnprocessableEntity, httpapi.CodeKeyReused)
		if rows := e.refundRows(t, p2.Id.String()); len(rows) != 0 {
			t.Errorf("refunds of the second payment: %+v, want none", rows)
		}
		if n := refundCalls(); n != 2 {
			t.Errorf("refund calls = %d, want 2", n)
		}

		t.Run("ThePaymentsKeyIsAnotherKeyOnTheRefundEndpoint", func(t *testing.T) {
			// K2: a key is scoped by endpoint.
			res := e.refund(t, e.a.Key, "pay-inv-2", p2.Id.String(), refundBody(500))
			wantStatus(t, res, http.StatusCreated)
			if refunds := e.refundsUnder(refundKey(e.a.ID, "pay-inv-2")); len(refunds) != 1 {
				t.Errorf("processor refunds under the key: %+v, want one", refunds)
			}
		})
	})
}

// O1, O3, H: refunds of payments that cannot be refunded are refused before
// the processor; those decided after the claim are recorded.
func TestRefundRejected(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	o := e.newOrder(t, e.a, "inv-1")
	declined := wantProblem(t, e.pay(t, e.a.Key, "pay-declined", payBody(o.Id.String(), cardDeclined)),
		http.StatusPaymentRequired, httpapi.CodeCardDeclined)
	_, otherTenants := e.paidOrder(t, e.b, "inv-b")

	tests := []struct {
		name      string
		paymentID string
		status    int
		code      string
		// recorded: decided after the claim. A malformed id is refused
		// before it.
		recorded bool
	}{
		{name: "DeclinedPaymentIsNotRefundable", paymentID: idString(declined.PaymentId), status: 409, code: httpapi.CodeNotRefundable, recorded: true},
		{name: "UnknownPayment", paymentID: uuid.NewString(), status: 404, code: httpapi.CodeNotFound, recorded: true},
		{name: "OtherTenantsPayment", paymentID: otherTenants.Id.String(), status: 404, code: httpapi.CodeNotFound, recorded: true},
		{name: "MalformedPaymentID", paymentID: "not-a-uuid", status: 404, code: httpapi.CodeNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "refund-" + tt.name
			first := e.refund(t, e.a.Key, key, tt.paymentID, refundBody(100))
			wantProblem(t, first, tt.status, tt.code)
			again := e.refund(t, e.a.Key, key, tt.paymentID, refundBody(100))
			if tt.recorded {
				e.wantKeyState(t, e.a.ID, endpointRefunds, key, completed(tt.status, ""))
				wantReplay(t, first, again)
			} else {
				if n := e.count(t, "SELECT count(*) FROM idempotency_keys WHERE idem_key = $1", key); n != 0 {
					t.Errorf("key rows = %d, want 0", n)
				}
				wantProblem(t, again, tt.status, tt.code)
				if again.header.Get(httpapi.ReplayedHeader) != "" {
					t.Error("an unrecorded answer was marked as a replay")
				}
			}
		})
	}

	t.Run("NothingReachedTheProcessor", func(t *testing.T) {
		if n := e.count(t, "SELECT count(*) FROM refunds"); n != 0 {
			t.Errorf("refunds rows = %d, want 0", n)
		}
		if refunds := e.sim.Refunds(); len(refunds) != 0 {
			t.Errorf("processor refunds: %+v, want none", refunds)
		}
		for _, c := range e.processorCalls() {
			if c.Path == processorsim.PathRefunds {
				t.Errorf("processor call %+v, want no refund call", c)
			}
		}
		if got := e.paymentRows(t, o.Id.String()); len(got) != 1 || got[0].Status != "declined" {
			t.Errorf("payments rows = %+v, want the one declined payment", got)
		}
	})
}

// T4, O2: a refund whose processor call fails is released at refund_sent;
// the retry resends it under the same derived key, and the payment is
// refunded exactly once.
func TestRefundProcessorFailure(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		fault processorsim.FaultKind
		// executed: the failed call made the refund; only its answer was
		// lost, and the processor replays it to the retry.
		executed bool
	}{
		{name: "Timeout", fault: processorsim.FaultTimeout},
		{name: "ServerError", fault: processorsim.FaultServerError},
		{name: "LostResponse", fault: processorsim.FaultLostResponse, executed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, withProcessor())
			_, p := e.paidOrder(t, e.a, "inv-1")
			const key = "refund-key"
			derived := refundKey(e.a.ID, key)
			calls := e.processorCalls() // the payment's

			e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathRefunds, Kind: tt.fault})
			res := e.refund(t, e.a.Key, key, p.Id.String(), refundBody(1000))
			wantProblem(t, res, http.StatusServiceUnavailable, httpapi.CodeOutcomeUnknown)
			wantRetryAfter(t, res)
			rows := e.refundRows(t, p.Id.String())
			if len(rows) != 1 || rows[0].Status != "refund_sent" || rows[0].RefundKey != derived {
				t.Fatalf("refunds rows = %+v, want one at refund_sent under the derived key", rows)
			}
			e.wantKeyState(t, e.a.ID, endpointRefunds, key, keyState{State: "in_progress", RecoveryPoint: "refund_sent", ResourceID: rows[0].ID})
			if got := e.onePayment(t, p.OrderId.String()).RefundedAmount; got != 0 {
				t.Errorf("refunded_amount = %d, want 0 before the refund is confirmed", got)
			}
			lookup := call{Method: http.MethodGet, Path: processorsim.PathRefunds}
			retried := []call{lookup}
			if !tt.executed {
				// Nothing found, and the failed call may still land: no
				// second refund call until the settle window has passed.
				wantProblem(t, e.refund(t, e.a.Key, key, p.Id.String(), refundBody(1000)), http.StatusServiceUnavailable, httpapi.CodeOutcomeUnknown)
				e.passSettleWindow(t, e.a.ID, endpointRefunds, key)
				retried = append(retried, lookup, refundCall(derived, "", true))
			}

			retry := e.refund(t, e.a.Key, key, p.Id.String(), refundBody(1000))
			wantStatus(t, retry, http.StatusCreated)
			r := decodeRefund(t, retry)

			refunds := e.refundsUnder(derived)
			if len(refunds) != 1 || len(e.sim.Refunds()) != 1 || refunds[0].Amount != 1000 {
				t.Fatalf("processor refunds = %+v, want exactly one of 1000 under the derived key", e.sim.Refunds())
			}
			// The resumed attempt looks the refund up first; it sends it
			// again only when the failed call never executed.
			e.wantCalls(t, append(append(calls, refundCall(derived, tt.fault, tt.executed)), retried...)...)
			wantRows := []refundRow{{ID: r.Id.String(), Amount: 1000, Status: "succeeded", RefundKey: derived, ProcessorRefundID: refunds[0].ID}}
			if diff := cmp.Diff(wantRows, e.refundRows(t, p.Id.String())); diff != "" {
				t.Errorf("refunds rows (-want +got):\n%s", diff)
			}
			if got := e.onePayment(t, p.OrderId.String()).RefundedAmount; got != 1000 {
				t.Errorf("refunded_amount = %d, want 1000", got)
			}
			e.wantKeyState(t, e.a.ID, endpointRefunds, key, completed(http.StatusCreated, r.Id.String()))
			wantReplay(t, retry, e.refund(t, e.a.Key, key, p.Id.String(), refundBody(1000)))
		})
	}
}

// O1: a refund the processor refuses is recorded as failed and does not
// count against the payment.
func TestRefundRejectedByTheProcessor(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	o, p := e.paidOrder(t, e.a, "inv-1")
	// The processor does not know the payment's charge (any more).
	if _, err := e.pool.Exec(context.Background(), `UPDATE payments SET charge_id = 'ch_unknown' WHERE id::text = $1`, p.Id.String()); err != nil {
		t.Fatal(err)
	}
	const key = "refund-key"
	derived := refundKey(e.a.ID, key)

	first := e.refund(t, e.a.Key, key, p.Id.String(), refundBody(1000))
	wantProblem(t, first, http.StatusUnprocessableEntity, httpapi.CodeProcessorRejected)
	rows := e.refundRows(t, p.Id.String())
	if len(rows) != 1 || rows[0].Status != "failed" || rows[0].ProcessorRefundID != "" {
		t.Fatalf("refunds rows = %+v, want one failed", rows)
	}
	e.wantKeyState(t, e.a.ID, endpointRefunds, key, completed(http.StatusUnprocessableEntity, rows[0].ID))
	wantReplay(t, first, e.refund(t, e.a.Key, key, p.Id.String(), refundBody(1000)))
	if n := len(e.sim.Refunds()); n != 0 {
		t.Errorf("processor refunds = %d, want 0", n)
	}
	e.wantCalls(t, chargeCall(chargeKey(e.a.ID, "pay-inv-1"), "", true), refundCall(derived, "", false))
	if got := e.onePayment(t, o.Id.String()).RefundedAmount; got != 0 {
		t.Errorf("refunded_amount = %d, want 0", got)
	}
}

// S4: against a processor that ignores idempotency keys, a resumed refund
// must find the refund its lost call made instead of sending it again.
func TestRefundAgainstAProcessorWithoutIdempotency(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	_, p := e.paidOrder(t, e.a, "inv-1")
	e.sim.SetIgnoreIdempotencyKeys(true)
	const key = "refund-key"
	derived := refundKey(e.a.ID, key)

	e.sim.InjectFault(processorsim.Fault{Path: processorsim.PathRefunds, Kind: processorsim.FaultLostResponse})
	wantProblem(t, e.refund(t, e.a.Key, key, p.Id.String(), refundBody(1000)), http.StatusServiceUnavailable, httpapi.CodeOutcomeUnknown)
	res := e.refund(t, e.a.Key, key, p.Id.String(), refundBody(1000))
	wantStatus(t, res, http.StatusCreated)

	if refunds := e.sim.Refunds(); len(refunds) != 1 || refunds[0].IdempotencyKey != derived {
		t.Errorf("processor refunds = %+v, want exactly one under the derived key", refunds)
	}
	if ch := e.oneCharge(t, chargeKey(e.a.ID, "pay-inv-1")); ch.RefundedAmount != 1000 {
		t.Errorf("refunded at the processor = %d, want 1000", ch.RefundedAmount)
	}
	if got := e.onePayment(t, p.OrderId.String()).RefundedAmount; got != 1000 {
		t.Errorf("refunded_amount = %d, want 1000", got)
	}
}

// F2: an id has one spelling, the one the API writes, so two paths never
// name one resource: a retry that spells the payment id in upper case is
// not the same request in disguise but names no payment (404, like any
// unknown id), before any key is looked at, and refunds nothing.
func TestRefundRetryWithUpperCasePaymentIDIsNotFound(t *testing.T) {
	t.Parallel()
	e := setup(t, withProcessor())
	_, p := e.paidOrder(t, e.a, "inv-1")
	const key = "refund-case"
	first := e.refund(t, e.a.Key, key, p.Id.String(), refundBody(1000))
	wantStatus(t, first, http.StatusCreated)
	wantProblem(t, e.refund(t, e.a.Key, key, strings.ToUpper(p.Id.String()), refundBody(1000)), http.StatusNotFound, httpapi.CodeNotFound)
	if n := len(e.sim.Refunds()); n != 1 {
		t.Errorf("refunds at the processor = %d, want 1", n)
	}
	if rows := e.refundRows(t, p.Id.String()); len(rows) != 1 {
		t.Errorf("refunds rows = %+v, want one", rows)
	}
}
