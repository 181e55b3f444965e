package orders_test

import (
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
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// M1: the orders consumer applies an event once, however often it is
// delivered. A payment.succeeded and a refund.succeeded each reach the
// stream twice, with the same message id and the same bytes, as when a
// relay republishes a row whose mark was lost after the stream's
// duplicates window: the stream keeps both copies and the consumer
// receives all four. The order counts the payment once and the refund
// once; an inbox that answered "fresh" to the copies would count each
// twice.
func TestOrdersConsumerAppliesEachEventOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := testdb.NewPool(t)
	tenant, _, err := tenants.Create(ctx, pool, "orders-consumer")
	if err != nil {
		t.Fatal(err)
	}
	order := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO orders (tenant_id, id, reference, customer_id, amount, currency)
		VALUES ($1, $2, 'twice', 'cus', 1000, 'EUR')`, tenant, order); err != nil {
		t.Fatal(err)
	}
	// A short duplicates window, so that a copy can get past it.
	bcfg := broker.Config{DuplicateWindow: 100 * time.Millisecond}
	_, _, js := testkit.Broker(t, bcfg)
	c, err := consumer.Start(ctx, pool, js, consumer.Config{Name: orders.ConsumerName, Subjects: orders.Subjects, Broker: bcfg}, orders.ApplyEvent)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)

	// twice puts the event on the stream, then again once the stream no
	// longer drops the copy as a duplicate.
	twice := func(eventType string, data any) {
		t.Helper()
		raw, _ := json.Marshal(data)
		env := events.Envelope{ID: uuid.New(), Type: eventType, SchemaVersion: events.SchemaVersion, TenantID: tenant, Data: raw}
		payload, _ := json.Marshal(env)
		publish := func() *jetstream.PubAck {
			ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: events.Subject(eventType), Data: payload}, jetstream.WithMsgID(env.ID.String()))
			if err != nil {
				t.Fatal(err)
			}
			return ack
		}
		publish()
		testkit.WaitFor(t, 10*time.Second, func() bool { return !publish().Duplicate })
	}
	// Amounts whose doubles the order's checks still allow, so that a
	// second application shows in the sums instead of failing.
	twice(payments.TypePaymentSucceeded, payments.PaymentEvent{OrderID: order, Amount: 400, Currency: "EUR", Status: "succeeded"})
	twice(payments.TypeRefundSucceeded, payments.RefundEvent{RefundID: uuid.New(), OrderID: order, Amount: 100, Currency: "EUR"})

	cons, err := js.Consumer(ctx, broker.StreamEvents, orders.ConsumerName)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 20*time.Second, func() bool {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.AckFloor.Stream == 4
	})
	var paid, refunded, inbox int64
	var status string
	if err := pool.QueryRow(ctx, `SELECT amount_paid, amount_refunded, status FROM orders WHERE id = $1`, order).Scan(&paid, &refunded, &status); err != nil {
		t.Fatal(err)
	}
	if paid != 300 || refunded != 100 || status != "partially_refunded" {
		t.Errorf("order: amount_paid %d, amount_refunded %d, status %s; want 300, 100, partially_refunded (each event once)", paid, refunded, status)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM processed_messages WHERE consumer = $1`, orders.ConsumerName).Scan(&inbox); err != nil || inbox != 2 {
		t.Errorf("inbox rows = %d (%v), want 2", inbox, err)
	}
}
