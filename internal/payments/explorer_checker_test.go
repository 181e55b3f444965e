package payments_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/events"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/orders"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/processor"
)

// The explorer's checker: after every schedule, and a drain that lets
// every clock pass and every background worker finish, it asserts from the
// database and the simulator's ledger that
//
//   - per payment, the processor's net (succeeded charges under its
//     derived key minus their refunds, compensations included) is what
//     our row says we kept, and at most one charge is kept;
//   - our rows name the processor's objects: a payment's charge, a
//     refund's refund;
//   - per order, amount_paid and amount_refunded are the sums over its
//     payments and refunds, each event was written once per outcome and
//     applied (once: the consumer's inbox);
//   - per key, the request executed at most once (one claim), and every
//     final answer a client got is the recorded response, byte for byte;
//   - no record moved along a transition its machine does not allow
//     (state_transitions), and no writer even tried (the guard's error);
//   - nothing is left unfinished, and nothing went wrong that a client is
//     not told to retry (an unexpected error, an alarm in the log).

// installExplorerLog records, in the scenario's database only (the
// migrations know nothing of it), every change of a record's state and
// every claim of a key, committed or not at all with the change itself.
func installExplorerLog(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(t.Context(), `
CREATE TABLE explorer_transitions (
    seq        bigint GENERATED ALWAYS AS IDENTITY,
    tenant_id  uuid NOT NULL,
    machine    text NOT NULL,
    row_id     text NOT NULL,
    from_state text NOT NULL,
    to_state   text NOT NULL
);
CREATE TABLE explorer_key_claims (
    seq       bigint GENERATED ALWAYS AS IDENTITY,
    tenant_id uuid NOT NULL,
    endpoint  text NOT NULL,
    idem_key  text NOT NULL
);
CREATE TABLE explorer_key_records (
    seq       bigint GENERATED ALWAYS AS IDENTITY,
    tenant_id uuid NOT NULL,
    endpoint  text NOT NULL,
    idem_key  text NOT NULL,
    status    integer NOT NULL,
    location  text NOT NULL,
    body      bytea NOT NULL
);
CREATE FUNCTION explorer_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_ARGV[0] = 'key' THEN
        -- A claim is the insert of a key, or its move (back) to
        -- in_progress: each is one execution of the request.
        IF TG_OP = 'INSERT' OR NEW.state = 'in_progress' THEN
            INSERT INTO explorer_key_claims (tenant_id, endpoint, idem_key) VALUES (NEW.tenant_id, NEW.endpoint, NEW.idem_key);
        END IF;
        -- Every response a key records, in order: the first is the one
        -- every answer must equal.
        IF NEW.state = 'completed' THEN
            INSERT INTO explorer_key_records (tenant_id, endpoint, idem_key, status, location, body)
            VALUES (NEW.tenant_id, NEW.endpoint, NEW.idem_key, NEW.response_status,
                    coalesce(NEW.resource_location, ''), NEW.response_body);
        END IF;
        IF TG_OP = 'UPDATE' THEN
            INSERT INTO explorer_transitions (tenant_id, machine, row_id, from_state, to_state)
            VALUES (NEW.tenant_id, 'key', NEW.endpoint || ' ' || NEW.idem_key, OLD.state, NEW.state);
        END IF;
    ELSE
        INSERT INTO explorer_transitions (tenant_id, machine, row_id, from_state, to_state)
        VALUES (NEW.tenant_id, TG_ARGV[0],
                coalesce(to_jsonb(NEW) ->> 'id', (to_jsonb(NEW) ->> 'payment_id') || '/' || (to_jsonb(NEW) ->> 'charge_id')),
                OLD.status, NEW.status);
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER explorer_payments AFTER UPDATE OF status ON payments
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION explorer_log('payment');
CREATE TRIGGER explorer_refunds AFTER UPDATE OF status ON refunds
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION explorer_log('refund');
CREATE TRIGGER explorer_compensations AFTER UPDATE OF status ON payment_compensations
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION explorer_log('compensation');
CREATE TRIGGER explorer_keys_update AFTER UPDATE OF state ON idempotency_keys
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION explorer_log('key');
CREATE TRIGGER explorer_keys_insert AFTER INSERT ON idempotency_keys
    FOR EACH ROW EXECUTE FUNCTION explorer_log('key');
`)
	if err != nil {
		t.Fatalf("install the explorer's log: %v", err)
	}
}

