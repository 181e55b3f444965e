// Package messaging runs a process's event workers beside its HTTP server:
// the outbox relay, the consumers and the dead-letter handler (M1-M3). It
// owns what keeps them running without the broker: a broker that is down
// when the process starts, or goes away later, stops no payment (their
// events wait in the outbox); the workers connect, set the streams up and
// start in the background, retrying each step with a backoff, and State
// says why events do not flow meanwhile. A broker that lost its storage
// is set up again while the process runs (D7), and one too old for the
// consumers' configuration is refused.
package messaging

import (
	"context"
	"errors"
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

// checkEvery is how often the workers ask the broker whether it still
// has the streams and the consumer; checkTimeout bounds one check.
const (
	checkEvery   = 5 * time.Second
	checkTimeout = 5 * time.Second
)

var (
	brokerConnected = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "payments_events_broker_connected",
		Help: "1 while this process's events flow: connected to NATS, its streams and consumer in place, the outbox relayed; 0 while it connects or reconnects, sets the streams up again after the broker lost them, or its publishes fail (payments are served all the same; their events wait in the outbox).",
	})
	brokerRecreatedTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "payments_events_broker_recreated_total",
		Help: "Times this process found a stream or its consumer missing on the broker after it had set them up (a broker restarted on empty storage) and set them up again; the events the lost stream held are published again from the outbox.",
	})
)

// registerBrokerMetrics registers the broker's metrics in the processes
// that run the event workers only: one that leaves them to other
// processes has no connection to report, and a 0 from it would read as an
// outage.
var registerBrokerMetrics sync.Once

// State is whether this process's events flow, for /readyz and the
// payments_events_broker_connected gauge.
type State struct {
	mu sync.Mutex
	// broker says why the broker cannot take events (connecting, the
	// connection lost, a stream missing); relay why the outbox relay's
	// last drain failed. "" when nothing is wrong.
	broker, relay string
	// refused is the refusal of a broker this build cannot work with.
	refused error
}

// NewState returns the state of a process that runs the event workers
// and has not reached the broker yet.
func NewState() *State {
	registerBrokerMetrics.Do(func() { prometheus.MustRegister(brokerConnected, brokerRecreatedTotal) })
	s := &State{}
	s.set("connecting to the broker")
	return s
}

// set records why the broker cannot take events, "" that it can.
func (s *State) set(detail string) { s.update(func() { s.broker = detail }) }

// setRelay records why the relay's last drain failed, "" that it did not.
func (s *State) setRelay(detail string) { s.update(func() { s.relay = detail }) }

// refuse records that the broker is refused (err), or no longer (nil).
func (s *State) refuse(err error) { s.update(func() { s.refused = err }) }

