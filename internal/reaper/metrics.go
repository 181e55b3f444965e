package reaper

import "github.com/prometheus/client_golang/prometheus"

// Metrics of the reaper (X1), served at /metrics.
var (
	rowsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idempotency_reaper_rows_total",
		Help: "Rows the reaper handled, by action: pruned (key response dropped, tombstone kept), deleted (key forgotten), messages_deleted (inbox ids past MESSAGE_RETENTION), outbox_deleted (published outbox rows past it).",
	}, []string{"action"})
	timeoutsTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "idempotency_reaper_timeouts_total",
		Help: "Reaper batches that hit the statement timeout (the batch size halves after repeated ones).",
	})
	passFailuresTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "idempotency_reaper_pass_failures_total",
		Help: "Reaper passes that ended in an error; the next tick retries.",
	})
	batchSize = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idempotency_reaper_batch_size",
		Help: "The reaper's current adaptive batch size; below the configured batch after statement timeouts.",
	})
	currentDuty = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idempotency_reaper_duty",
		Help: "The share of its time the reaper may spend in batches now: REAPER_DUTY, doubled while it keeps finding full batches (catching up), at most 0.5.",
	})
)

func init() {
	prometheus.MustRegister(rowsTotal, timeoutsTotal, passFailuresTotal, batchSize, currentDuty)
	// Present at 0 before the first pass, so rate() and increase() work
	// from the start.
	rowsTotal.WithLabelValues("pruned")
	rowsTotal.WithLabelValues("deleted")
	rowsTotal.WithLabelValues("messages_deleted")
	rowsTotal.WithLabelValues("outbox_deleted")
}