// dropGuards removes the backstop of migration 000012 (EXPLORER_MUTATE_DROP_GUARDS),
// so that the explorer shows what a writer without its WHERE guard does
// when nothing refuses it.
func dropGuards(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), `
DROP TRIGGER payments_guard_status ON payments;
DROP TRIGGER refunds_guard_status ON refunds;
DROP TRIGGER payment_compensations_guard_status ON payment_compensations;
DROP TRIGGER idempotency_keys_guard_state ON idempotency_keys;`); err != nil {
		t.Fatalf("drop the guard triggers: %v", err)
	}
	t.Log("explorer: EXPLORER_MUTATE_DROP_GUARDS=1: the status guard triggers are dropped")
}

// expected reports whether err is an answer a client is told to retry
// after (503 with Retry-After, 409 in progress or result expired) or one
// a background worker retries on its own: no final answer, and no sign of
// a bug.
func expected(err error) bool {
	var retry *payments.RetryError
	var resultExpired *idem.ResultExpiredError
	var unsettled *processor.UnsettledError
	return errors.As(err, &retry) || errors.Is(err, idem.ErrKeyInUse) || errors.Is(err, idem.ErrLeaseLost) ||
		errors.As(err, &resultExpired) || errors.As(err, &unsettled)
}

// alarmHandler keeps the services' warnings for a failing schedule's
// report, and fails the schedule on an error-level record (money refunded
// twice, a compensation refused) and on a warning whose error is not one
// that is retried as a matter of course (a database error, a refused
// transition, a charge outcome without a charge).
type alarmHandler struct {
	w     *world
	attrs []slog.Attr
}

func (h *alarmHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *alarmHandler) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Level.String() + " " + rec.Message)
	var cause error
	add := func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		if e, ok := a.Value.Any().(error); ok && a.Key == "error" {
			cause = e
		}
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	rec.Attrs(add)
	h.w.mu.Lock()
	r := h.w.cur
	h.w.mu.Unlock()
	if r == nil || errors.Is(cause, errAborted) {
		return nil // an actor unwinding after its schedule ended
	}
	r.mu.Lock()
	r.logs = append(r.logs, b.String())
	r.mu.Unlock()
	if rec.Level >= slog.LevelError || (cause != nil && !expected(cause)) {
		r.fail("logged: %s", b.String())
	}
	return nil
}

func (h *alarmHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &alarmHandler{w: h.w, attrs: append(slices.Clone(h.attrs), attrs...)}
}

func (h *alarmHandler) WithGroup(string) slog.Handler { return h }

// --- The drain ---

// drain finishes what the schedule left, as time and the background
// workers would: every held call lands, every clock passes, the completer
// (with its sweep) runs, every event is delivered and applied; until
// nothing changes. Then the client retries every key once more: a replay,
// or the proof that the request runs again.
func (r *run) drain() {
	ctx := r.ctx
	r.note("drain:")
	last := r.progress()
	for round := 0; ; round++ {
		for _, h := range r.held {
			h.land()
		}
		if err := r.advance(clockSettle); err != nil {
			r.fail("drain: let the clocks pass: %v", err)
			return
		}
		payments.NewCompleter(r.w.worker.svc, time.Hour).RunOnce(ctx)
		for _, ev := range r.w.sim.Events() {
			if !r.webhooksDone[ev.ID] && !r.webhooksLost[ev.ID] {
				r.webhooksDone[ev.ID] = true
				if _, err := r.w.api1.svc.HandleProcessorEvent(ctx, ev); err != nil {
					r.fail("drain: webhook %s: %v", ev.ID, err)
				}
			}
		}
		r.refresh()
		for r.consumed < r.snap.outbox {
			if err := r.consumeNext(ctx, r.w.worker.pool, &r.consumed); err != nil {
				r.fail("drain: apply event %d: %v", r.consumed, err)
				return
			}
		}
		now := r.progress()
		if now == last {
			break
		}
		if round == 8 {
			r.fail("the drain did not settle after %d rounds: %s", round, now)
			return
		}
		last = now
	}
	for _, k := range r.keys {
		if k.resolved {
			res, err := r.send(ctx, r.w.api2, k)
			r.answered("final-retry", k, res, err)
		}
	}
}

