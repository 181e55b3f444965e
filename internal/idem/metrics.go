package idem

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemref/payments/internal/tracing"
)

// Metrics of the idempotency layer (X1), served at /metrics. Labels are
// bounded: endpoint is a route template ("POST /v1/orders"), never a key or
// a tenant.
var (
	requestsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idempotency_requests_total",
		Help: "Idempotent requests by endpoint and outcome: executed, replayed, takeover (a multi-step key resumed by a retry), in_progress (409), conflicting_write (409: a lock wait on another request's write, nothing kept), mismatch (422), result_expired (409), released_transient (503, nothing kept), rejected_before_claim (invalid key or body, nothing recorded), failed (other error).",
	}, []string{"endpoint", "outcome"})
	leaseTakeoversTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idempotency_lease_takeovers_total",
		Help: "Multi-step keys whose expired or released lease was taken over, by a client's retry or by the completer.",
	}, []string{"endpoint"})
	fencingRejectionsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idempotency_fencing_rejections_total",
		Help: "Phases refused because another attempt took the lease over (ErrLeaseLost): the stale attempt wrote nothing.",
	}, []string{"endpoint"})
	lockWaitSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "idempotency_lock_wait_seconds",
		Help:    "Time the key claim took (the completed record's insert with its COMMIT, or a multi-step key's INSERT ... ON CONFLICT and, for a takeover, the row lock); long ones waited on another request's uncommitted claim, bounded by the lock timeout.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2, 5},
	}, []string{"endpoint"})
	replayAgeSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "idempotency_replay_age_seconds",
		Help: "Age of the record a replay answered with (now - created_at).",
		// 1 s to 3 days: a client's immediate retry up to the key retention.
		Buckets: []float64{1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 2 * 86400, 3 * 86400},
	})
)

func init() {
	prometheus.MustRegister(requestsTotal, leaseTakeoversTotal, fencingRejectionsTotal, lockWaitSeconds, replayAgeSeconds)
}

// Outcomes of idempotency_requests_total.
const (
	outcomeExecuted          = "executed"
	outcomeReplayed          = "replayed"
	outcomeTakeover          = "takeover"
	outcomeInProgress        = "in_progress"
	outcomeMismatch          = "mismatch"
	outcomeResultExpired     = "result_expired"
	outcomeReleasedTransient = "released_transient"
	outcomeFailed            = "failed"
	outcomeRejected          = "rejected_before_claim"
	outcomeBudgetExceeded    = "budget_exceeded"
	outcomeConflictingWrite  = "conflicting_write"
)

// CountRejectedBeforeClaim counts a request refused before its key was
// claimed (an invalid key or body): nothing was recorded. The span of
// ctx (the request's) gets the outcome, with the key's hash when the key
// itself was valid (key "" when it was not).
func CountRejectedBeforeClaim(ctx context.Context, endpoint, key string) {
	requestsTotal.WithLabelValues(endpoint, outcomeRejected).Inc()
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		if key != "" {
			tracing.Idempotency(span, endpoint, key)
		} else {
			span.SetAttributes(tracing.AttrEndpoint.String(endpoint))
		}
		tracing.Outcome(span, outcomeRejected, false)
	}
}

// countOutcome counts one Execute or Begin call; err is the error it
// returns (already wrapped). It returns the outcome it counted, for the
// spans (traceOutcome).
func countOutcome(endpoint string, err error, replayed, takenOver bool, createdAt time.Time) string {
	outcome := outcomeExecuted
	switch {
	case err == nil && replayed:
		outcome = outcomeReplayed
		if !createdAt.IsZero() {
			replayAgeSeconds.Observe(max(time.Since(createdAt).Seconds(), 0))
		}
	case err == nil && takenOver:
		outcome = outcomeTakeover
	case err == nil:
	case errors.Is(err, ErrKeyInUse):
		outcome = outcomeInProgress
	case errors.Is(err, ErrConflictingWrite):
		outcome = outcomeConflictingWrite
	case errors.Is(err, ErrKeyReused):
		outcome = outcomeMismatch
	case errors.Is(err, ErrResultExpired):
		outcome = outcomeResultExpired
	case errors.Is(err, ErrUnavailable):
		outcome = outcomeReleasedTransient
	case errors.Is(err, ErrKeyBudgetExceeded):
		outcome = outcomeBudgetExceeded
	default:
		outcome = outcomeFailed
	}
	requestsTotal.WithLabelValues(endpoint, outcome).Inc()
	return outcome
}

// observeLockWait records how long a claim or row lock took.
func observeLockWait(endpoint string, start time.Time) {
	lockWaitSeconds.WithLabelValues(endpoint).Observe(time.Since(start).Seconds())
}

