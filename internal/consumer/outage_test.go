package consumer_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemref/payments/internal/broker"
	"github.com/idemref/payments/internal/consumer"
	"github.com/idemref/payments/internal/events"
	"github.com/idemref/payments/internal/inbox"
	"github.com/idemref/payments/internal/orders"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// fastRedelivery redelivers after 200 ms, 400 ms and 800 ms, then gives
// up: a redelivery horizon of 1.4 s.
var fastRedelivery = broker.Config{AckWait: 200 * time.Millisecond, MaxDeliver: 3}

// outageBundle is a database, a broker with the streams and the dead-letter
// handler, and a pool that reaches the database through a proxy the test
// can cut, for the consumer under test; pool reaches it directly.
type outageBundle struct {
	pool    *pgxpool.Pool
	proxy   *testkit.TCPProxy
	proxied *pgxpool.Pool
	js      jetstream.JetStream
	tenant  uuid.UUID
}

func setupOutage(t *testing.T) *outageBundle {
	t.Helper()
	pool, url := testdb.NewPool(t)
	proxy, cfg := testkit.DatabaseProxy(t, url)
	cfg.MaxConns = 2
	proxied, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxied.Close)
	_, nc, js := testkit.Broker(t, fastRedelivery)
	dead, err := consumer.StartDeadLetters(nc, js, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dead.Stop)
	tenant, _, err := tenants.Create(t.Context(), pool, "outage")
	if err != nil {
		t.Fatal(err)
	}
	return &outageBundle{pool: pool, proxy: proxy, proxied: proxied, js: js, tenant: tenant}
}