// progress sums up the schedule's state, to see the drain come to rest.
func (r *run) progress() string {
	var s string
	if err := r.w.pool.QueryRow(r.ctx, `SELECT concat_ws(' ',
		(SELECT string_agg(state, ',' ORDER BY endpoint, idem_key) FROM idempotency_keys WHERE tenant_id = $1),
		(SELECT string_agg(status, ',' ORDER BY id) FROM payments WHERE tenant_id = $1),
		(SELECT string_agg(status || ':' || duplicate_amount, ',' ORDER BY id) FROM refunds WHERE tenant_id = $1),
		(SELECT string_agg(status, ',' ORDER BY charge_id) FROM payment_compensations WHERE tenant_id = $1),
		(SELECT count(*) FROM outbox WHERE tenant_id = $1))`, r.tenant).Scan(&s); err != nil {
		r.fail("read the progress: %v", err)
	}
	return fmt.Sprintf("%s charges=%d refunds=%d events=%d", s, len(r.w.sim.Charges()), len(r.w.sim.Refunds()), len(r.w.sim.Events()))
}

// --- The checker ---

type paymentState struct {
	ID             uuid.UUID
	Status         string
	Amount         int64
	ChargeKey      string
	ChargeID       string
	RefundedAmount int64
}

type refundState struct {
	ID                uuid.UUID
	PaymentID         uuid.UUID
	Status            string
	Amount            int64
	RefundKey         string
	ProcessorRefundID string
}

type compensationState struct {
	PaymentID uuid.UUID
	ChargeID  string
	Status    string
}

type keyState struct {
	Endpoint string
	Key      string
	State    string
}

// keyRecord is a response a key recorded.
type keyRecord struct {
	Endpoint string
	Key      string
	Status   int
	Location string
	Body     []byte
}

type transitionState struct{ Machine, RowID, From, To string }

type claimCount struct {
	Endpoint, Key string
	N             int
}

type eventCount struct {
	Subject string
	N       int
}

// scheduleState is everything the checker reads of the database, in one
// round trip.
type scheduleState struct {
	pays           []paymentState
	refunds        []refundState
	comps          []compensationState
	keys           []keyState
	records        []keyRecord
	moves          []transitionState
	claims         []claimCount
	events         []eventCount
	amountPaid     int64
	amountRefunded int64
	unapplied      int
}

func (r *run) read() (scheduleState, error) {
	var s scheduleState
	b := &pgx.Batch{}
	queueRows(b, &s.pays, `SELECT id, status, amount, charge_key, coalesce(charge_id, ''), refunded_amount
		FROM payments WHERE tenant_id = $1 ORDER BY id`, r.tenant)
	queueRows(b, &s.refunds, `SELECT id, payment_id, status, amount, refund_key, coalesce(processor_refund_id, '')
		FROM refunds WHERE tenant_id = $1 ORDER BY id`, r.tenant)
	queueRows(b, &s.comps, `SELECT payment_id, charge_id, status FROM payment_compensations WHERE tenant_id = $1`, r.tenant)
	queueRows(b, &s.keys, `SELECT endpoint, idem_key, state FROM idempotency_keys WHERE tenant_id = $1`, r.tenant)
	queueRows(b, &s.records, `SELECT endpoint, idem_key, status, location, body FROM explorer_key_records
		WHERE tenant_id = $1 ORDER BY seq`, r.tenant)
	// Moves along a transition that the machine does not allow.
	queueRows(b, &s.moves, `SELECT machine, row_id, from_state, to_state FROM explorer_transitions t
		WHERE tenant_id = $1 AND NOT EXISTS (SELECT 1 FROM state_transitions s
		    WHERE s.machine = t.machine AND s.from_state = t.from_state AND s.to_state = t.to_state)
		ORDER BY seq`, r.tenant)
	queueRows(b, &s.claims, `SELECT endpoint, idem_key, count(*) FROM explorer_key_claims
		WHERE tenant_id = $1 GROUP BY 1, 2 HAVING count(*) > 1`, r.tenant)
	queueRows(b, &s.events, `SELECT event_type || ' ' || coalesce(
		    convert_from(payload, 'UTF8')::jsonb #>> '{data,refund_id}', convert_from(payload, 'UTF8')::jsonb #>> '{data,payment_id}'), count(*)
		FROM outbox WHERE tenant_id = $1 GROUP BY 1`, r.tenant)
	b.Queue(`SELECT amount_paid, amount_refunded FROM orders WHERE tenant_id = $1 AND id = $2`, r.tenant, r.order.ID).
		QueryRow(func(row pgx.Row) error { return row.Scan(&s.amountPaid, &s.amountRefunded) })
	b.Queue(`SELECT count(*) FROM outbox o WHERE tenant_id = $1 AND NOT EXISTS (
		SELECT 1 FROM processed_messages m WHERE m.consumer = $2 AND m.source = $3 AND m.message_id = o.id::text)`,
		r.tenant, orders.ConsumerName, events.Source).
		QueryRow(func(row pgx.Row) error { return row.Scan(&s.unapplied) })
	return s, r.w.pool.SendBatch(r.ctx, b).Close()
}

