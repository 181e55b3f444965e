package payments

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemref/payments/internal/processor"
)

// Metrics of reconciliation, served at /metrics. Labels are bounded: never
// a tenant, key or id.
var (
	webhookEventsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "payments_webhook_events_total",
		Help: "Processor webhook events applied, by event type and result (confirmed, compensating, recorded, duplicate).",
	}, []string{"type", "result"})
	compensationsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "payments_compensations_total",
		Help: "Extra charges the reconciliation sweep refunded, by reason (duplicate_charge, charge_after_failure).",
	}, []string{"reason"})
	// staleWritesTotal counts guarded writes that matched no row because
	// another writer had moved the record on first: handled on purpose
	// (nothing done), counted so the races are visible.
	staleWritesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "payments_stale_writes_total",
		Help: "Guarded state changes that found the record already moved on by another writer and did nothing, by write (mark_charge_sent, unmark_charge_sent, compensation_succeeded).",
	}, []string{"write"})
	duplicateRefundsTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "payments_duplicate_refunds_total",
		Help: "Refunds the sweep found executed more than once at the processor. Money sent back twice cannot be pulled back: alert on any increase.",
	})
)

// webhookTypes are the event types counted under their own name; any
// other type a processor sends is counted as "other", so made-up types
// cannot add series.
var webhookTypes = []string{processor.EventChargeSucceeded, processor.EventChargeFailed, processor.EventChargeRefunded}

// webhookTypeLabel is typ as a bounded label value.
func webhookTypeLabel(typ string) string {
	if slices.Contains(webhookTypes, typ) {
		return typ
	}
	return "other"
}

func init() {
	prometheus.MustRegister(webhookEventsTotal, compensationsTotal, staleWritesTotal, duplicateRefundsTotal)
	// Every known series starts at zero, so increase() in an alert sees
	// the first event (a counter born at 1 shows no increase).
	for _, typ := range append(webhookTypes, "other") {
		for _, result := range []WebhookResult{WebhookDuplicate, WebhookConfirmed, WebhookCompensating, WebhookRecorded} {
			webhookEventsTotal.WithLabelValues(typ, string(result))
		}
	}
	for _, reason := range []string{ReasonDuplicateCharge, ReasonChargeAfterFailure} {
		compensationsTotal.WithLabelValues(reason)
	}
	for _, write := range []string{"mark_charge_sent", "unmark_charge_sent", "compensation_succeeded"} {
		staleWritesTotal.WithLabelValues(write)
	}
}