// keyStatsQuery reads the gauges of KeyStatsCollector in one statement,
// each part along an index: the unfinished multi-step keys along
// idempotency_keys_expired_lease_idx (a partial index holding only them:
// one-transaction keys are never committed in progress), the oldest
// completed expires_at along idempotency_keys_expires_at_idx and the
// oldest retain_until along idempotency_keys_retain_until_idx. Ages are on
// the database clock.
const keyStatsQuery = `
SELECT
    (SELECT count(*) FROM idempotency_keys
      WHERE state = 'in_progress' AND recovery_point IS NOT NULL),
    (SELECT count(*) FROM idempotency_keys
      WHERE state = 'in_progress' AND recovery_point IS NOT NULL AND idem_passed(locked_until)),
    COALESCE((SELECT extract(epoch FROM now() - min(created_at))::float8 FROM idempotency_keys
      WHERE state = 'in_progress' AND recovery_point IS NOT NULL), 0),
    COALESCE((SELECT greatest(extract(epoch FROM now() - min(expires_at)), 0)::float8 FROM idempotency_keys
      WHERE state = 'completed'), 0),
    COALESCE((SELECT greatest(extract(epoch FROM now() - min(retain_until)), 0)::float8 FROM idempotency_keys
      WHERE state <> 'in_progress'), 0)`

var (
	inProgressDesc = prometheus.NewDesc("idempotency_in_progress_keys",
		"Committed multi-step keys not finished yet.", nil, nil)
	expiredLeasesDesc = prometheus.NewDesc("idempotency_expired_leases",
		"Unfinished multi-step keys whose lease has expired: the completer's backlog.", nil, nil)
	oldestInProgressDesc = prometheus.NewDesc("idempotency_oldest_in_progress_seconds",
		"Age of the oldest unfinished multi-step key (0 when none).", nil, nil)
	reaperBacklogDesc = prometheus.NewDesc("idempotency_reaper_backlog_seconds",
		"How long the oldest row due for the reaper has been due: action=prune (completed past expires_at), action=delete (past retain_until; 0 when none).", []string{"action"}, nil)
	keyStatsUpDesc = prometheus.NewDesc("idempotency_key_stats_up",
		"1 if the last read of the idempotency key gauges succeeded, else 0 (the gauges are then absent).", nil, nil)
)

// keyStats exports gauges read from idempotency_keys at each scrape with
// one short, indexed query. A failed read exports only
// idempotency_key_stats_up 0, so /metrics keeps working while the database
// is down.
type keyStats struct {
	mu   sync.Mutex
	pool *pgxpool.Pool
	log  *slog.Logger
}

// keyStatsTimeout bounds the query of one scrape.
const keyStatsTimeout = 2 * time.Second

var (
	keyStatsMu         sync.Mutex
	keyStatsRegistered *keyStats
)

// RegisterKeyStats exports the idempotency_keys gauges
// (idempotency_in_progress_keys, idempotency_expired_leases,
// idempotency_oldest_in_progress_seconds,
// idempotency_reaper_backlog_seconds) read through pool on the default
// registry. Calling it again (a second serve in one process) points them
// at the new pool.
func RegisterKeyStats(pool *pgxpool.Pool, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.Default()
	}
	keyStatsMu.Lock()
	defer keyStatsMu.Unlock()
	if c := keyStatsRegistered; c != nil {
		c.mu.Lock()
		c.pool, c.log = pool, logger
		c.mu.Unlock()
		return nil
	}
	c := &keyStats{pool: pool, log: logger}
	if err := prometheus.Register(c); err != nil {
		return err
	}
	keyStatsRegistered = c
	return nil
}

// Describe implements prometheus.Collector.
func (c *keyStats) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{inProgressDesc, expiredLeasesDesc, oldestInProgressDesc, reaperBacklogDesc, keyStatsUpDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *keyStats) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	pool, log := c.pool, c.log
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), keyStatsTimeout)
	defer cancel()
	var inProgress, expired int64
	var oldest, prune, del float64
	if err := pool.QueryRow(ctx, keyStatsQuery).Scan(&inProgress, &expired, &oldest, &prune, &del); err != nil {
		log.Warn("metrics: read idempotency key stats", slog.Any("error", err))
		ch <- prometheus.MustNewConstMetric(keyStatsUpDesc, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(keyStatsUpDesc, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(inProgressDesc, prometheus.GaugeValue, float64(inProgress))
	ch <- prometheus.MustNewConstMetric(expiredLeasesDesc, prometheus.GaugeValue, float64(expired))
	ch <- prometheus.MustNewConstMetric(oldestInProgressDesc, prometheus.GaugeValue, oldest)
	ch <- prometheus.MustNewConstMetric(reaperBacklogDesc, prometheus.GaugeValue, prune, "prune")
	ch <- prometheus.MustNewConstMetric(reaperBacklogDesc, prometheus.GaugeValue, del, "delete")
}

// InitEndpointMetrics starts the series of each endpoint at zero, every
// outcome included, so an alert's increase() or ratio sees the first
// fencing rejection or transient release.
func InitEndpointMetrics(endpoints ...string) {
	outcomes := []string{outcomeExecuted, outcomeReplayed, outcomeTakeover, outcomeInProgress, outcomeMismatch,
		outcomeResultExpired, outcomeReleasedTransient, outcomeFailed, outcomeRejected, outcomeBudgetExceeded,
		outcomeConflictingWrite}
	for _, e := range endpoints {
		for _, o := range outcomes {
			requestsTotal.WithLabelValues(e, o)
		}
		leaseTakeoversTotal.WithLabelValues(e)
		fencingRejectionsTotal.WithLabelValues(e)
		lockWaitSeconds.WithLabelValues(e) // the dashboard's lock-wait panel reads its buckets from the start
	}
}