// queueRows queues query, its rows read into dest by position.
func queueRows[T any](b *pgx.Batch, dest *[]T, query string, args ...any) {
	b.Queue(query, args...).Query(func(rows pgx.Rows) error {
		var err error
		*dest, err = pgx.CollectRows(rows, pgx.RowToStructByPos[T])
		return err
	})
}

// check asserts the invariants on the drained schedule.
func (r *run) check() {
	s, err := r.read()
	if err != nil {
		r.fail("read the schedule's rows: %v", err)
		return
	}
	r.checkMoney(s.pays, s.refunds, s.comps)
	r.checkOrder(s)
	r.checkKeys(s)
	for _, m := range s.moves {
		r.fail("%s %s moved %s -> %s, which state_transitions does not allow (moved backwards)", m.Machine, m.RowID, m.From, m.To)
	}
	for _, p := range s.pays {
		if p.Status == payments.StatusChargeSent {
			r.fail("payment %s is still %s after the drain", p.ID, p.Status)
		}
	}
	for _, rf := range s.refunds {
		if rf.Status != payments.RefundStatusSucceeded && rf.Status != payments.RefundStatusFailed {
			r.fail("refund %s is still %s after the drain", rf.ID, rf.Status)
		}
	}
	for _, c := range s.comps {
		if c.Status != "succeeded" {
			r.fail("the compensation of charge %s (payment %s) is %s after the drain", c.ChargeID, c.PaymentID, c.Status)
		}
	}
}

// checkMoney compares each payment's rows with the processor's ledger.
func (r *run) checkMoney(pays []paymentState, refunds []refundState, comps []compensationState) {
	charges := r.w.sim.Charges()
	simRefunds := r.w.sim.Refunds()
	ours := map[string]bool{}
	for _, p := range pays {
		ours[p.ChargeKey] = true
		var net, kept int64
		var live, all []string
		chargeFound := false
		for _, ch := range charges {
			if ch.IdempotencyKey != p.ChargeKey || ch.Status != processor.StatusSucceeded {
				continue
			}
			left := ch.Amount - ch.RefundedAmount
			net += left
			all = append(all, fmt.Sprintf("%s %d-%d", ch.ID, ch.Amount, ch.RefundedAmount))
			if left > 0 {
				live = append(live, ch.ID)
			}
			if ch.ID == p.ChargeID && ch.Amount == p.Amount {
				chargeFound = true
			}
		}
		if p.Status == payments.StatusSucceeded {
			kept = p.Amount - p.RefundedAmount
			if !chargeFound {
				r.fail("payment %s succeeded with charge %q, which is no succeeded charge of %d under its key at the processor (charges: %v)",
					p.ID, p.ChargeID, p.Amount, all)
			}
		}
		if net != kept {
			r.fail("payment %s (%s): the processor holds %d net (charges-refunds: %v), our rows say we kept %d", p.ID, p.Status, net, all, kept)
		}
		if len(live) > 1 {
			r.fail("payment %s: %d charges are kept at the processor: %v", p.ID, len(live), live)
		}
		// Net money per payment must end at exactly one charge (none for
		// a payment that failed): name each charge beside the recorded
		// one that nobody refunded, and whether anything was ever going
		// to (a compensation recorded for it).
		for _, id := range live {
			if p.Status == payments.StatusSucceeded && id == p.ChargeID {
				continue
			}
			compensation := "none recorded"
			for _, c := range comps {
				if c.PaymentID == p.ID && c.ChargeID == id {
					compensation = c.Status
				}
			}
			r.fail("payment %s (%s, charge %q): charge %s was never refunded (compensation: %s): the customer paid it on top",
				p.ID, p.Status, p.ChargeID, id, compensation)
		}
		var refunded int64
		for _, rf := range refunds {
			if rf.PaymentID == p.ID && rf.Status == payments.RefundStatusSucceeded {
				refunded += rf.Amount
			}
		}
		if refunded != p.RefundedAmount {
			r.fail("payment %s: refunded_amount %d, its succeeded refunds sum to %d", p.ID, p.RefundedAmount, refunded)
		}
	}
	for _, ch := range charges {
		if !ours[ch.IdempotencyKey] && ch.Status == processor.StatusSucceeded && ch.Amount > ch.RefundedAmount {
			r.fail("charge %s (%d) under key %s belongs to no payment", ch.ID, ch.Amount-ch.RefundedAmount, ch.IdempotencyKey)
		}
	}
	for _, rf := range refunds {
		var landed int64
		named := false
		for _, sr := range simRefunds {
			if sr.IdempotencyKey != rf.RefundKey || sr.Status != processor.StatusSucceeded {
				continue
			}
			landed += sr.Amount
			named = named || sr.ID == rf.ProcessorRefundID
		}
		want := int64(0)
		if rf.Status == payments.RefundStatusSucceeded {
			want = rf.Amount
			if !named {
				r.fail("refund %s succeeded with processor refund %q, which is no succeeded refund under its key", rf.ID, rf.ProcessorRefundID)
			}
		}
		if landed != want {
			r.fail("refund %s (%s): the processor refunded %d under its key, our row says %d", rf.ID, rf.Status, landed, want)
		}
	}
	for _, c := range comps {
		for _, ch := range charges {
			if ch.ID == c.ChargeID && c.Status == "succeeded" && ch.RefundedAmount != ch.Amount {
				r.fail("compensation of charge %s succeeded, but the processor refunded %d of %d", ch.ID, ch.RefundedAmount, ch.Amount)
			}
		}
	}
}

