package consumer_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemref/payments/internal/broker"
	"github.com/idemref/payments/internal/consumer"
	"github.com/idemref/payments/internal/events"
	"github.com/idemref/payments/internal/orders"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// Messages a consumer gives up on are kept: an unreadable one at once, one
// whose effect keeps failing after MaxDeliver deliveries. Each is copied to
// the dead-letter stream with the reason, and neither leaves an inbox row.
func TestDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := testdb.NewPool(t)
	bcfg := broker.Config{AckWait: 100 * time.Millisecond, MaxDeliver: 3}
	_, nc, js := testkit.Broker(t, bcfg)
	dead, err := consumer.StartDeadLetters(nc, js, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dead.Stop)
	c, err := consumer.Start(ctx, pool, js, consumer.Config{Name: orders.ConsumerName, Subjects: orders.Subjects, Broker: bcfg}, orders.ApplyEvent)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)

	publish := func(id string, data []byte) {
		t.Helper()
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: events.Subject(payments.TypePaymentSucceeded), Data: data}, jetstream.WithMsgID(id)); err != nil {
			t.Fatal(err)
		}
	}
	publish("garbage", []byte("not json"))
	// A payment of an order that does not exist: the update finds no row,
	// every delivery fails.
	orphan, _ := json.Marshal(payments.PaymentEvent{OrderID: uuid.New(), Amount: 100, Currency: "EUR", Status: "succeeded"})
	env, _ := json.Marshal(events.Envelope{ID: uuid.New(), Type: payments.TypePaymentSucceeded, SchemaVersion: events.SchemaVersion, TenantID: uuid.New(), Data: orphan})
	publish("orphan", env)

	reasons := map[string]string{}
	deadline := time.Now().Add(20 * time.Second)
	for len(reasons) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("dead letters after 20s: %v, want the unreadable and the orphan message", reasons)
		}
		time.Sleep(50 * time.Millisecond)
		s, err := js.Stream(ctx, broker.StreamDeadLetters)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
			m, err := s.GetMsg(context.WithoutCancel(ctx), seq)
			if err != nil {
				t.Fatal(err)
			}
			reasons[string(m.Data)] = m.Header.Get("Dead-Letter-Reason")
		}
	}
	if got := reasons["not json"]; got != "terminated" {
		t.Errorf("the unreadable message was dead-lettered as %q, want terminated", got)
	}
	if got := reasons[string(env)]; got != "max_deliver" {
		t.Errorf("the failing message was dead-lettered as %q, want max_deliver", got)
	}
	// Kept in the events stream too, which keeps messages by age.
	s, err := js.Stream(ctx, broker.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Errorf("events stream holds %d messages, want 2", info.State.Msgs)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM processed_messages`).Scan(&n); err != nil || n != 0 {
		t.Errorf("inbox rows = %d (%v), want 0: nothing was applied", n, err)
	}
}
