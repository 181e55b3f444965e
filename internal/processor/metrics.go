package processor

import "github.com/prometheus/client_golang/prometheus"

// callsTotal counts processor calls by operation and by the class of their
// answer (S6), served at /metrics.
var callsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "processor_calls_total",
	Help: "Calls to the payment processor by operation (e.g. POST /v1/charges) and class of answer (final, not_executed, outcome_unknown).",
}, []string{"op", "class"})

// misconfiguredTotal counts the calls the processor refused for our own
// configuration (S8, ErrMisconfigured), by operation: each is also a
// not_executed call in callsTotal, and any is an outage only an operator
// ends (docs/operations.md, the processor refuses our configuration).
var misconfiguredTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "processor_misconfigured_calls_total",
	Help: "Calls the payment processor refused for our own configuration (401, 403: the secret key; 404 naming no object: the URL), by operation.",
}, []string{"op"})

func init() { prometheus.MustRegister(callsTotal, misconfiguredTotal) }