// checkOrder compares the order's projection with its payments and
// refunds, and the outbox with their outcomes.
func (r *run) checkOrder(s scheduleState) {
	var paid, refunded int64
	want := map[string]int{} // event type and subject -> how many events
	for _, p := range s.pays {
		switch p.Status {
		case payments.StatusSucceeded:
			paid += p.Amount
			want[payments.TypePaymentSucceeded+" "+p.ID.String()] = 1
		case payments.StatusDeclined, payments.StatusFailed:
			want[payments.TypePaymentFailed+" "+p.ID.String()] = 1
		}
	}
	for _, rf := range s.refunds {
		if rf.Status == payments.RefundStatusSucceeded {
			refunded += rf.Amount
			want[payments.TypeRefundSucceeded+" "+rf.ID.String()] = 1
		}
	}
	if s.amountPaid != paid-refunded || s.amountRefunded != refunded {
		r.fail("order: amount_paid %d, amount_refunded %d; its payments and refunds say %d and %d", s.amountPaid, s.amountRefunded, paid-refunded, refunded)
	}
	got := map[string]int{}
	for _, e := range s.events {
		got[e.Subject] = e.N
	}
	for subject, n := range got {
		if want[subject] != n {
			r.fail("outbox: %d events %s, want %d", n, subject, want[subject])
		}
	}
	for subject, n := range want {
		if _, ok := got[subject]; !ok {
			r.fail("outbox: no event %s, want %d", subject, n)
		}
	}
	if s.unapplied > 0 {
		r.fail("%d outbox events were never applied", s.unapplied)
	}
}

// checkKeys compares every key's claims and recorded responses with what
// its requests were answered.
func (r *run) checkKeys(s scheduleState) {
	for _, c := range s.claims {
		r.fail("key %s %q was claimed %d times: the request executed %d times", c.Endpoint, c.Key, c.N, c.N)
	}
	for _, k := range s.keys {
		if k.State != "completed" {
			r.fail("key %s %q is %s after the drain", k.Endpoint, k.Key, k.State)
		}
	}
	recorded := map[string][]keyRecord{}
	for _, rec := range s.records {
		recorded[rec.Endpoint+" "+rec.Key] = append(recorded[rec.Endpoint+" "+rec.Key], rec)
	}
	same := func(status int, location string, body []byte, rec keyRecord) bool {
		return status == rec.Status && location == rec.Location && bytes.Equal(body, rec.Body)
	}
	for _, ref := range r.keys {
		recs := recorded[ref.claim.Endpoint+" "+ref.claim.Key]
		got := r.answers[ref]
		if len(recs) == 0 {
			if len(got) > 0 {
				r.fail("key %q was answered %d but recorded no response", ref.name, got[0].res.Status)
			}
			continue
		}
		first := recs[0]
		for _, rec := range recs[1:] {
			if !same(rec.Status, rec.Location, rec.Body, first) {
				r.fail("key %q recorded %d %s, and later %d %s", ref.name, first.Status, first.Body, rec.Status, rec.Body)
			}
		}
		for _, a := range got {
			if !same(a.res.Status, a.res.Header.Get("Location"), a.res.Body, first) {
				r.fail("key %q: %s was answered %d %s (Location %q), the key recorded %d %s (Location %q)",
					ref.name, a.who, a.res.Status, a.res.Body, a.res.Header.Get("Location"), first.Status, first.Body, first.Location)
			}
		}
	}
}
