package outbox

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/failpoint"
	"github.com/idemref/payments/internal/tracing"
)

// Defaults for RelayConfig.
const (
	DefaultBatch          = 100
	DefaultClaimHold      = 30 * time.Second
	DefaultPollInterval   = time.Second
	DefaultPublishTimeout = 5 * time.Second
)

// channel is the LISTEN/NOTIFY channel the outbox trigger notifies.
const channel = "outbox"

// heldBackRetry is how soon a relay looks again when rows are waiting that
// it could not claim: held back by the snapshot guard (an older
// transaction, anywhere in the cluster, is still running) or claimed by
// another relay. Their release sends no notification.
const heldBackRetry = 100 * time.Millisecond

// RelayConfig tunes a Relay; zero fields take the defaults.
type RelayConfig struct {
	// Batch is the most rows one claim takes.
	Batch int
	// ClaimHold is how long claimed rows are kept from other relays; a
	// relay that dies leaves its rows to the others after it. A batch
	// publishes for at most four fifths of it (see RelayOnce). The
	// stream's duplicates window must be longer than ClaimHold plus
	// PublishTimeout, so that the republish of a row whose mark was lost
	// still lands within it.
	ClaimHold time.Duration
	// PollInterval is how often the relay looks without a notification:
	// the fallback when a NOTIFY was missed (its connection was down).
	PollInterval time.Duration
	// PublishTimeout bounds the wait for one publish acknowledgement.
	PublishTimeout time.Duration
	// ListenPool is where the relay's LISTEN connection comes from. It
	// must reach PostgreSQL directly (D3): a pooler in transaction mode
	// hands each transaction to any server connection, so a LISTEN there
	// hears nothing. Nil: the relay's own pool.
	ListenPool *pgxpool.Pool
	// Report, when set, is told after every drain whether it failed: the
	// error that cut it short (a publish the broker did not acknowledge,
	// the database), or nil. It runs in the relay's goroutine.
	Report func(err error)
	Logger *slog.Logger
}

// Relay publishes outbox rows to JetStream. Any number may run, in one
// process or many: claims skip each other's rows.
type Relay struct {
	pool *pgxpool.Pool
	js   jetstream.JetStream
	cfg  RelayConfig
	log  *slog.Logger
}

// NewRelay returns a relay publishing pool's outbox through js.
func NewRelay(pool *pgxpool.Pool, js jetstream.JetStream, cfg RelayConfig) *Relay {
	if cfg.Batch <= 0 {
		cfg.Batch = DefaultBatch
	}
	if cfg.ClaimHold <= 0 {
		cfg.ClaimHold = DefaultClaimHold
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.PublishTimeout <= 0 {
		cfg.PublishTimeout = DefaultPublishTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Relay{pool: pool, js: js, cfg: cfg, log: log}
}

// Run relays until ctx is done: it drains the outbox, then waits for a
// notification or the poll interval, and again.
func (r *Relay) Run(ctx context.Context) {
	for ctx.Err() == nil {
		r.listen(ctx)
		if ctx.Err() == nil {
			// The listening connection failed: poll until it is back.
			if r.drain(ctx) {
				sleep(ctx, heldBackRetry)
			} else {
				sleep(ctx, r.cfg.PollInterval)
			}
		}
	}
}

// listen holds one connection that LISTENs, and drains the outbox on every
// notification and every poll interval until ctx is done or the
// connection fails.
func (r *Relay) listen(ctx context.Context) {
	listenPool := r.pool
	if r.cfg.ListenPool != nil {
		listenPool = r.cfg.ListenPool
	}
	conn, err := listenPool.Acquire(ctx)
	if err != nil {
		r.log.WarnContext(ctx, "relay: acquire a connection to listen", slog.Any("error", err))
		return
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
		r.log.WarnContext(ctx, "relay: listen", slog.Any("error", err))
		return
	}
	// A connection that listened goes back to the pool unlistened, so no
	// other user of it gets notifications it does not expect.
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "UNLISTEN "+channel) }()
	for {
		// Listening first, draining second: a row committed meanwhile
		// either is seen by this drain or notifies the wait below.
		timeout := r.cfg.PollInterval
		if r.drain(ctx) {
			timeout = min(timeout, heldBackRetry)
		}
		wait, cancel := context.WithTimeout(ctx, timeout)
		_, err := conn.Conn().WaitForNotification(wait)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !errors.Is(err, context.DeadlineExceeded):
			r.log.WarnContext(ctx, "relay: wait for a notification", slog.Any("error", err))
			return
		}
	}
}

// drain relays batches until the outbox has nothing claimable, or a batch
// fails. It reports whether unpublished rows remain that it could not
// claim or publish.
func (r *Relay) drain(ctx context.Context) (pending bool) {
	for ctx.Err() == nil {
		n, err := r.RelayOnce(ctx)
		if err != nil {
			if ctx.Err() == nil {
				r.log.WarnContext(ctx, "relay: publish batch", slog.Any("error", err))
			}
			// Observed on a failure too: during a publish outage is when
			// the lag grows, and the alerts on it must see it grow.
			r.observeLag(ctx)
			r.report(ctx, err)
			return true
		}
		if n < r.cfg.Batch {
			r.report(ctx, nil)
			return r.observeLag(ctx)
		}
	}
	return false
}

// report passes a drain's outcome to RelayConfig.Report, unless the relay
// is stopping: what a stop cuts short says nothing about the broker.
func (r *Relay) report(ctx context.Context, err error) {
	if r.cfg.Report != nil && ctx.Err() == nil {
		r.cfg.Report(err)
	}
}

