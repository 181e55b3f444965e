// Package messaging runs a process's event workers beside its HTTP server:
// the outbox relay, the consumers and the dead-letter handler (M1-M3). It
// owns what keeps them running without the broker: a broker that is down
// when the process starts, or goes away later, stops no payment (their
// events wait in the outbox); the workers connect, set the streams up and
// start in the background, retrying each step with a backoff, and State
// says why events do not flow meanwhile.
package messaging

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemref/payments/internal/broker"
	"github.com/idemref/payments/internal/consumer"
	"github.com/idemref/payments/internal/outbox"
)

// The wait between two attempts to reach the broker or set it up: the
// first after retryMin, doubling up to retryMax, for as long as it takes.
const (
	retryMin = 250 * time.Millisecond
	retryMax = 10 * time.Second
)

var brokerConnected = prometheus.NewGauge(prometheus.GaugeOpts{
	Name: "payments_events_broker_connected",
	Help: "1 while this process is connected to NATS, its streams in place, relaying the outbox and consuming events; 0 while it is connecting or reconnecting (payments are served all the same; their events wait in the outbox).",
})

// registerBrokerConnected registers the gauge in the processes that run
// the event workers only: one that leaves them to other processes has no
// connection to report, and a 0 from it would read as an outage.
var registerBrokerConnected sync.Once

// State is whether this process's events flow, for /readyz and the
// payments_events_broker_connected gauge.
type State struct {
	mu     sync.Mutex
	detail string // why events do not flow; "" when they do
}

// NewState returns the state of a process that runs the event workers
// and has not reached the broker yet.
func NewState() *State {
	registerBrokerConnected.Do(func() { prometheus.MustRegister(brokerConnected) })
	s := &State{}
	s.set("connecting to the broker")
	return s
}

// set records the state: detail says why events do not flow, "" that they
// do.
func (s *State) set(detail string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.detail = detail
	if detail == "" {
		brokerConnected.Set(1)
	} else {
		brokerConnected.Set(0)
	}
}

// Status is httpapi.Config.Events: whether events flow and, when they do
// not, why.
func (s *State) Status() (flowing bool, detail string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.detail == "", s.detail
}

// Config is what the workers need.
type Config struct {
	// Pool runs the relay's and the consumers' transactions; ListenPool
	// reaches PostgreSQL without a transaction-mode pooler, for the
	// relay's LISTEN (D3).
	Pool, ListenPool *pgxpool.Pool
	// NatsURL is the broker; Broker the streams' and consumers' settings.
	NatsURL string
	Broker  broker.Config
	// OutboxClaimHold is how long a relay's claim on outbox rows lasts.
	OutboxClaimHold time.Duration
	// Consumer is the one consumer this process runs (its name, subjects
	// and handler; the domain's).
	Consumer Consumer
	Logger   *slog.Logger
	// State reports, as the workers go, whether events flow.
	State *State
}

// Consumer names a durable consumer and the handler that applies its
// events.
type Consumer struct {
	Name     string
	Subjects []string
	Apply    consumer.Handler
}

// Start runs the outbox relay, the consumer and the dead-letter handler
// until ctx is done or stop is called. Every API process runs all three:
// relays claim rows with SKIP LOCKED and the durable consumer splits
// messages between processes, so adding processes adds throughput, not
// duplicates.
//
// Start returns at once; in the background it connects to the broker,
// creates or updates the streams and the consumer, and only then starts
// the three, retrying each step with a backoff and reporting in State why
// events do not flow yet. Once connected, the client reconnects by itself,
// and State follows it. stop ends what runs, in order, each at a safe
// point (G4): the relay, which marks what the broker acknowledged and
// hands the rest of its claimed batch back for any relay to publish at
// once; the consumer, which finishes the message in hand, or hands one
// held through a database outage back for redelivery at once; the
// connection. Or it ends the attempts to connect. It returns once all of
// them have ended.
func Start(ctx context.Context, cfg Config) (stop func()) {
	if window, needed := cfg.Broker.DuplicateWindow, cfg.OutboxClaimHold+outbox.DefaultPublishTimeout; window < needed {
		cfg.Logger.Warn("EVENTS_DUPLICATE_WINDOW is shorter than OUTBOX_CLAIM_HOLD plus the publish timeout: a row republished after a relay crash reaches the consumers, whose inboxes drop it",
			slog.Duration("window", window), slog.Duration("needed", needed))
	}
	// The consumer's series exist from the start, broker or not, so the
	// alerts on them see their first increase.
	consumer.InitMetrics(cfg.Consumer.Name)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx, cfg)
	}()
	return func() {
		cancel()
		<-done
	}
}

