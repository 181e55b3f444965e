// Package consumer runs an idempotent consumer of the events stream (M1,
// M3): each message's producer-assigned id (the outbox id in the
// envelope, never the stream sequence or the delivery count) goes into the
// inbox in the same transaction as the message's effect, and the message
// is acknowledged, with a double ack that waits for the server's
// confirmation, only after that transaction committed.
//
// The crash windows:
//
//   - before the commit: neither inbox row nor effect exist; the message
//     is redelivered after the ack wait and applied then;
//   - after the commit, before the ack: the redelivery finds the inbox
//     row and is acknowledged without a second effect;
//   - a redelivery while the first delivery is still running (an ack wait
//     shorter than the transaction): the inbox row's primary key makes
//     the second transaction wait and then find it.
//
// A message whose effect keeps failing is negatively acknowledged with the
// backoff until MaxDeliver; the server then gives up on it, and
// DeadLetters copies it to the dead-letter stream, logs and counts it.
//
// A transient failure (the database unreachable, a deadlock...: see
// db.IsTransient) says nothing about the message, and the server counts
// every delivery towards MaxDeliver, a redelivery after a nak included. So
// such a message is not handed back: the consumer keeps it in hand and
// retries it with a backoff, telling the server it is still working on it
// (InProgress, which restarts the ack wait without a redelivery), for as
// long as the database does not answer. A database outage of any length
// then costs no delivery, and the message is applied when the database is
// back. Only a transient failure while the database answers (a deadlock
// or a timeout every time) is handed back after a few retries in hand, so
// that one message cannot hold the consumer up for ever; and so is one in
// hand when the process stops (G4), at once, for another process to take.
package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemref/payments/internal/broker"
	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/events"
	"github.com/idemref/payments/internal/failpoint"
	"github.com/idemref/payments/internal/inbox"
	"github.com/idemref/payments/internal/tracing"
)

// Handler applies one event in tx, the transaction that also holds its
// inbox row. An error rolls both back and the message is redelivered.
type Handler func(ctx context.Context, tx pgx.Tx, ev events.Envelope) error

// Retries in hand after a transient failure: the first after
// heldRetryMin, doubling up to heldRetryMax. While the database answers,
// at most maxHeldRetries of them; then the message goes back to the
// broker's backoff like any failure.
const (
	heldRetryMin   = 100 * time.Millisecond
	heldRetryMax   = 5 * time.Second
	maxHeldRetries = 3
)

// Config describes one consumer.
type Config struct {
	// Name is the durable consumer's name and the inbox's consumer column.
	Name string
	// Subjects filters the events stream.
	Subjects []string
	Broker   broker.Config
	Logger   *slog.Logger
}

// Consumer is a running consumer.
type Consumer struct {
	pool    *pgxpool.Pool
	cfg     Config
	handle  Handler
	log     *slog.Logger
	backoff []time.Duration
	cc      jetstream.ConsumeContext
	// stopping is closed by Stop: a message held through an outage is
	// handed back instead of being retried.
	stopping chan struct{}
}

// Start creates or updates the durable consumer and starts consuming. Any
// number of processes may start the same consumer: the server splits the
// messages between them.
func Start(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream, cfg Config, handle Handler) (*Consumer, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, broker.StreamEvents, broker.ConsumerConfig(cfg.Name, cfg.Subjects, cfg.Broker))
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", cfg.Name, err)
	}
	// Present at 0 from the start, so rate() and increase() work at once.
	for _, m := range []*prometheus.CounterVec{processedTotal, duplicatesTotal, streamDuplicatesTotal, redeliveriesTotal, failuresTotal, heldRetriesTotal} {
		m.WithLabelValues(cfg.Name)
	}
	c := &Consumer{pool: pool, cfg: cfg, handle: handle, log: log.With(slog.String("consumer", cfg.Name)),
		backoff: cfg.Broker.Backoff(), stopping: make(chan struct{})}
	// One message at a time. A message held through a database outage
	// holds up the ones behind it; had the client fetched them already,
	// their ack waits would run out while they wait in its buffer, and each
	// redelivery would count towards MaxDeliver. Fetched one by one, they
	// wait on the server, undelivered.
	cc, err := cons.Consume(func(msg jetstream.Msg) { c.process(ctx, msg) }, jetstream.PullMaxMessages(1))
	if err != nil {
		return nil, fmt.Errorf("consumer %s: consume: %w", cfg.Name, err)
	}
	c.cc = cc
	return c, nil
}