// update applies change and brings the gauge in line.
func (s *State) update(change func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	change()
	if s.broker == "" && s.relay == "" {
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
	var why []string
	for _, d := range []string{s.broker, s.relay} {
		if d != "" {
			why = append(why, d)
		}
	}
	return len(why) == 0, strings.Join(why, "; ")
}

// Refused is httpapi.Config.BrokerRefused: why the broker is refused, nil
// while it is not. A broker outage is no refusal: the process serves
// payments without the broker. A broker too old for the configuration is
// a deployment's mistake that no retry mends, and the process says it is
// not ready, so that a rollout onto it stops.
func (s *State) Refused() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused
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
// and State follows it. While they run, the workers check that the broker
// still has the streams and the consumer, and set them up again when it
// lost them: see watch. stop ends what runs, in order, each at a safe
// point: the relay, which marks what the broker acknowledged and
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

// session is Start's background work: the connection and what runs on it.
type session struct {
	cfg  Config
	nc   *nats.Conn
	js   jetstream.JetStream
	cons *consumer.Consumer // nil between a stop and a start
	// requeue: the events stream was found missing, and the outbox's
	// events it held are still to be handed back to the relay; once they
	// were, requeueAgain is when to do it a second time (see requeue).
	requeue      bool
	requeueAgain time.Time
	// checks asks watch for a check at once.
	checks chan struct{}
	// running: everything runs; the connection's handlers report from
	// then on (before, the attempts report their own failures).
	running atomic.Bool
}

// run is Start's background work, until ctx is done.
func run(ctx context.Context, cfg Config) {
	s := &session{cfg: cfg, checks: make(chan struct{}, 1)}
	if !retry(ctx, cfg, "connect to the broker", s.connect) {
		return
	}
	defer s.nc.Close()
	// The streams and the consumer as one step: a consumer that cannot be
	// created because the stream went away meanwhile needs the stream
	// created again, not only itself retried.
	if !retry(ctx, cfg, "set up the streams and the "+cfg.Consumer.Name+" consumer", func() error { return s.setUp(ctx) }) {
		return
	}
	defer func() { s.stopConsumer() }()
	var dead *consumer.DeadLetters
	if !retry(ctx, cfg, "subscribe to the dead-letter advisories", func() (err error) {
		dead, err = consumer.StartDeadLetters(s.nc, s.js, cfg.Logger)
		return err
	}) {
		return
	}
	defer dead.Stop()

	relayDone := make(chan struct{})
	relay := outbox.NewRelay(cfg.Pool, s.js, outbox.RelayConfig{ClaimHold: cfg.OutboxClaimHold, ListenPool: cfg.ListenPool, Logger: cfg.Logger, Report: s.relayed})
	go func() {
		defer close(relayDone)
		relay.Run(ctx)
	}()
	s.running.Store(true)
	cfg.State.set("")
	cfg.Logger.Info("messaging running", slog.String("nats_url", RedactURL(cfg.NatsURL)), slog.String("nats_server", s.nc.ConnectedServerVersion()),
		slog.String("stream", broker.StreamEvents), slog.Int("replicas", cfg.Broker.Replicas),
		slog.String("consumer", cfg.Consumer.Name), slog.Duration("duplicate_window", cfg.Broker.DuplicateWindow),
		slog.Duration("redelivery_horizon", cfg.Broker.RedeliveryHorizon()))
	s.watch(ctx)
	s.running.Store(false)
	<-relayDone
	// Deferred, in this order: the dead letters, the consumer, the
	// connection.
}

// connect connects to the broker, with handlers that follow the
// connection. A broker this build refuses (broker.ErrServerTooOld) is
// recorded as such in the state.
func (s *session) connect() (err error) {
	logger, state := s.cfg.Logger, s.cfg.State
	s.nc, s.js, err = broker.Connect(s.cfg.NatsURL, "payments-api",
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if s.running.Load() {
				logger.Warn("lost the connection to the broker; reconnecting", slog.Any("error", err))
				state.set(fmt.Sprintf("lost the connection to the broker, reconnecting: %v", err))
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			if !s.running.Load() {
				return
			}
			// The server that answered may be another one than before:
			// one restarted on empty storage, or an older one.
			if err := broker.CheckServerVersion(nc.ConnectedServerVersion()); err != nil {
				logger.Error("reconnected to a broker this build refuses", slog.Any("error", err))
				state.refuse(err)
				state.set(err.Error())
				return
			}
			state.refuse(nil)
			logger.Info("reconnected to the broker; checking its streams and consumer")
			state.set("reconnected to the broker; checking its streams and consumer")
			s.checkNow()
		}))
	if errors.Is(err, broker.ErrServerTooOld) {
		state.refuse(err)
	} else {
		state.refuse(nil)
	}
	return err
}

// setUp creates or updates the streams and the consumer, and starts
// consuming anew. When the events stream was missing, the broker lost what
// it held: the outbox's events the consumer had not applied are handed
// back to the relay, to be published again (outbox.Requeue).
func (s *session) setUp(ctx context.Context) error {
	if _, err := s.js.Stream(ctx, broker.StreamEvents); errors.Is(err, jetstream.ErrStreamNotFound) {
		s.requeue = true
	} else if err != nil {
		return fmt.Errorf("broker: stream %s: %w", broker.StreamEvents, err)
	}
	if err := broker.Ensure(ctx, s.js, s.cfg.Broker); err != nil {
		return err
	}
	if s.requeue {
		if err := s.requeueLost(ctx); err != nil {
			return err
		}
		s.requeue = false
		s.requeueAgain = time.Now().Add(s.cfg.OutboxClaimHold)
	}
	// A consume of a consumer the broker lost may never deliver again:
	// it is replaced.
	s.stopConsumer()
	cons, err := consumer.Start(ctx, s.cfg.Pool, s.js, consumer.Config{
		Name: s.cfg.Consumer.Name, Subjects: s.cfg.Consumer.Subjects, Broker: s.cfg.Broker, Logger: s.cfg.Logger,
	}, s.cfg.Consumer.Apply)
	if err != nil {
		return err
	}
	s.cons = cons
	return nil
}