// run is Start's background work, until ctx is done.
func run(ctx context.Context, cfg Config) {
	logger, state := cfg.Logger, cfg.State
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
	if !retry(ctx, cfg, "connect to the broker", connect) {
		return
	}
	defer nc.Close()
	if !retry(ctx, cfg, "create or update the streams", func() error { return broker.Ensure(ctx, js, cfg.Broker) }) {
		return
	}
	var cons *consumer.Consumer
	if !retry(ctx, cfg, "start the "+cfg.Consumer.Name+" consumer", func() (err error) {
		cons, err = consumer.Start(ctx, cfg.Pool, js, consumer.Config{
			Name: cfg.Consumer.Name, Subjects: cfg.Consumer.Subjects, Broker: cfg.Broker, Logger: logger,
		}, cfg.Consumer.Apply)
		return err
	}) {
		return
	}
	defer cons.Stop()
	var dead *consumer.DeadLetters
	if !retry(ctx, cfg, "subscribe to the dead-letter advisories", func() (err error) {
		dead, err = consumer.StartDeadLetters(nc, js, logger)
		return err
	}) {
		return
	}
	defer dead.Stop()

	relayDone := make(chan struct{})
	relay := outbox.NewRelay(cfg.Pool, js, outbox.RelayConfig{ClaimHold: cfg.OutboxClaimHold, ListenPool: cfg.ListenPool, Logger: logger})
	go func() {
		defer close(relayDone)
		relay.Run(ctx)
	}()
	running.Store(true)
	state.set("")
	logger.Info("messaging running", slog.String("nats_url", RedactURL(cfg.NatsURL)), slog.String("stream", broker.StreamEvents), slog.Int("replicas", cfg.Broker.Replicas),
		slog.String("consumer", cfg.Consumer.Name), slog.Duration("duplicate_window", cfg.Broker.DuplicateWindow),
		slog.Duration("redelivery_horizon", cfg.Broker.RedeliveryHorizon()))
	<-ctx.Done()
	running.Store(false)
	<-relayDone
	// Deferred, in this order: the dead letters, the consumer, the
	// connection.
}

// retry runs step until it succeeds, waiting retryMin, doubling up to
// retryMax, between attempts; each failure is logged and is why the state
// says events do not flow. It reports false when ctx ended first.
func retry(ctx context.Context, cfg Config, what string, step func() error) bool {
	wait := retryMin
	for attempt := 1; ; attempt++ {
		err := step()
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		cfg.Logger.Warn("messaging: "+what+" failed; payments are served, their events wait in the outbox",
			slog.Int("attempt", attempt), slog.Duration("retry_in", wait), slog.Any("error", err))
		cfg.State.set(fmt.Sprintf("%s failed (attempt %d, next in %s): %v", what, attempt, wait, err))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
		wait = min(2*wait, retryMax)
	}
}

// RedactURL masks a URL's credentials, for logs (R8), in each URL of a
// comma-separated list such as NATS_URL: the password, or the user when
// it is alone, which NATS reads as a token (nats://token@host).
func RedactURL(raw string) string {
	urls := strings.Split(raw, ",")
	for i, s := range urls {
		u, err := url.Parse(strings.TrimSpace(s))
		if err != nil {
			return "(unparsable URL)"
		}
		if _, hasPassword := u.User.Password(); u.User != nil && !hasPassword {
			u.User = url.User("xxxxx")
		}
		urls[i] = u.Redacted()
	}
	return strings.Join(urls, ",")
}