// Stop stops taking messages and waits for the one in hand: it is
// finished, or, when held through a database outage, handed back for
// redelivery at once.
func (c *Consumer) Stop() {
	close(c.stopping)
	c.cc.Drain()
	<-c.cc.Closed()
}

// isStopping reports whether Stop was called.
func (c *Consumer) isStopping() bool {
	select {
	case <-c.stopping:
		return true
	default:
		return false
	}
}

// process reads one message, applies its event and settles the message
// with the broker: acked once applied, terminated when unreadable, handed
// back otherwise.
func (c *Consumer) process(ctx context.Context, msg jetstream.Msg) {
	ctx = context.WithoutCancel(ctx) // a message in hand is finished, not abandoned half-way
	md, err := msg.Metadata()
	if err != nil {
		c.log.ErrorContext(ctx, "message without JetStream metadata", slog.Any("error", err))
		return
	}
	if md.NumDelivered > 1 {
		redeliveriesTotal.WithLabelValues(c.cfg.Name).Inc()
	}
	log := c.log.With(slog.Uint64("stream_seq", md.Sequence.Stream), slog.Uint64("delivery", md.NumDelivered))

	var ev events.Envelope
	if err := json.Unmarshal(msg.Data(), &ev); err != nil || ev.ID.String() == "" || ev.SchemaVersion != events.SchemaVersion {
		log.ErrorContext(ctx, "unreadable event; terminating it for the dead-letter stream", slog.Any("error", err), slog.Int("schema_version", ev.SchemaVersion))
		_ = msg.TermWithReason("unreadable")
		return
	}
	log = log.With(slog.String("event_id", ev.ID.String()), slog.String("type", ev.Type))

	// The event's work continues the trace of the request that wrote it,
	// carried by the relay in the message's headers (X3): its inbox row,
	// its change to the order, its log lines. A message without one (an
	// untraced request, a redrive) starts a trace of its own.
	ctx, span := tracing.Tracer().Start(tracing.ExtractNATS(ctx, msg.Headers()), "consume "+ev.Type,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(semconv.MessagingSystemKey.String("nats"), semconv.MessagingDestinationName(msg.Subject()),
			semconv.MessagingMessageID(ev.ID.String()), semconv.MessagingConsumerGroupName(c.cfg.Name),
			attribute.Int64("messaging.nats.delivery", int64(min(md.NumDelivered, math.MaxInt64)))))
	defer span.End()

	duplicate, retried, err := c.applyHeld(ctx, log, msg, ev)
	if err != nil {
		span.SetStatus(codes.Error, "apply failed")
		c.handBack(ctx, log, msg, md, err)
		return
	}
	// Committed. A crash here leaves the message unacknowledged: it is
	// redelivered and the inbox row skips it (test: consumer killed after
	// commit, before ack).
	failpoint.Inject("consumer-after-commit")
	span.SetAttributes(attribute.Bool("messaging.duplicate", duplicate))
	// A second copy on the stream is a duplicate found by the first
	// attempt of a first delivery. A redelivery's is a lost ack; a
	// retry's, this delivery's own commit whose answer was lost (the
	// connection cut during COMMIT, a failover).
	c.ack(ctx, log, msg, duplicate, duplicate && md.NumDelivered == 1 && !retried)
}

