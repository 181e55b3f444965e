package processor

import "github.com/prometheus/client_golang/prometheus"

// callsTotal counts processor calls by operation and by the class of their
// answer (S6), served at /metrics.
var callsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "processor_calls_total",
	Help: "Calls to the payment processor by operation (e.g. POST /v1/charges) and class of answer (final, not_executed, outcome_unknown).",
}, []string{"op", "class"})

func init() {
	prometheus.MustRegister(callsTotal)
	// Every operation and class starts at zero, so a rate or increase over
	// them sees the first call of each.
	InitCallMetrics("POST /v1/charges", "POST /v1/refunds", "GET /v1/charges", "GET /v1/refunds")
}