// requeueLost hands the events the lost stream held back to the relay
// (outbox.Requeue). It is done twice: when the stream is found missing,
// and once more OutboxClaimHold later. A relay, of any process, marks the
// rows the old stream acknowledged only once its batch ends, which may be
// after the first pass (a publish that never gets its acknowledgement
// holds the batch up to its deadline); it ends within its claim, which was
// taken before the stream was lost, so the second pass finds them marked.
func (s *session) requeueLost(ctx context.Context) error {
	n, err := outbox.Requeue(ctx, s.cfg.Pool, s.cfg.Consumer.Name, s.cfg.Consumer.Subjects)
	if err != nil {
		return fmt.Errorf("requeue the events the lost stream held: %w", err)
	}
	level := slog.LevelInfo // a first start finds no stream, and nothing to requeue
	if n > 0 {
		level = slog.LevelWarn
	}
	s.cfg.Logger.Log(ctx, level, "the events stream was missing: the published events the consumer had not applied are handed back to the relay",
		slog.String("consumer", s.cfg.Consumer.Name), slog.Int64("events", n))
	return nil
}

// stopConsumer stops the consumer, if one runs.
func (s *session) stopConsumer() {
	if s.cons != nil {
		s.cons.Stop()
		s.cons = nil
	}
}

// watch checks, every checkEvery and at once when asked (checkNow), that
// the broker still has the streams and the consumer, until ctx is done.
// When it lacks one (a broker restarted on empty storage, D7) it sets them
// up again, as at the start: publishes fail and nothing is consumed until
// then, and no restart of the process would otherwise mend it.
func (s *session) watch(ctx context.Context) {
	t := time.NewTicker(checkEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.checks:
		}
		if !s.requeueAgain.IsZero() && time.Now().After(s.requeueAgain) {
			if err := s.requeueLost(ctx); err != nil {
				s.cfg.Logger.Warn("messaging: requeue failed; trying again at the next check", slog.Any("error", err))
			} else {
				s.requeueAgain = time.Time{}
			}
		}
		checkCtx, cancel := context.WithTimeout(ctx, checkTimeout)
		what, err := broker.Missing(checkCtx, s.js, s.cfg.Consumer.Name)
		cancel()
		switch {
		case err != nil:
			// Unknown (the broker unreachable, which the connection's
			// handlers report, or a leader being elected): next time.
			continue
		case what == "":
			// A reconnection waits for this check to say events flow.
			if s.nc.IsConnected() {
				s.cfg.State.set("")
			}
			continue
		}
		brokerRecreatedTotal.Inc()
		s.cfg.Logger.Warn("messaging: the broker lacks " + what + " (restarted on empty storage?): setting the streams and the consumer up again; payments are served, their events wait in the outbox")
		s.cfg.State.set("the broker lacks " + what + "; setting the streams and the consumer up again")
		if !retry(ctx, s.cfg, "set up the streams and the "+s.cfg.Consumer.Name+" consumer again", func() error { return s.setUp(ctx) }) {
			return
		}
		s.cfg.Logger.Info("messaging: the streams and the consumer are set up again")
		s.cfg.State.set("")
	}
}

// checkNow asks watch for a check at once.
func (s *session) checkNow() {
	select {
	case s.checks <- struct{}{}:
	default: // one is asked for already
	}
}

// relayed is the relay's report of each drain. A publish that finds no
// stream (no responders: the broker restarted on empty storage) asks for
// a check at once, not at the next tick.
func (s *session) relayed(err error) {
	if err == nil {
		s.cfg.State.setRelay("")
		return
	}
	s.cfg.State.setRelay(fmt.Sprintf("relaying the outbox fails: %v", err))
	if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, jetstream.ErrStreamNotFound) {
		s.checkNow()
	}
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
