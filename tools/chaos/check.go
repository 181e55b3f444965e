package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/events"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/orders"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/tooling/harness"
	"github.com/idemref/payments/internal/tooling/processorsim"
)

// The checker holds what the clients were told (the ledger) against two
// records that do not depend on the API's answers: the database and the
// processor simulator's list of calls. It is split in two. check reads:
// it waits for the deployment to come to rest and collects the rows and
// calls. compare judges: a pure function of the ledger, the rows and the
// calls, which the tests feed by hand.
//
// How the records are linked:
//
//   - an order operation to its row by the order's reference (unique per
//     tenant; each operation has its own);
//   - a payment operation to its payment row by the derived charge key:
//     the API stores payments.charge_key = idem.DeriveKey(tenant,
//     "POST /v1/payments", the client's key, "charge") in the transaction
//     that creates the payment, and the key is unique within its tenant
//     (payments_tenant_charge_key_key; it hashes the tenant in, so no two
//     tenants share one either). The same derivation is done here, with
//     the tenant read from the clients' orders, so the link holds even
//     once the key's own row
//     (idempotency_keys, whose resource_id also names the payment) has
//     been pruned, and even for a payment whose rows a failover lost;
//   - a payment to its processor calls by the same charge key: every
//     charge call for it carries that key as its Idempotency-Key; and a
//     compensation (the sweep's refund of a charge that should not exist)
//     to its refund call by payment_compensations.refund_key;
//   - an order to its events through the event's data (order_id), and an
//     event to its application by the orders consumer's inbox row
//     (processed_messages, the event id as message id, recorded under the
//     event's tenant, or under the nil UUID by a release before the inbox
//     named tenants: readRecords matches the id under any tenant).

// checkResult is the verdict on one scenario. Each violation is counted
// in one bucket and described in Problems.
type checkResult struct {
	// Acked counts the operations acknowledged: 2xx, or a 402 decline.
	Acked int
	// Lost: something acknowledged that the records do not hold as
	// acknowledged, or an effect that never happened (an event never
	// applied, a succeeded payment with no charge kept).
	Lost int
	// Duplicated: something that executed more than once (two orders for
	// one reference, two payments for one key or one order, an event
	// applied twice, a payment made under no client's key).
	Duplicated int
	// DoubleCharged: more charges kept at the processor than payments
	// that succeeded (per payment and per order).
	DoubleCharged int
	// Unresolved: operations still without a final answer when the
	// clients stopped retrying. Not lost, but the client never learned
	// the outcome; each is listed.
	Unresolved int
	// Unexpected: final answers no correct client gets in this load, such
	// as 422 idempotency_key_reused for a resend of the identical body.
	Unexpected int
	// Quiescent says the deployment came to rest within the wait. When it
	// did not (or could not be read), the first problem says what was
	// stuck, and the counts describe a deployment still moving.
	Quiescent bool
	// Problems describes the violations, at most maxListed of them, and
	// then how many more there were; unresolved operations are listed
	// too.
	Problems []string
}

// maxListed is how many problems a result lists one by one.
const maxListed = 20

// Rows, as the checker reads them. Ids are text, as they are compared
// with the ids the API sent.
type orderRow struct {
	TenantID       uuid.UUID
	ID             string
	Reference      string
	Amount         int64
	Currency       string
	AmountPaid     int64
	AmountRefunded int64
}

type paymentRow struct {
	ID            string
	OrderID       string
	Amount        int64
	Status        string
	PaymentMethod string
	ChargeKey     string
	ChargeID      string
	// SweepDue says the reconciliation sweep still has to look for late
	// charges (payments.sweep_at is set).
	SweepDue bool
}

type refundRow struct {
	ID        string
	PaymentID string
	Amount    int64
	Status    string
}

type compensationRow struct {
	PaymentID string
	ChargeID  string
	Status    string
	RefundKey string
}

