package consumer

import "github.com/prometheus/client_golang/prometheus"

// Metrics of the consumers (X1), by consumer name (a bounded label).
var (
	processedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "consumer_processed_total",
		Help: "Events a consumer applied (inbox row and effect committed).",
	}, []string{"consumer"})
	duplicatesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "consumer_duplicates_skipped_total",
		Help: "Deliveries whose event id the consumer's inbox already had: acknowledged without an effect.",
	}, []string{"consumer"})
	// streamDuplicatesTotal is the part of duplicatesTotal that the stream
	// let through: a first delivery whose event the inbox already had, at
	// its first attempt, is a second copy of it on the stream. A
	// redelivery the inbox skips is a lost acknowledgement (a connection
	// cut, a crash after the commit), and a retry in hand that finds it,
	// the delivery's own commit whose answer was lost: the inbox absorbs
	// both by design, and they page no one.
	streamDuplicatesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "consumer_stream_duplicates_total",
		Help: "First deliveries whose event id the consumer's inbox already had at their first attempt: a second copy of the event on the stream (published again past the stream's duplicates window). Redeliveries after a lost ack, and retries that find their own commit, are not counted.",
	}, []string{"consumer"})
	redeliveriesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "consumer_redeliveries_total",
		Help: "Deliveries with a delivery count above 1 (after a missing ack, a nak or a crash).",
	}, []string{"consumer"})
	failuresTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "consumer_failures_total",
		Help: "Deliveries whose effect failed and was rolled back; they are redelivered on the backoff.",
	}, []string{"consumer"})
	heldRetriesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "consumer_held_retries_total",
		Help: "Retries of an event kept in hand after a transient failure (the database unreachable): they cost no delivery, so an outage does not dead-letter events.",
	}, []string{"consumer"})
	deadLettersTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "consumer_dead_letters_total",
		Help: "Messages a consumer gave up on (past MaxDeliver, or unreadable), copied to the dead-letter stream.",
	}, []string{"consumer", "reason"})
)

func init() {
	prometheus.MustRegister(processedTotal, duplicatesTotal, streamDuplicatesTotal, redeliveriesTotal, failuresTotal, heldRetriesTotal, deadLettersTotal)
}

// InitMetrics starts every series of the consumer name at zero, so an
// alert's increase() sees its first dead letter or failure, even before
// the broker is reached.
func InitMetrics(name string) {
	for _, c := range []*prometheus.CounterVec{processedTotal, duplicatesTotal, redeliveriesTotal, failuresTotal, heldRetriesTotal} {
		c.WithLabelValues(name)
	}
	for _, reason := range []string{reasonMaxDeliver, reasonTerminated} {
		deadLettersTotal.WithLabelValues(name, reason)
	}
}
