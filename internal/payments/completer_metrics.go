package payments

import "github.com/prometheus/client_golang/prometheus"

// Metrics of the completer and of the reconciliation sweep (X1), served at
// /metrics. Labels are bounded: never a tenant, key or id.
var (
	completerFinishedTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "payments_completer_finished_total",
		Help: "Keys whose client went away that the completer took over and finished.",
	})
	completerWaitingTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "payments_completer_waiting_total",
		Help: "Keys the completer took over and left held because an earlier processor call may still land (settle window).",
	})
	completerFailuresTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "payments_completer_failures_total",
		Help: "Completer attempts that failed (take-over or resume): the key was released and is retried at the next tick.",
	})
	sweepRowsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "payments_sweep_rows_total",
		Help: "Payments and refunds the reconciliation sweep looked at, by kind (payment, refund) and result (done, retry: the processor or the database could not be reached).",
	}, []string{"kind", "result"})
	compensationsRefusedTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "payments_compensations_refused_total",
		Help: "Refunds of an extra charge the processor refused with a final error: the compensation is recorded refused and tried again hourly; a person should look.",
	})
)

func init() {
	prometheus.MustRegister(completerFinishedTotal, completerWaitingTotal, completerFailuresTotal, sweepRowsTotal, compensationsRefusedTotal)
	for _, kind := range []string{"payment", "refund"} {
		for _, retry := range []bool{false, true} {
			sweepRowsTotal.WithLabelValues(kind, sweepResult(retry))
		}
	}
}

// sweepResult is the result label of payments_sweep_rows_total.
func sweepResult(retry bool) string {
	if retry {
		return "retry"
	}
	return "done"
}