// eventRow is an outbox event about one of the ledger's orders.
type eventRow struct {
	ID        string
	Type      string
	OrderID   string
	PaymentID string
	RefundID  string
	Published bool
	// Applied says the orders consumer recorded it in its inbox, in the
	// transaction that applied it to the order.
	Applied bool
}

// observed is everything the checker reads about the ledger's orders.
type observed struct {
	orders        []orderRow
	payments      []paymentRow
	refunds       []refundRow
	compensations []compensationRow
	events        []eventRow
	calls         []processorsim.Call
	// processorBusy says the simulator still holds a call that may land.
	processorBusy bool
}

// check waits up to wait for the deployment to be quiescent (see
// observed.stuck), then compares the ledger with the database (db: a pool
// on the current primary, direct, not through PgBouncer's proxy) and the
// calls the processor simulator recorded (processorURL: its own address,
// not a faulted link). A deployment that never comes to rest is a
// violation: the result says what was stuck, and still compares what it
// read last.
func check(ctx context.Context, db *pgxpool.Pool, processorURL string, led *ledger, wait time.Duration) checkResult {
	ops := led.Operations()
	obs, stuck, err := awaitQuiescence(ctx, db, processorURL, ledgerReferences(ops), wait)
	if err == nil {
		obs.calls, err = harness.ProcessorCalls(ctx, processorURL)
	}
	if err != nil {
		// Without the records nothing can be compared: an empty read
		// would report every acknowledgement lost.
		return checkResult{Acked: countAcked(ops), Problems: []string{"could not read the records: " + err.Error()}}
	}
	res := compare(ops, obs)
	res.Quiescent = len(stuck) == 0
	if !res.Quiescent {
		res.Problems = append([]string{fmt.Sprintf("not quiescent after %s: %s", wait, listFirst(stuck, 5))}, res.Problems...)
	}
	return res
}

// ledgerReferences lists the order references of the ledger, once each.
func ledgerReferences(ops []loadOp) []string {
	var refs []string
	for _, op := range ops {
		refs = append(refs, op.Reference)
	}
	slices.Sort(refs)
	return slices.Compact(refs)
}

func countAcked(ops []loadOp) int {
	n := 0
	for _, op := range ops {
		if op.acked() {
			n++
		}
	}
	return n
}

// listFirst joins the first n items and says how many more there are.
func listFirst(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(items[:n], "; "), len(items)-n)
}

// awaitQuiescence reads until nothing is stuck or wait has passed, and
// returns the last read and what was stuck in it. Errors are retried
// until then (a scenario may have just promoted the standby); the last
// one is returned.
func awaitQuiescence(ctx context.Context, db *pgxpool.Pool, processorURL string, refs []string, wait time.Duration) (observed, []string, error) {
	deadline := time.Now().Add(wait)
	for {
		obs, err := readRecords(ctx, db, processorURL, refs)
		var stuck []string
		if err == nil {
			if stuck = obs.stuck(); len(stuck) == 0 {
				return obs, nil, nil
			}
		}
		if time.Now().After(deadline) || !pause(ctx, 500*time.Millisecond) {
			return obs, stuck, err
		}
	}
}