// applyHeld applies ev, and holds the message in hand through transient
// failures (a database outage), kept in progress on the server, retrying
// after heldRetryMin and on (see maxHeldRetries) until it applies, the
// retries run out or Stop comes. The error is the last attempt's.
// retried says the outcome is a retry's: a duplicate found then may be
// this delivery's own earlier attempt, committed with its answer lost.
func (c *Consumer) applyHeld(ctx context.Context, log *slog.Logger, msg jetstream.Msg, ev events.Envelope) (duplicate, retried bool, err error) {
	stopProgress := c.keepInProgress(msg)
	defer stopProgress()
	duplicate, err = c.apply(ctx, ev)
	wait, answered := heldRetryMin, 0
	for db.IsTransient(err) {
		if c.databaseAnswers(ctx) {
			if answered++; answered > maxHeldRetries {
				break
			}
		}
		log.WarnContext(ctx, "apply event: transient failure; holding the event and retrying", slog.Any("error", err), slog.Duration("retry_in", wait))
		heldRetriesTotal.WithLabelValues(c.cfg.Name).Inc()
		if !c.pause(wait) {
			break
		}
		wait = min(2*wait, heldRetryMax)
		duplicate, err = c.apply(ctx, ev)
		retried = true
	}
	return duplicate, retried, err
}

// handBack settles a message whose event did not apply (err): terminated
// when unreadable, else handed back for redelivery.
func (c *Consumer) handBack(ctx context.Context, log *slog.Logger, msg jetstream.Msg, md *jetstream.MsgMetadata, err error) {
	switch {
	case errors.Is(err, events.ErrUnreadable):
		log.ErrorContext(ctx, "unreadable event; terminating it for the dead-letter stream", slog.Any("error", err))
		_ = msg.TermWithReason("unreadable")
	case c.isStopping() && db.IsTransient(err):
		// Held through a database outage when Stop came: handed back with
		// a nak without delay, so that another process takes it at once,
		// neither after the ack wait nor after the backoff. It is no
		// failure of the message: not counted as one.
		log.InfoContext(ctx, "stopping: the event held in hand is handed back for redelivery", slog.Any("error", err))
		_ = msg.Nak()
	default:
		// Nothing committed: the redelivery applies it. Nak (not waiting
		// out the ack wait) with the delay of the backoff's next step.
		delay := c.backoff[min(md.NumDelivered, uint64(len(c.backoff)))-1]
		log.WarnContext(ctx, "apply event; it will be redelivered", slog.Any("error", err), slog.Duration("delay", delay))
		failuresTotal.WithLabelValues(c.cfg.Name).Inc()
		_ = msg.NakWithDelay(delay)
	}
}

// ack counts a committed event and acknowledges its message.
func (c *Consumer) ack(ctx context.Context, log *slog.Logger, msg jetstream.Msg, duplicate, streamCopy bool) {
	if duplicate {
		duplicatesTotal.WithLabelValues(c.cfg.Name).Inc()
		if streamCopy {
			streamDuplicatesTotal.WithLabelValues(c.cfg.Name).Inc()
		}
		log.InfoContext(ctx, "duplicate event skipped")
	} else {
		processedTotal.WithLabelValues(c.cfg.Name).Inc()
	}
	// The double ack waits for the server to confirm: a lost ack is seen
	// here (and logged) rather than as a silent redelivery later, which the
	// inbox would absorb all the same.
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := msg.DoubleAck(actx); err != nil {
		log.WarnContext(ctx, "ack; the redelivery will be skipped by the inbox", slog.Any("error", err))
	}
}

// apply records the event in the inbox and applies it, in one transaction.
// duplicate reports that the inbox already had it: nothing was applied.
func (c *Consumer) apply(ctx context.Context, ev events.Envelope) (duplicate bool, err error) {
	err = db.WithTx(ctx, c.pool, func(ctx context.Context, tx pgx.Tx) error {
		fresh, err := inbox.Record(ctx, tx, ev.TenantID, c.cfg.Name, events.Source, ev.ID.String())
		if err != nil || !fresh {
			duplicate = !fresh
			return err
		}
		return c.handle(ctx, tx, ev)
	})
	return duplicate, err
}

// keepInProgress tells the server every third of the ack wait that msg is
// still being worked on, until stop is called: the server redelivers it
// only when this process is gone, never while it holds it.
func (c *Consumer) keepInProgress(msg jetstream.Msg) (stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(c.backoff[0] / 3)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				_ = msg.InProgress()
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}

// databaseAnswers reports whether the database answers a ping within a
// second.
func (c *Consumer) databaseAnswers(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return c.pool.Ping(ctx) == nil
}

// pause waits d, and reports false when Stop cut it short.
func (c *Consumer) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.stopping:
		return false
	}
}
