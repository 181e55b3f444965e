package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemref/payments/internal/broker"
	"github.com/idemref/payments/internal/config"
	"github.com/idemref/payments/internal/events"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/reaper"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// An event can be applied and still be dead-lettered: its delivery commits
// (the inbox row and the order's update) and the ack is lost, so the server
// gives up on it. A redrive must never apply it again, whatever its age:
//
//   - a dead letter whose id its consumer's inbox holds was applied: redrive
//     removes it without publishing it;
//   - a dead letter older than what the inbox can vouch for (the reaper
//     prunes ids past MESSAGE_RETENTION) is refused and kept, and redrive
//     says why and what to do; once an operator has checked the order by
//     hand and recorded the event as applied, redrive removes it.
//
// Each order is paid once, and nothing is published again.
func TestRedriveNeverAppliesAnEventTwice(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, url := testdb.NewPool(t)
	tenant, _, err := tenants.Create(ctx, pool, "redrive-twice")
	if err != nil {
		t.Fatal(err)
	}
	// Each order is paid in part, so that a payment counted twice still
	// fits within the order's amount (orders_books_within_amount).
	const orderAmount, amount = 100, 40
	recent, old, later := uuid.New(), uuid.New(), uuid.New()
	for i, order := range []uuid.UUID{recent, old, later} {
		if _, err := pool.Exec(ctx, `INSERT INTO orders (tenant_id, id, reference, customer_id, amount, currency)
			VALUES ($1, $2, $3, 'cus', $4, 'EUR')`, tenant, order, fmt.Sprintf("redrive-twice-%d", i), orderAmount); err != nil {
			t.Fatal(err)
		}
	}
	paid := func(order uuid.UUID) int {
		return count(t, pool, `SELECT amount_paid FROM orders WHERE id = $1`, order)
	}

	// Every delivery commits and then stalls past its ack wait, as when the
	// link to NATS drops between the commit and the ack. With one delivery
	// allowed, the server gives up on the event and it is dead-lettered.
	stalled := startServer(t, url, "EVENTS_ACK_WAIT=100ms", "EVENTS_MAX_DELIVER=1", "EVENTS_DUPLICATE_WINDOW=1s",
		"FAILPOINTS=consumer-after-commit=sleep:1s")
	testkit.WaitFor(t, 20*time.Second, func() bool { _, events := readiness(t, stalled); return events == "flowing" })
	natsURL := natsURLFor(t, url)
	nc, js, err := broker.Connect(natsURL, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	streamMsgs := func(name string) uint64 {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	publish := func(order uuid.UUID, occurred time.Time) events.Envelope {
		t.Helper()
		data, _ := json.Marshal(payments.PaymentEvent{PaymentID: uuid.New(), OrderID: order, Amount: amount, Currency: "EUR", Status: "succeeded"})
		env := events.Envelope{ID: uuid.New(), Type: payments.TypePaymentSucceeded, SchemaVersion: events.SchemaVersion,
			OccurredAt: occurred.UTC(), TenantID: tenant, Data: data}
		payload, _ := json.Marshal(env)
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: events.Subject(env.Type), Data: payload}, jetstream.WithMsgID(env.ID.String())); err != nil {
			t.Fatal(err)
		}
		return env
	}
	// One at a time: an event behind a stalled delivery would wait, and
	// could be given up on before it is applied. The consumer counts an
	// event as processed once its stall is over.
	processed := func() float64 { return metric(t, stalled, `consumer_processed_total{consumer="orders"}`) }
	recentEv := publish(recent, time.Now())
	testkit.WaitFor(t, 20*time.Second, func() bool { return streamMsgs(broker.StreamDeadLetters) == 1 && processed() == 1 })
	// This one as if it had happened eight days ago: its inbox row is made
	// as old below.
	oldEv := publish(old, time.Now().Add(-8*24*time.Hour))
	testkit.WaitFor(t, 20*time.Second, func() bool { return streamMsgs(broker.StreamDeadLetters) == 2 && processed() == 2 })
	for _, order := range []uuid.UUID{recent, old} {
		if p := paid(order); p != amount {
			t.Fatalf("amount_paid when the event was dead-lettered = %d, want %d: it was applied", p, amount)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'orders'`); n != 2 {
		t.Fatalf("inbox rows when the events were dead-lettered = %d, want 2", n)
	}

	// The link is back.
	_ = stalled.cmd.Process.Kill()
	<-stalled.exited
	api := startServer(t, url, "EVENTS_ACK_WAIT=100ms", "EVENTS_DUPLICATE_WINDOW=1s")
	testkit.WaitFor(t, 20*time.Second, func() bool { _, events := readiness(t, api); return events == "flowing" })

	// The old event's inbox row is as old as the event, and the reaper
	// prunes it past MESSAGE_RETENTION (this one, or the one in the server).
	if _, err := pool.Exec(ctx, `UPDATE processed_messages SET processed_at = $2 WHERE consumer = 'orders' AND message_id = $1`,
		oldEv.ID.String(), oldEv.OccurredAt.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	// The server's reaper may hold the row (its prune skips locked rows,
	// and so does this one) until its own pass commits: pass again until
	// one of them has pruned it.
	reap := reaper.New(pool, reaper.Config{MessageRetention: config.DefaultMessageRetention, Logger: slog.New(slog.DiscardHandler)})
	var inbox int
	testkit.WaitFor(t, 10*time.Second, func() bool {
		if _, err := reap.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		inbox = count(t, pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'orders'`)
		return inbox <= 1
	})
	if inbox != 1 {
		t.Fatalf("inbox rows after the reaper's pass = %d, want 1 (the old event's pruned)", inbox)
	}

	var out, errOut string
	var ok bool
	testkit.WaitFor(t, 20*time.Second, func() bool {
		out, errOut, ok = runDeadLetters(t, natsURL, url, "redrive")
		return strings.Contains(out, "kept 0") // past the events stream's duplicates window
	})
	// Whatever the redrive published is applied before an event published
	// after it: the consumer takes them one at a time, in stream order.
	publish(later, time.Now())
	testkit.WaitFor(t, 20*time.Second, func() bool { return paid(later) == amount })

	if p := paid(old); p != amount {
		t.Fatalf("amount_paid of the order whose event aged out of the inbox = %d after the redrive, want %d: the event was applied twice\nredrive printed:\n%s%s",
			p, amount, out, errOut)
	}
	if p := paid(recent); p != amount {
		t.Fatalf("amount_paid of the order whose event the inbox holds = %d after the redrive, want %d\nredrive printed:\n%s%s", p, amount, out, errOut)
	}
	if n := streamMsgs(broker.StreamEvents); n != 3 {
		t.Errorf("messages on the events stream = %d, want 3: nothing published again", n)
	}
	if ok || !strings.Contains(out, "applied ") || !strings.Contains(out, recentEv.ID.String()) ||
		!strings.Contains(out, "refused ") || !strings.Contains(out, oldEv.ID.String()) ||
		!strings.Contains(out, "redriven 0, applied 1, kept 0, refused 1") ||
		!strings.Contains(errOut, "MESSAGE_RETENTION") || !strings.Contains(errOut, "INSERT INTO processed_messages") {
		t.Errorf("redrive: ok %v, printed:\n%s%s\nwant the applied event removed, the old one refused, why, and what to do", ok, out, errOut)
	}
	if n := streamMsgs(broker.StreamDeadLetters); n != 1 {
		t.Errorf("dead letters after the redrive = %d, want 1: the refused one is kept", n)
	}

	// An operator finds the old event's payment in its order: it was
	// applied. Recorded so in the inbox, redrive removes the dead letter
	// without publishing it.
	if _, err := pool.Exec(ctx, `INSERT INTO processed_messages (consumer, source, message_id) VALUES ('orders', $1, $2)`,
		events.Source, oldEv.ID.String()); err != nil {
		t.Fatal(err)
	}
	out, errOut, ok = runDeadLetters(t, natsURL, url, "redrive")
	if !ok || !strings.Contains(out, "redriven 0, applied 1, kept 0, refused 0") {
		t.Errorf("redrive after the event was recorded as applied: ok %v, printed:\n%s%s\nwant it removed as applied", ok, out, errOut)
	}
	if n := streamMsgs(broker.StreamDeadLetters); n != 0 {
		t.Errorf("dead letters after the second redrive = %d, want 0", n)
	}
	if n := streamMsgs(broker.StreamEvents); n != 3 {
		t.Errorf("messages on the events stream after the second redrive = %d, want 3", n)
	}
	if p := paid(old); p != amount {
		t.Errorf("amount_paid after the second redrive = %d, want %d", p, amount)
	}
}

// Redrive asks the inbox before it publishes anything, so it needs the
// database and says so before it connects to the broker.
func TestRedriveWithoutDatabaseURL(t *testing.T) {
	t.Parallel()
	var stdout, stderr strings.Builder
	err := run(t.Context(), []string{"deadletters", "redrive"}, func(k string) string {
		return map[string]string{"NATS_URL": "nats://127.0.0.1:1"}[k]
	}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "DATABASE_URL is not set") || !strings.Contains(err.Error(), "inbox") {
		t.Fatalf("err = %v, want DATABASE_URL is not set, and why redrive needs it", err)
	}
}
