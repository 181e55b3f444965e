package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemref/payments/internal/broker"
	"github.com/idemref/payments/internal/consumer"
	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/events"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/orders"
	"github.com/idemref/payments/internal/outbox"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/processor/simproc"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/natstmp"
	"github.com/idemref/payments/internal/tooling/processorsim"
	"github.com/idemref/payments/internal/tooling/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// openPool opens a pool of its own on the test database: each relay,
// consumer and the payments service get one, as separate processes would.
func openPool(t *testing.T, url string, size int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	db.Configure(cfg)
	cfg.MaxConns = size
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// T5, M1, M2: two relays and two consumers at once, while 1,000 payments
// (some declined) and refunds of some of them are made through the
// payments service against the processor simulator. Every event is on the
// stream exactly once, every payment.succeeded and refund.succeeded is
// applied exactly once, and each order's amount_paid is the sum of its
// succeeded payments minus its refunds.
func TestTwoRelaysTwoConsumersApplyEveryEventOnce(t *testing.T) {
	t.Parallel()
	const nPayments = 1000
	ctx := t.Context()
	pool, url := testdb.NewPool(t)
	tenant, _, err := tenants.Create(ctx, pool, "load")
	if err != nil {
		t.Fatal(err)
	}
	ns, err := natstmp.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	// Redeliveries (a refund that overtook its payment's event) come back
	// within the test.
	bcfg := broker.Config{AckWait: 200 * time.Millisecond, MaxDeliver: 10}
	connect := func() jetstream.JetStream {
		nc, js, err := broker.Connect(ns.URL(), "test")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return js
	}
	if err := broker.Ensure(ctx, connect(), bcfg); err != nil {
		t.Fatal(err)
	}
	sim, err := processorsim.Start("127.0.0.1:0", processorsim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Shutdown(context.Background()) })

	// Two relays and two consumers, each with its own pool and connection.
	runCtx, stop := context.WithCancel(ctx)
	var running sync.WaitGroup
	var applied [2]atomic.Int64
	var consumers []*consumer.Consumer
	for i := range 2 {
		relay := outbox.NewRelay(openPool(t, url, 2), connect(), outbox.RelayConfig{Batch: 50})
		running.Go(func() { relay.Run(runCtx) })
		c, err := consumer.Start(ctx, openPool(t, url, 3), connect(), consumer.Config{
			Name: orders.ConsumerName, Subjects: orders.Subjects, Broker: bcfg,
		}, func(ctx context.Context, tx pgx.Tx, ev events.Envelope) error {
			err := orders.ApplyEvent(ctx, tx, ev)
			if err == nil {
				applied[i].Add(1)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		consumers = append(consumers, c)
	}
	t.Cleanup(func() {
		stop()
		running.Wait()
		for _, c := range consumers {
			c.Stop()
		}
	})

	// The orders, then the payments and refunds, eight at a time.
	if _, err := pool.Exec(ctx, `
		INSERT INTO orders (tenant_id, id, reference, customer_id, amount, currency)
		SELECT $1, gen_random_uuid(), 'load-' || i, 'cus', 1000 + i, 'EUR' FROM generate_series(0, $2 - 1) AS i`,
		tenant, nPayments); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT id, amount FROM orders WHERE tenant_id = $1 ORDER BY amount`, tenant)
	if err != nil {
		t.Fatal(err)
	}
	type order struct {
		id     uuid.UUID
		amount int64
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (order, error) {
		var o order
		return o, r.Scan(&o.id, &o.amount)
	})
	if err != nil {
		t.Fatal(err)
	}
	svc := payments.NewService(openPool(t, url, 8), idem.NewStore(pool, idem.Config{}),
		simproc.NewClient(sim.URL(), 5*time.Second), httpapi.Renderer{}, slog.New(slog.DiscardHandler), payments.Config{})
	var succeeded, declined, refunds atomic.Int64
	var paidSum, refundSum atomic.Int64
	work := make(chan int)
	var workers sync.WaitGroup
	for range 8 {
		workers.Go(func() {
			for i := range work {
				o := all[i]
				method := processorsim.PaymentMethodVisa
				if i%25 == 0 {
					method = processorsim.PaymentMethodDeclined // a payment.failed event
				}
				in := payments.PayInput{OrderID: o.id, Amount: o.amount, Currency: "EUR", PaymentMethod: method}
				fp, _ := idem.Fingerprint(payments.EndpointPay, nil, in)
				res, _, err := svc.Pay(ctx, idem.Claim{TenantID: tenant, Endpoint: payments.EndpointPay, Key: fmt.Sprintf("pay-%d", i), Fingerprint: fp}, in)
				switch {
				case err != nil:
					t.Errorf("pay %d: %v", i, err)
					continue
				case res.Status == 402:
					declined.Add(1)
					continue
				case res.Status != 201:
					t.Errorf("pay %d: %d %s", i, res.Status, res.Body)
					continue
				}
				succeeded.Add(1)
				paidSum.Add(o.amount)
				if i%10 != 0 {
					continue
				}
				var paymentID uuid.UUID
				if err := pool.QueryRow(ctx, `SELECT id FROM payments WHERE order_id = $1 AND status = 'succeeded'`, o.id).Scan(&paymentID); err != nil {
					t.Errorf("payment of %d: %v", i, err)
					continue
				}
				amount := o.amount / 4
				rfp, _ := idem.Fingerprint(payments.EndpointRefund, map[string]string{"id": paymentID.String()}, map[string]int64{"amount": amount})
				res, _, err = svc.Refund(ctx, idem.Claim{TenantID: tenant, Endpoint: payments.EndpointRefund, Key: fmt.Sprintf("refund-%d", i), Fingerprint: rfp}, paymentID, amount)
				if err != nil || res.Status != 201 {
					t.Errorf("refund %d: %v %d %s", i, err, res.Status, res.Body)
					continue
				}
				refunds.Add(1)
				refundSum.Add(amount)
			}
		})
	}
	started := time.Now()
	for i := range all {
		work <- i
	}
	close(work)
	workers.Wait()
	t.Logf("%d payments (%d declined) and %d refunds in %s", nPayments, declined.Load(), refunds.Load(), time.Since(started).Round(time.Millisecond))
	if t.Failed() {
		t.FailNow()
	}

	nEvents := succeeded.Load() + declined.Load() + refunds.Load()
	applicable := succeeded.Load() + refunds.Load() // the orders consumer does not take payment.failed
	count := func(sql string, args ...any) int64 {
		t.Helper()
		var n int64
		if err := pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	deadline := time.Now().Add(60 * time.Second)
	for count(`SELECT count(*) FROM processed_messages WHERE consumer = 'orders'`) < applicable ||
		count(`SELECT count(*) FROM outbox WHERE published_at IS NULL`) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("not caught up within 60s: %d of %d applied, %d unpublished",
				count(`SELECT count(*) FROM processed_messages WHERE consumer = 'orders'`), applicable,
				count(`SELECT count(*) FROM outbox WHERE published_at IS NULL`))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("caught up %s after the first payment; consumer 1 applied %d, consumer 2 applied %d",
		time.Since(started).Round(time.Millisecond), applied[0].Load(), applied[1].Load())

	// Every event in the outbox once, published, and on the stream once.
	if n := count(`SELECT count(*) FROM outbox`); n != nEvents {
		t.Errorf("outbox rows = %d, want %d (one per payment and refund)", n, nEvents)
	}
	// Nothing crashed, so no claim may have been taken twice: two relays
	// never published the same row.
	if n := count(`SELECT count(*) FROM outbox WHERE publish_attempts <> 1`); n != 0 {
		t.Errorf("outbox rows claimed more than once = %d, want 0", n)
	}
	stream, err := connect().Stream(ctx, broker.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if int64(info.State.Msgs) != nEvents {
		t.Errorf("messages on the stream = %d, want %d", info.State.Msgs, nEvents)
	}
	var onStream []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		onStream = append(onStream, m.Header.Get("Nats-Msg-Id"))
	}
	if n := count(`SELECT count(*) FROM outbox WHERE id::text = ANY($1) AND published_at IS NOT NULL`, onStream); n != nEvents {
		t.Errorf("stream messages naming a published outbox row = %d, want %d", n, nEvents)
	}

	// Every applicable event applied once, and nothing else.
	if n := count(`SELECT count(*) FROM processed_messages WHERE consumer = 'orders'`); n != applicable {
		t.Errorf("inbox rows = %d, want %d", n, applicable)
	}
	if n := applied[0].Load() + applied[1].Load(); n < applicable {
		t.Errorf("effects applied = %d, want at least %d", n, applicable)
	}
	// Each order: amount_paid = its succeeded payments minus its refunds.
	if n := count(`
		SELECT count(*) FROM orders o
		LEFT JOIN LATERAL (SELECT coalesce(sum(amount), 0) AS paid FROM payments p
		                   WHERE p.tenant_id = o.tenant_id AND p.order_id = o.id AND p.status = 'succeeded') p ON true
		LEFT JOIN LATERAL (SELECT coalesce(sum(r.amount), 0) AS refunded FROM refunds r JOIN payments p2 ON p2.id = r.payment_id
		                   WHERE p2.order_id = o.id AND r.status = 'succeeded') r ON true
		WHERE o.tenant_id = $1 AND (o.amount_paid <> p.paid - r.refunded OR o.amount_refunded <> r.refunded)`, tenant); n != 0 {
		t.Errorf("orders whose amount_paid or amount_refunded disagree with their payments and refunds: %d", n)
	}
	if got, want := count(`SELECT coalesce(sum(amount_paid), 0) FROM orders WHERE tenant_id = $1`, tenant), paidSum.Load()-refundSum.Load(); got != want {
		t.Errorf("sum of amount_paid = %d, want %d", got, want)
	}
	if n := count(`SELECT count(*) FROM orders WHERE tenant_id = $1 AND status = 'pending'`, tenant); n != declined.Load() {
		t.Errorf("pending orders = %d, want %d (the declined ones)", n, declined.Load())
	}
	// The money at the processor agrees.
	var charged, refundedAtProcessor int64
	for _, ch := range sim.Simulator.Charges() {
		if ch.Status == processor.StatusSucceeded {
			charged += ch.Amount
		}
	}
	for _, re := range sim.Simulator.Refunds() {
		refundedAtProcessor += re.Amount
	}
	if charged != paidSum.Load() || refundedAtProcessor != refundSum.Load() {
		t.Errorf("processor charged %d and refunded %d; want %d and %d", charged, refundedAtProcessor, paidSum.Load(), refundSum.Load())
	}
	t.Logf("asserted: %d events published once, %d applied once, %d orders consistent", nEvents, applicable, nPayments)
}
