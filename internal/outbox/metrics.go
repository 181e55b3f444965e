package outbox

import "github.com/prometheus/client_golang/prometheus"

// Metrics of the relay (X1), served at /metrics.
var (
	publishedTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outbox_published_total",
		Help: "Outbox rows the relay published and the stream acknowledged (a republish after a crash counts again).",
	})
	duplicatesDroppedTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outbox_publish_duplicates_total",
		Help: "Publishes the stream acknowledged as duplicates of a message it already had (same Nats-Msg-Id within the duplicates window).",
	})
	publishErrorsTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "outbox_publish_errors_total",
		Help: "Relay batches cut short by a failed publish; their rows are released and published again.",
	})
	unpublishedRows = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "outbox_unpublished_rows",
		Help: "Outbox rows not yet published, as of the relay's last drain.",
	})
	lagSeconds = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "outbox_lag_seconds",
		Help: "Age of the oldest unpublished outbox row, as of the relay's last drain: how far the stream is behind the database.",
	})
)

func init() {
	prometheus.MustRegister(publishedTotal, duplicatesDroppedTotal, publishErrorsTotal, unpublishedRows, lagSeconds)
}