// start starts a consumer named name (each test its own, so that its
// metrics are its own) on the proxied pool.
func (f *outageBundle) start(t *testing.T, name string, handle consumer.Handler) *consumer.Consumer {
	t.Helper()
	c, err := consumer.Start(t.Context(), f.proxied, f.js, consumer.Config{
		Name: name, Subjects: orders.Subjects, Broker: fastRedelivery, Logger: testkit.Logger(t),
	}, handle)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// order inserts an unpaid order of amount and returns its id.
func (f *outageBundle) order(t *testing.T, amount int64) uuid.UUID {
	t.Helper()
	id := uuid.New()
	if _, err := f.pool.Exec(t.Context(), `INSERT INTO orders (tenant_id, id, reference, customer_id, amount, currency)
		VALUES ($1, $2, $3, 'cus', $4, 'EUR')`, f.tenant, id, id.String(), amount); err != nil {
		t.Fatal(err)
	}
	return id
}

// paid publishes the payment.succeeded event of an order, as the relay
// would: the envelope's id is the message id.
func (f *outageBundle) paid(t *testing.T, order uuid.UUID, amount int64) {
	t.Helper()
	data, _ := json.Marshal(payments.PaymentEvent{OrderID: order, Amount: amount, Currency: "EUR", Status: "succeeded"})
	env := events.Envelope{ID: uuid.New(), Type: payments.TypePaymentSucceeded, SchemaVersion: events.SchemaVersion, TenantID: f.tenant, Data: data}
	raw, _ := json.Marshal(env)
	if _, err := f.js.PublishMsg(t.Context(), &nats.Msg{Subject: events.Subject(env.Type), Data: raw}, jetstream.WithMsgID(env.ID.String())); err != nil {
		t.Fatal(err)
	}
}

func (f *outageBundle) deadLetters(t *testing.T) uint64 {
	t.Helper()
	s, err := f.js.Stream(t.Context(), broker.StreamDeadLetters)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func (f *outageBundle) consumerInfo(t *testing.T, name string) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := f.js.Consumer(t.Context(), broker.StreamEvents, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func (f *outageBundle) amountPaid(t *testing.T, order uuid.UUID) int64 {
	t.Helper()
	var paid int64
	if err := f.pool.QueryRow(t.Context(), `SELECT amount_paid FROM orders WHERE id = $1`, order).Scan(&paid); err != nil {
		t.Fatal(err)
	}
	return paid
}

// heldRetries is consumer_held_retries_total of the consumer name.
func heldRetries(t *testing.T, name string) float64 {
	t.Helper()
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() != "consumer_held_retries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "consumer" && l.GetValue() == name {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// M1, M3: a database outage three times longer than the broker's whole
// redelivery horizon dead-letters nothing. The consumer holds the event in
// hand and retries it until the database is back, so neither event is
// redelivered (each was delivered once), and both orders are paid once
// the outage ends. Before, each failed delivery was naked, every
// redelivery counted towards MaxDeliver, and both events were
// dead-lettered within the first second; their orders were never paid.
// The second event also proves the consumer fetches one message at a
// time: one waiting in the client's buffer behind the held one would be
// redelivered each ack wait, and dead-lettered.
func TestDatabaseOutageDeadLettersNothing(t *testing.T) {
	t.Parallel()
	const name = "orders-outage"
	f := setupOutage(t)
	c := f.start(t, name, orders.ApplyEvent)
	t.Cleanup(c.Stop)
	first, second := f.order(t, 1000), f.order(t, 2000)

	f.proxy.Cut()
	f.paid(t, first, 1000)
	f.paid(t, second, 2000)
	testkit.WaitFor(t, 10*time.Second, func() bool { return f.consumerInfo(t, name).Delivered.Consumer >= 1 })
	horizon := fastRedelivery.RedeliveryHorizon()
	for since := time.Now(); time.Since(since) < 3*horizon; time.Sleep(20 * time.Millisecond) {
		if n := f.deadLetters(t); n != 0 {
			t.Fatalf("%d events dead-lettered %s into the database outage (redelivery horizon %s), want none",
				n, time.Since(since).Round(time.Millisecond), horizon)
		}
	}
	f.proxy.Restore()

	testkit.WaitFor(t, 20*time.Second, func() bool {
		return f.amountPaid(t, first) == 1000 && f.amountPaid(t, second) == 2000
	})
	testkit.WaitFor(t, 10*time.Second, func() bool { return f.consumerInfo(t, name).NumAckPending == 0 })
	info := f.consumerInfo(t, name)
	if info.Delivered.Consumer != 2 || info.NumRedelivered != 0 {
		t.Errorf("deliveries = %d (%d redelivered), want 2 (none redelivered): the outage cost no delivery",
			info.Delivered.Consumer, info.NumRedelivered)
	}
	if n := f.deadLetters(t); n != 0 {
		t.Errorf("dead letters = %d, want 0", n)
	}
	var inbox int
	if err := f.pool.QueryRow(t.Context(), `SELECT count(*) FROM processed_messages WHERE consumer = $1`, name).Scan(&inbox); err != nil || inbox != 2 {
		t.Errorf("inbox rows = %d (%v), want 2", inbox, err)
	}
	t.Logf("held %v retries through the outage", heldRetries(t, name))
}

// A transient failure while the database answers (here a deadlock every
// time) is retried in hand a few times, then handed back to the broker's
// backoff like any failure: the event is dead-lettered after MaxDeliver
// deliveries instead of holding the consumer up for ever.
func TestTransientFailureWhileTheDatabaseAnswersIsDeadLettered(t *testing.T) {
	t.Parallel()
	f := setupOutage(t)
	c := f.start(t, "orders-deadlocked", func(context.Context, pgx.Tx, events.Envelope) error {
		return &pgconn.PgError{Code: "40P01", Message: "deadlock detected"}
	})
	t.Cleanup(c.Stop)
	f.paid(t, f.order(t, 1000), 1000)
	testkit.WaitFor(t, 30*time.Second, func() bool { return f.deadLetters(t) == 1 })
	if info := f.consumerInfo(t, "orders-deadlocked"); info.Delivered.Consumer != uint64(fastRedelivery.MaxDeliver) {
		t.Errorf("deliveries = %d, want %d (MaxDeliver)", info.Delivered.Consumer, fastRedelivery.MaxDeliver)
	}
}

// Stop does not wait for the database: an event held through an outage is
// handed back for redelivery, neither applied nor dead-lettered.
func TestStopHandsBackAHeldEvent(t *testing.T) {
	t.Parallel()
	const name = "orders-stopped"
	f := setupOutage(t)
	c := f.start(t, name, orders.ApplyEvent)
	order := f.order(t, 1000)
	f.proxy.Cut()
	f.paid(t, order, 1000)
	testkit.WaitFor(t, 10*time.Second, func() bool { return heldRetries(t, name) >= 1 })

	stopped := make(chan struct{})
	go func() {
		c.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return within 10s while the database was down")
	}
	f.proxy.Restore()
	if paid := f.amountPaid(t, order); paid != 0 {
		t.Errorf("amount_paid = %d, want 0: nothing was applied", paid)
	}
	info := f.consumerInfo(t, name)
	if info.NumAckPending+int(info.NumPending) != 1 || f.deadLetters(t) != 0 {
		t.Errorf("pending %d, ack pending %d, dead letters %d: want the event waiting for redelivery",
			info.NumPending, info.NumAckPending, f.deadLetters(t))
	}
}

// G4: an event held in hand through a database outage when the process
// stops is handed back at once: a consumer of another process, which
// reaches the database, applies it now, neither after the ack wait nor
// after the backoff (a minute each here). Before, Stop handed it back with
// the backoff's delay, and the event waited out that minute.
func TestStopHandsBackAHeldEventAtOnce(t *testing.T) {
	t.Parallel()
	const name = "orders-handed-back"
	slow := broker.Config{AckWait: time.Minute, MaxDeliver: 3}
	f := setupOutage(t)
	start := func(pool *pgxpool.Pool) *consumer.Consumer {
		c, err := consumer.Start(t.Context(), pool, f.js, consumer.Config{
			Name: name, Subjects: orders.Subjects, Broker: slow, Logger: testkit.Logger(t),
		}, orders.ApplyEvent)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	stopping := start(f.proxied)
	order := f.order(t, 1000)
	f.proxy.Cut()
	f.paid(t, order, 1000)
	testkit.WaitFor(t, 10*time.Second, func() bool { return heldRetries(t, name) >= 1 })

	// The other process's consumer shares the durable consumer; the server
	// sends it nothing while the first one holds the event.
	other := start(f.pool)
	t.Cleanup(other.Stop)
	stopping.Stop()
	testkit.WaitFor(t, 15*time.Second, func() bool { return f.amountPaid(t, order) == 1000 })
	testkit.WaitFor(t, 10*time.Second, func() bool { return f.consumerInfo(t, name).NumAckPending == 0 })
	info := f.consumerInfo(t, name)
	if info.Delivered.Consumer != 2 {
		t.Errorf("deliveries = %d, want 2: the held one and the one after the hand-back", info.Delivered.Consumer)
	}
	if n := f.deadLetters(t); n != 0 {
		t.Errorf("dead letters = %d, want 0", n)
	}
}

// duplicateCounts reads consumer_duplicates_skipped_total and
// consumer_stream_duplicates_total of consumer name.
func duplicateCounts(t *testing.T, name string) (skipped, streamCopies float64) {
	t.Helper()
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() != "consumer" || l.GetValue() != name {
					continue
				}
				switch mf.GetName() {
				case "consumer_duplicates_skipped_total":
					skipped = m.GetCounter().GetValue()
				case "consumer_stream_duplicates_total":
					streamCopies = m.GetCounter().GetValue()
				}
			}
		}
	}
	return skipped, streamCopies
}

// A commit whose answer is lost (the leader failing over during COMMIT)
// is retried in hand, and the retry finds the inbox row its own first
// attempt committed: a duplicate, skipped, and no second copy on the
// stream, which DuplicatesBeyondTheWindow would page for. The first
// attempt here answers a serialization failure while a committed
// transaction of the same inbox row and effect lands behind it, as the
// commit that succeeded unseen would have.
func TestARetryFindingItsOwnCommitIsNoStreamDuplicate(t *testing.T) {
	t.Parallel()
	const name = "orders-lost-commit"
	f := setupOutage(t)
	var attempts atomic.Int32
	landed := make(chan error, 1)
	c := f.start(t, name, func(ctx context.Context, tx pgx.Tx, ev events.Envelope) error {
		if attempts.Add(1) > 1 {
			return orders.ApplyEvent(ctx, tx, ev)
		}
		// Waits on this attempt's uncommitted inbox row, then commits
		// the same row and effect once this attempt rolls back.
		go func() {
			landed <- pgx.BeginFunc(context.WithoutCancel(ctx), f.pool, func(tx pgx.Tx) error {
				if _, err := inbox.Record(ctx, tx, ev.TenantID, name, events.Source, ev.ID.String()); err != nil {
					return err
				}
				return orders.ApplyEvent(ctx, tx, ev)
			})
		}()
		return &pgconn.PgError{Code: "40001", Message: "could not serialize access (the commit's answer lost)"}
	})
	t.Cleanup(c.Stop)
	order := f.order(t, 1000)
	f.paid(t, order, 1000)
	if err := <-landed; err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, func() bool {
		skipped, _ := duplicateCounts(t, name)
		return skipped == 1
	})
	if _, copies := duplicateCounts(t, name); copies != 0 {
		t.Errorf("stream duplicates = %v, want 0: the duplicate was the delivery's own commit", copies)
	}
	if paid := f.amountPaid(t, order); paid != 1000 {
		t.Errorf("amount paid = %d, want 1000 (once)", paid)
	}
	if info := f.consumerInfo(t, name); info.Delivered.Consumer != 1 {
		t.Errorf("deliveries = %d, want 1: retried in hand, not redelivered", info.Delivered.Consumer)
	}
}