// stuck lists what keeps the deployment from being at rest: a payment or
// refund whose processor call has no outcome yet, a reconciliation look
// still due, a compensation not refunded, an event not relayed, a
// succeeded payment or refund whose event the orders consumer has not
// applied, and a call the processor still holds (which may land late).
// Until all of these are done the records may still change, and
// comparing them would report work in progress as lost.
func (o observed) stuck() []string {
	var s []string
	if o.processorBusy {
		s = append(s, "the processor still holds a call that may land")
	}
	applied := map[string]bool{} // payments and refunds whose event was applied, by id
	for _, e := range o.events {
		if !e.Published {
			s = append(s, fmt.Sprintf("event %s (%s) is not relayed", e.ID, e.Type))
		}
		switch {
		case e.Applied && e.Type == payments.TypePaymentSucceeded:
			applied[e.PaymentID] = true
		case e.Applied && e.Type == payments.TypeRefundSucceeded:
			applied[e.RefundID] = true
		}
	}
	for _, p := range o.payments {
		switch {
		case p.Status == payments.StatusChargeSent:
			s = append(s, fmt.Sprintf("payment %s is %s", p.ID, p.Status))
		case p.Status == payments.StatusSucceeded && !applied[p.ID]:
			s = append(s, fmt.Sprintf("payment %s succeeded, and order %s is not credited with it (its event is not applied)", p.ID, p.OrderID))
		}
		if p.SweepDue {
			s = append(s, fmt.Sprintf("payment %s: the reconciliation sweep has yet to look at it", p.ID))
		}
	}
	for _, r := range o.refunds {
		switch {
		case r.Status == payments.RefundStatusCreated || r.Status == payments.RefundStatusSent:
			s = append(s, fmt.Sprintf("refund %s is %s", r.ID, r.Status))
		case r.Status == payments.RefundStatusSucceeded && !applied[r.ID]:
			s = append(s, fmt.Sprintf("refund %s succeeded, and its event is not applied", r.ID))
		}
	}
	for _, c := range o.compensations {
		if c.Status != compensationSucceeded {
			s = append(s, fmt.Sprintf("the compensation of charge %s (payment %s) is %s", c.ChargeID, c.PaymentID, c.Status))
		}
	}
	return s
}

// compensationSucceeded is the final status of a compensation
// (payment_compensations.status): its refund went through.
const compensationSucceeded = "succeeded"

// readRecords reads the rows of the orders with the given references, their
// payments, refunds, compensations and events, in one round trip and one
// snapshot, and asks the simulator whether it still holds a call.
//
// One snapshot matters: the orders consumer credits an order and records
// the event in its inbox in one transaction, and a read that took the
// orders before that commit and the inbox after it would see the event
// applied to an order that does not show it. A batch outside a
// transaction gives each statement its own snapshot; REPEATABLE READ
// gives the whole batch the first statement's.
func readRecords(ctx context.Context, db *pgxpool.Pool, processorURL string, refs []string) (observed, error) {
	var o observed
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return observed{}, fmt.Errorf("database: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	b := &pgx.Batch{}
	batchRows(b, &o.orders, `SELECT tenant_id, id::text, reference, amount, currency, amount_paid, amount_refunded
		FROM orders WHERE reference = ANY($1)`, refs)
	batchRows(b, &o.payments, `SELECT p.id::text, p.order_id::text, p.amount, p.status, p.payment_method,
		    p.charge_key, coalesce(p.charge_id, ''), p.sweep_at IS NOT NULL
		FROM payments p JOIN orders o ON o.tenant_id = p.tenant_id AND o.id = p.order_id
		WHERE o.reference = ANY($1)`, refs)
	batchRows(b, &o.refunds, `SELECT r.id::text, r.payment_id::text, r.amount, r.status
		FROM refunds r
		JOIN payments p ON p.tenant_id = r.tenant_id AND p.id = r.payment_id
		JOIN orders o ON o.tenant_id = p.tenant_id AND o.id = p.order_id
		WHERE o.reference = ANY($1)`, refs)
	batchRows(b, &o.compensations, `SELECT c.payment_id::text, c.charge_id, c.status, c.refund_key
		FROM payment_compensations c
		JOIN payments p ON p.tenant_id = c.tenant_id AND p.id = c.payment_id
		JOIN orders o ON o.tenant_id = p.tenant_id AND o.id = p.order_id
		WHERE o.reference = ANY($1)`, refs)
	// Each event's payload is parsed once (MATERIALIZED), then matched
	// to the orders by the order_id in its data.
	batchRows(b, &o.events, `WITH ours AS (SELECT tenant_id, id FROM orders WHERE reference = ANY($1)),
		ev AS MATERIALIZED (
		    SELECT e.id, e.tenant_id, e.event_type, e.published_at, convert_from(e.payload, 'UTF8')::jsonb -> 'data' AS data
		    FROM outbox e WHERE e.tenant_id IN (SELECT tenant_id FROM ours))
		SELECT ev.id::text, ev.event_type, ours.id::text,
		    coalesce(ev.data ->> 'payment_id', ''), coalesce(ev.data ->> 'refund_id', ''),
		    ev.published_at IS NOT NULL,
		    EXISTS (SELECT 1 FROM processed_messages m
		            WHERE m.consumer = $2 AND m.source = $3 AND m.message_id = ev.id::text)
		FROM ev JOIN ours ON ours.tenant_id = ev.tenant_id AND ours.id::text = ev.data ->> 'order_id'`,
		refs, orders.ConsumerName, events.Source)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return observed{}, fmt.Errorf("database: %w", err)
	}
	busy, err := processorHolds(ctx, processorURL)
	o.processorBusy = busy
	return o, err
}

