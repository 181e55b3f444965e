package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemref/payments/internal/broker"
	"github.com/idemref/payments/internal/consumer"
	"github.com/idemref/payments/internal/orders"
	"github.com/idemref/payments/internal/outbox"
	"github.com/idemref/payments/internal/reaper"
)

// The wait between two attempts to reach the broker or set it up: the
// first after brokerRetryMin, doubling up to brokerRetryMax, for as long
// as it takes.
const (
	brokerRetryMin = 250 * time.Millisecond
	brokerRetryMax = 10 * time.Second
)

var brokerConnected = prometheus.NewGauge(prometheus.GaugeOpts{
	Name: "payments_events_broker_connected",
	Help: "1 while this process is connected to NATS, its streams in place, relaying the outbox and consuming events; 0 while it is connecting or reconnecting (payments are served all the same; their events wait in the outbox).",
})

// registerBrokerConnected registers the gauge in the processes that run
// the event workers only: one with EVENT_WORKERS=false has no connection
// to report, and a 0 from it would read as an outage.
var registerBrokerConnected sync.Once

// eventsState is whether this process's events flow, for /readyz and the
// payments_events_broker_connected gauge.
type eventsState struct {
	mu     sync.Mutex
	detail string // why events do not flow; "" when they do
}

// newEventsState returns the state of a process that runs the event
// workers and has not reached the broker yet.
func newEventsState() *eventsState {
	registerBrokerConnected.Do(func() { prometheus.MustRegister(brokerConnected) })
	s := &eventsState{}
	s.set("connecting to the broker")
	return s
}

// set records the state: detail says why events do not flow, "" that they
// do.
func (s *eventsState) set(detail string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.detail = detail
	if detail == "" {
		brokerConnected.Set(1)
	} else {
		brokerConnected.Set(0)
	}
}

// status is httpapi.Config.Events.
func (s *eventsState) status() (flowing bool, detail string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.detail == "", s.detail
}

// startMessaging runs, beside the HTTP server, the outbox relay, the orders
// consumer and the dead-letter handler. Every API process runs all three:
// relays claim rows with SKIP LOCKED and the durable consumer splits
// messages between processes, so adding processes adds throughput, not
// duplicates.
//
// The broker is not needed to serve payments: their events wait in the
// outbox. So a broker that is down when the process starts does not stop
// it. startMessaging returns at once; in the background it connects to
// NATS_URL, creates or updates the streams and the consumer, and only then
// starts the three, retrying each step with a backoff and reporting in
// state why events do not flow yet. Once connected, the client reconnects
// by itself, and state follows it. stop ends what runs, in order (the
// relay, the consumer finishing the message in hand, the connection), or
// the attempts to connect.
func startMessaging(ctx context.Context, pool, listenPool *pgxpool.Pool, cfg config, logger *slog.Logger, state *eventsState) (stop func()) {
	if window, needed := cfg.Broker.DuplicateWindow, cfg.OutboxClaimHold+outbox.DefaultPublishTimeout; window < needed {
		logger.Warn("EVENTS_DUPLICATE_WINDOW is shorter than OUTBOX_CLAIM_HOLD plus the publish timeout: a row republished after a relay crash reaches the consumers, whose inboxes drop it",
			slog.Duration("window", window), slog.Duration("needed", needed))
	}
	// The consumer's series exist from the start, broker or not, so the
	// alerts on them see their first increase.
	consumer.InitMetrics(orders.ConsumerName)
	return beside(ctx, func(ctx context.Context) { runMessaging(ctx, pool, listenPool, cfg, logger, state) })
}

// runMessaging is startMessaging's background work, until ctx is done.
func runMessaging(ctx context.Context, pool, listenPool *pgxpool.Pool, cfg config, logger *slog.Logger, state *eventsState) {
	// The handlers report a lost connection only once everything runs:
	// before that, the attempts below report their own failures.
	var running atomic.Bool
	var nc *nats.Conn
	var js jetstream.JetStream
	connect := func() (err error) {
		nc, js, err = broker.Connect(cfg.NatsURL, "payments-api",
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				if running.Load() {
					logger.Warn("lost the connection to the broker; reconnecting", slog.Any("error", err))
					state.set(fmt.Sprintf("lost the connection to the broker, reconnecting: %v", err))
				}
			}),
			nats.ReconnectHandler(func(*nats.Conn) {
				if running.Load() {
					logger.Info("reconnected to the broker")
					state.set("")
				}
			}))
		return err
	}
	if !retry(ctx, logger, state, "connect to the broker", connect) {
		return
	}
	defer nc.Close()
	if !retry(ctx, logger, state, "create or update the streams", func() error { return broker.Ensure(ctx, js, cfg.Broker) }) {
		return
	}
	var cons *consumer.Consumer
	if !retry(ctx, logger, state, "start the orders consumer", func() (err error) {
		cons, err = consumer.Start(ctx, pool, js, consumer.Config{
			Name: orders.ConsumerName, Subjects: orders.Subjects, Broker: cfg.Broker, Logger: logger,
		}, orders.ApplyEvent)
		return err
	}) {
		return
	}
	defer cons.Stop()
	var dead *consumer.DeadLetters
	if !retry(ctx, logger, state, "subscribe to the dead-letter advisories", func() (err error) {
		dead, err = consumer.StartDeadLetters(nc, js, logger)
		return err
	}) {
		return
	}
	defer dead.Stop()

	relayDone := make(chan struct{})
	relay := outbox.NewRelay(pool, js, outbox.RelayConfig{ClaimHold: cfg.OutboxClaimHold, ListenPool: listenPool, Logger: logger})
	go func() {
		defer close(relayDone)
		relay.Run(ctx)
	}()
	running.Store(true)
	state.set("")
	logger.Info("messaging running", slog.String("nats_url", redactURL(cfg.NatsURL)), slog.String("stream", broker.StreamEvents), slog.Int("replicas", cfg.Broker.Replicas),
		slog.String("consumer", orders.ConsumerName), slog.Duration("duplicate_window", cfg.Broker.DuplicateWindow),
		slog.Duration("redelivery_horizon", cfg.Broker.RedeliveryHorizon()))
	<-ctx.Done()
	running.Store(false)
	<-relayDone
	// Deferred, in this order: the dead letters, the consumer, the
	// connection.
}

// retry runs step until it succeeds, waiting brokerRetryMin, doubling up
// to brokerRetryMax, between attempts; each failure is logged and is why
// state says events do not flow. It reports false when ctx ended first.
func retry(ctx context.Context, logger *slog.Logger, state *eventsState, what string, step func() error) bool {
	wait := brokerRetryMin
	for attempt := 1; ; attempt++ {
		err := step()
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		logger.Warn("messaging: "+what+" failed; payments are served, their events wait in the outbox",
			slog.Int("attempt", attempt), slog.Duration("retry_in", wait), slog.Any("error", err))
		state.set(fmt.Sprintf("%s failed (attempt %d, next in %s): %v", what, attempt, wait, err))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
		wait = min(2*wait, brokerRetryMax)
	}
}

// reaperConfig is the reaper's configuration from cfg.
func reaperConfig(cfg config, logger *slog.Logger) reaper.Config {
	return reaper.Config{Interval: cfg.ReaperInterval, Batch: cfg.ReaperBatch, Duty: cfg.ReaperDuty, MessageRetention: cfg.MessageRetention, Logger: logger}
}