// RelayOnce claims one batch, publishes it in seq order, waiting for each
// acknowledgement, and marks what was acknowledged published. It returns
// how many rows it published.
//
// The batch publishes only while its claim holds. Once the claim lapses
// another relay may claim the same rows and publish them too: the same
// rows from two relays at once, republished and interleaved out of seq
// order on the stream. A claim is not renewed; instead the batch stops
// publishing a fifth of ClaimHold before the claim ends (the last publish
// is cut short there too), which leaves that fifth to mark what was
// acknowledged, and releases the rest for the next claim, which takes them
// in seq order. With fast publishes a batch ends long before; with slow
// ones (up to PublishTimeout each) it is cut.
//
// When ctx ends (the relay is stopping) the batch stops publishing
// there too: what the broker acknowledged is marked, and the rest is
// handed back at once, so another relay publishes it without waiting for
// the claim to run out.
func (r *Relay) RelayOnce(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	q := dbsqlc.New(r.pool)
	// Taken before the claim is sent, so the batch's deadline falls no
	// later than the claim's: the claim's clock starts later.
	deadline := time.Now().Add(r.cfg.ClaimHold - r.cfg.ClaimHold/5)
	// A stop does not cancel the claim half-way: a claim that committed
	// while its answer was lost would keep its rows from every relay for
	// ClaimHold. The stop is seen before the first publish instead, and
	// the batch handed back. (A database that does not answer still ends
	// the claim, after the fifth of ClaimHold a batch keeps for its marks.)
	claimCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.ClaimHold/5)
	rows, err := q.OutboxClaim(claimCtx, dbsqlc.OutboxClaimParams{HoldSeconds: r.cfg.ClaimHold.Seconds(), MaxRows: db.Int32(r.cfg.Batch)})
	cancel()
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	// RETURNING gives no order; publish in the outbox's.
	slices.SortFunc(rows, func(a, b dbsqlc.OutboxClaimRow) int { return cmp.Compare(*a.Seq, *b.Seq) })
	acked := make([]uuid.UUID, 0, len(rows))
	var pubErr error
	for _, row := range rows {
		if ctx.Err() != nil || !time.Now().Before(deadline) {
			break
		}
		if pubErr = r.publish(ctx, row, deadline); pubErr != nil {
			break
		}
		acked = append(acked, row.ID)
	}
	stopping := ctx.Err()
	// The broker has the messages; the rows do not say so yet. A crash
	// here publishes them again after ClaimHold (test: relay killed after
	// publish).
	failpoint.Inject("relay-after-publish")
	ctx = context.WithoutCancel(ctx) // what the broker acknowledged is recorded even while stopping
	if len(acked) > 0 {
		if _, err := q.OutboxMarkPublished(ctx, acked); err != nil {
			return 0, err
		}
	}
	if len(acked) < len(rows) {
		// One claim, one claimed_until for all its rows: the release's
		// fencing token.
		if err := q.OutboxRelease(ctx, dbsqlc.OutboxReleaseParams{Ids: ids(rows[len(acked):]), ClaimedUntil: rows[0].ClaimedUntil}); err != nil {
			r.log.WarnContext(ctx, "relay: release unpublished rows", slog.Any("error", err))
		}
	}
	switch {
	case stopping != nil:
		return len(acked), stopping
	case pubErr != nil:
		publishErrorsTotal.Inc()
		return len(acked), pubErr
	}
	return len(acked), nil
}

// publish sends one row and waits for the stream's acknowledgement, for
// at most PublishTimeout and never past deadline. The message id is the
// outbox id, so the stream drops a second publish of the row within its
// duplicates window.
func (r *Relay) publish(ctx context.Context, row dbsqlc.OutboxClaimRow, deadline time.Time) error {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, r.cfg.PublishTimeout)
	defer cancel()
	msg := &nats.Msg{Subject: row.Subject, Data: row.Payload, Header: nats.Header{}}
	msg.Header.Set("Event-Type", row.EventType)
	// The publish is a span of the trace the row was written in, and the
	// message carries it on (traceparent): the consumer continues it. A
	// row written outside a trace starts none here.
	if row.TraceParent != nil {
		var span trace.Span
		ctx, span = tracing.Tracer().Start(tracing.WithTraceparent(ctx, *row.TraceParent), "outbox.publish "+row.Subject,
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(semconv.MessagingSystemKey.String("nats"), semconv.MessagingDestinationName(row.Subject), semconv.MessagingMessageID(row.ID.String())))
		defer span.End()
		tracing.InjectNATS(ctx, msg.Header)
	}
	ack, err := r.js.PublishMsg(ctx, msg, jetstream.WithMsgID(row.ID.String()))
	if err != nil {
		trace.SpanFromContext(ctx).SetStatus(codes.Error, "publish failed")
		return err
	}
	if ack.Duplicate {
		duplicatesDroppedTotal.Inc()
	}
	publishedTotal.Inc()
	return nil
}

// observeLag updates the lag gauges and reports whether rows are waiting.
func (r *Relay) observeLag(ctx context.Context) bool {
	lag, err := dbsqlc.New(r.pool).OutboxLag(ctx)
	if err != nil {
		return false
	}
	unpublishedRows.Set(float64(lag.Unpublished))
	lagSeconds.Set(lag.OldestSeconds)
	return lag.Unpublished > 0
}

func ids(rows []dbsqlc.OutboxClaimRow) []uuid.UUID {
	out := make([]uuid.UUID, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