// batchRows queues query, its rows read into dest by position.
func batchRows[T any](b *pgx.Batch, dest *[]T, query string, args ...any) {
	b.Queue(query, args...).Query(func(rows pgx.Rows) error {
		var err error
		*dest, err = pgx.CollectRows(rows, pgx.RowToStructByPos[T])
		return err
	})
}

// processorHolds asks the simulator whether a call is still held: its
// GET /_sim/idle answers 204 once none is, and waits meanwhile, so an
// answer that has not come within a second means busy.
func processorHolds(ctx context.Context, processorURL string) (bool, error) {
	probe, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(probe, http.MethodGet, processorURL+"/_sim/idle", nil)
	if err != nil {
		return false, err
	}
	res, err := http.DefaultClient.Do(req)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("processor idle: %w", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNoContent {
		return false, fmt.Errorf("processor idle: %s", res.Status)
	}
	return false, nil
}

// findings collects violations into a result.
type findings struct {
	checkResult
	unlisted int
}

// add counts a violation in bucket and describes it.
func (f *findings) add(bucket *int, format string, args ...any) {
	*bucket++
	if len(f.Problems) < maxListed {
		f.Problems = append(f.Problems, fmt.Sprintf(format, args...))
		return
	}
	f.unlisted++
}

// result is the verdict, with a last line saying how many problems were
// counted and not listed.
func (f *findings) result() checkResult {
	r := f.checkResult
	if f.unlisted > 0 {
		r.Problems = append(r.Problems, fmt.Sprintf("and %d more", f.unlisted))
	}
	return r
}

// recordIndex indexes what was observed, by the links the checks follow.
type recordIndex struct {
	orderByID        map[string]orderRow
	ordersByRef      map[string][]orderRow
	paymentByID      map[string]paymentRow
	paymentsByOrder  map[string][]paymentRow
	refundsByPayment map[string][]refundRow
	compsByPayment   map[string][]compensationRow
	eventsByOrder    map[string][]eventRow
	// executed counts the processor calls that executed (created a charge
	// or a refund, not a replay), by path and idempotency key.
	executed map[string]int
	// keysByOrder lists, per order id, the payment keys the clients sent,
	// whether or not the order is in the database.
	keysByOrder map[string][]clientKey
	// tenant is the clients' tenant, read from any of their orders: they
	// all send one API key. The charge keys are derived with it.
	tenant uuid.UUID
}

// clientKey is a client's payment key with the charge key derived from
// it, and the card it was sent with.
type clientKey struct {
	key, chargeKey, method string
}

func indexRecords(ops []loadOp, o observed) *recordIndex {
	r := &recordIndex{
		orderByID: map[string]orderRow{}, ordersByRef: map[string][]orderRow{},
		paymentByID: map[string]paymentRow{}, paymentsByOrder: map[string][]paymentRow{},
		refundsByPayment: map[string][]refundRow{}, compsByPayment: map[string][]compensationRow{},
		eventsByOrder: map[string][]eventRow{}, executed: map[string]int{}, keysByOrder: map[string][]clientKey{},
	}
	for _, x := range o.orders {
		r.tenant = x.TenantID
		r.orderByID[x.ID] = x
		r.ordersByRef[x.Reference] = append(r.ordersByRef[x.Reference], x)
	}
	for _, p := range o.payments {
		r.paymentByID[p.ID] = p
		r.paymentsByOrder[p.OrderID] = append(r.paymentsByOrder[p.OrderID], p)
	}
	for _, x := range o.refunds {
		r.refundsByPayment[x.PaymentID] = append(r.refundsByPayment[x.PaymentID], x)
	}
	for _, c := range o.compensations {
		r.compsByPayment[c.PaymentID] = append(r.compsByPayment[c.PaymentID], c)
	}
	for _, e := range o.events {
		r.eventsByOrder[e.OrderID] = append(r.eventsByOrder[e.OrderID], e)
	}
	for _, c := range o.calls {
		if c.Method == http.MethodPost && c.Executed {
			r.executed[c.Path+" "+c.IdempotencyKey]++
		}
	}
	for _, op := range ops {
		if op.Kind == kindPayment {
			r.keysByOrder[op.OrderID] = append(r.keysByOrder[op.OrderID],
				clientKey{key: op.Key, chargeKey: chargeKey(r.tenant, op.Key), method: op.PaymentMethod})
		}
	}
	return r
}

// chargeKey is the key the API sends the processor for the charge of the
// payment requested under key, derived exactly as the API derives it (see
// docs/payments.md, "Derived keys"; the step name "charge" is part of the
// contract in openapi.yaml).
func chargeKey(tenant uuid.UUID, key string) string {
	return idem.DeriveKey(idem.Claim{TenantID: tenant, Endpoint: payments.EndpointPay, Key: key}, "charge")
}

// compare judges the ledger against the records: it is the whole check,
// without any reading.
func compare(ops []loadOp, o observed) checkResult {
	f := &findings{}
	r := indexRecords(ops, o)
	for _, op := range ops {
		f.answer(op)
		switch op.Kind {
		case kindOrder:
			f.orderOp(op, r)
		case kindPayment:
			f.paymentOp(op, r)
		}
	}
	for _, ord := range o.orders {
		f.strayPayments(ord, r)
		f.books(ord, r)
	}
	for _, id := range chargedOrders(r) {
		f.charges(id, r)
	}
	return f.result()
}

// chargedOrders lists, in order, every order the processor may hold
// charges for: those in the database, and those the clients paid that
// are not (a failover may lose an order with its payment, not the charge).
func chargedOrders(r *recordIndex) []string {
	var ids []string
	for id := range r.orderByID {
		ids = append(ids, id)
	}
	for id := range r.keysByOrder {
		if _, ok := r.orderByID[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// answer counts the operation's final answer: acknowledged, none
// (unresolved), or one a correct client never gets here (unexpected).
func (f *findings) answer(op loadOp) {
	switch {
	case op.acked():
		f.Acked++
	case op.Final == 0:
		f.add(&f.Unresolved, "%s %s (reference %s): no final answer after %d attempts %v",
			op.Kind, op.Key, op.Reference, op.Attempts, op.Statuses)
	default:
		f.add(&f.Unexpected, "%s %s (reference %s): final answer %d %s after %v",
			op.Kind, op.Key, op.Reference, op.Final, op.Code, op.Statuses)
	}
}

// orderOp: one order per reference, and an acknowledged order exists as
// it was sent.
func (f *findings) orderOp(op loadOp, r *recordIndex) {
	rows := r.ordersByRef[op.Reference]
	if len(rows) > 1 {
		f.add(&f.Duplicated, "reference %s: %d orders (%s) for one operation", op.Reference, len(rows), orderIDs(rows))
	}
	if !op.acked() {
		return
	}
	for _, row := range rows {
		if row.ID != op.ID {
			continue
		}
		if row.Amount != op.Amount || row.Currency != op.Currency {
			f.add(&f.Lost, "order %s (reference %s): acknowledged for %d %s, stored as %d %s",
				op.ID, op.Reference, op.Amount, op.Currency, row.Amount, row.Currency)
		}
		return
	}
	f.add(&f.Lost, "order %s (reference %s, key %s): acknowledged %d, not in the database (orders with the reference: %s)",
		op.ID, op.Reference, op.Key, op.Final, orderIDs(rows))
}

func orderIDs(rows []orderRow) string {
	ids := make([]string, len(rows))
	for i, row := range rows {
		ids[i] = row.ID
	}
	return "[" + strings.Join(ids, " ") + "]"
}

// paymentOp: one payment per key, and an acknowledged payment exists with
// the status (and, succeeded, the charge) it was acknowledged with.
func (f *findings) paymentOp(op loadOp, r *recordIndex) {
	if _, ok := r.orderByID[op.OrderID]; !ok {
		if op.acked() {
			f.add(&f.Lost, "payment %s (key %s): acknowledged %d, and its order %s is not in the database", op.ID, op.Key, op.Final, op.OrderID)
		}
		return
	}
	key := chargeKey(r.tenant, op.Key)
	var mine []string
	for _, p := range r.paymentsByOrder[op.OrderID] {
		if p.ChargeKey == key {
			mine = append(mine, p.ID)
		}
	}
	if len(mine) > 1 {
		f.add(&f.Duplicated, "payment key %s: %d payments %v", op.Key, len(mine), mine)
	}
	if !op.acked() {
		return
	}
	p, ok := r.paymentByID[op.ID]
	switch {
	case !ok:
		f.add(&f.Lost, "payment %s (key %s, order %s): acknowledged %d, not in the database", op.ID, op.Key, op.OrderID, op.Final)
	case p.ChargeKey != key || p.OrderID != op.OrderID:
		f.add(&f.Lost, "payment %s: acknowledged to key %s for order %s, stored for order %s under another key", op.ID, op.Key, op.OrderID, p.OrderID)
	case p.Status != op.PaymentStatus:
		f.add(&f.Lost, "payment %s (key %s): acknowledged %d %s, stored as %s", op.ID, op.Key, op.Final, op.PaymentStatus, p.Status)
	case p.Status == payments.StatusSucceeded && p.ChargeID != op.ChargeID:
		f.add(&f.Lost, "payment %s (key %s): acknowledged with charge %s, stored with charge %s", op.ID, op.Key, op.ChargeID, p.ChargeID)
	}
}

// strayPayments: every payment of the order was asked for under one of
// the clients' keys, and the order has at most one live payment (one not
// declined or failed), which the database's partial unique index also
// enforces.
func (f *findings) strayPayments(ord orderRow, r *recordIndex) {
	var live []string
	for _, p := range r.paymentsByOrder[ord.ID] {
		if !slices.ContainsFunc(r.keysByOrder[ord.ID], func(k clientKey) bool { return k.chargeKey == p.ChargeKey }) {
			f.add(&f.Duplicated, "payment %s of order %s was made under no key a client sent", p.ID, ord.ID)
		}
		if p.Status != payments.StatusDeclined && p.Status != payments.StatusFailed {
			live = append(live, p.ID)
		}
	}
	if len(live) > 1 {
		f.add(&f.Duplicated, "order %s: %d live payments %v", ord.ID, len(live), live)
	}
}

// books: the order's amount_paid is what its succeeded payments paid less
// what was refunded, its amount_refunded what was refunded, and the orders
// consumer applied exactly one payment.succeeded event per succeeded
// payment. The order is a projection of those events, so a mismatch is an
// event applied twice (more than the payments say: Duplicated) or never
// (less: Lost); one violation per order, with every figure.
func (f *findings) books(ord orderRow, r *recordIndex) {
	var paid, refunded int64
	succeeded := 0
	for _, p := range r.paymentsByOrder[ord.ID] {
		if p.Status != payments.StatusSucceeded {
			continue
		}
		succeeded++
		paid += p.Amount
		for _, x := range r.refundsByPayment[p.ID] {
			if x.Status == payments.RefundStatusSucceeded {
				refunded += x.Amount
			}
		}
	}
	applied := 0
	for _, e := range r.eventsByOrder[ord.ID] {
		if e.Type == payments.TypePaymentSucceeded && e.Applied {
			applied++
		}
	}
	if ord.AmountPaid == paid-refunded && ord.AmountRefunded == refunded && applied == succeeded {
		return
	}
	bucket := &f.Lost
	if ord.AmountPaid > paid-refunded || ord.AmountRefunded > refunded || applied > succeeded {
		bucket = &f.Duplicated
	}
	f.add(bucket, "order %s: amount_paid %d, amount_refunded %d, %d payment event(s) applied; its %d succeeded payment(s) and their refunds say %d, %d and %d",
		ord.ID, ord.AmountPaid, ord.AmountRefunded, applied, succeeded, paid-refunded, refunded, succeeded)
}

// charges: the processor keeps exactly one charge for each succeeded
// payment of the order and none for a declined or failed one, and at most
// one for the order (more: DoubleCharged). A kept charge is one executed
// under the payment's charge key and not refunded by one of its
// compensations. A succeeded payment with no kept charge, and a charge
// kept under a client's key that no payment row records (the row was
// lost, the money was not), are Lost.
func (f *findings) charges(orderID string, r *recordIndex) {
	total, doubled := 0, false
	for _, p := range r.paymentsByOrder[orderID] {
		kept := f.paymentCharges(p, r)
		total += kept
		doubled = doubled || kept > 1 || kept > 0 && p.Status != payments.StatusSucceeded
	}
	for _, k := range r.keysByOrder[orderID] {
		if r.hasPayment(orderID, k.chargeKey) {
			continue
		}
		if kept := r.succeededCharges(k.chargeKey, k.method); kept > 0 {
			total += kept
			f.add(&f.Lost, "payment key %s (order %s) has no payment row, and the processor keeps %d charge(s) under it", k.key, orderID, kept)
		}
	}
	if total > 1 && !doubled {
		f.add(&f.DoubleCharged, "order %s: %d charges kept at the processor across its payments", orderID, total)
	}
}

// paymentCharges checks one payment's kept charges against its status,
// and returns how many it keeps.
func (f *findings) paymentCharges(p paymentRow, r *recordIndex) int {
	executed := r.succeededCharges(p.ChargeKey, p.PaymentMethod)
	refunded := 0
	for _, c := range r.compsByPayment[p.ID] {
		refunded += r.executed[processorsim.PathRefunds+" "+c.RefundKey]
	}
	kept, want := executed-refunded, 0
	if p.Status == payments.StatusSucceeded {
		want = 1
	}
	switch {
	case kept > want:
		f.add(&f.DoubleCharged, "payment %s (%s) of order %s: %d charge(s) kept at the processor (%d executed, %d compensated), want %d",
			p.ID, p.Status, p.OrderID, kept, executed, refunded, want)
	case kept < want:
		f.add(&f.Lost, "payment %s of order %s succeeded with charge %s, and the processor keeps no charge for it (%d executed, %d compensated)",
			p.ID, p.OrderID, p.ChargeID, executed, refunded)
	}
	return kept
}

// succeededCharges counts the charges executed under chargeKey that
// succeeded. The simulator decides a charge by its card alone (its test
// payment methods), so a charge whose answer was lost, or that landed
// after its caller left, still counts: all of them with a card that is
// charged, none with one that is declined (a declined charge exists,
// failed, and holds no money).
func (r *recordIndex) succeededCharges(chargeKey, method string) int {
	if method == processorsim.PaymentMethodDeclined || method == processorsim.PaymentMethodInsufficientFunds {
		return 0
	}
	return r.executed[processorsim.PathCharges+" "+chargeKey]
}

// hasPayment says the order has a payment made under chargeKey.
func (r *recordIndex) hasPayment(orderID, chargeKey string) bool {
	return slices.ContainsFunc(r.paymentsByOrder[orderID], func(p paymentRow) bool { return p.ChargeKey == chargeKey })
}
