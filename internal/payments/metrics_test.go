package payments_test

import (
	"context"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemref/payments/internal/processor"
)

// X1: labels are bounded. A processor (or anyone holding the webhook
// secret) sending made-up event types adds no series: every type the
// service does not know is counted as "other".
func TestWebhookEventTypesAreABoundedLabel(t *testing.T) {
	t.Parallel()
	w := setup(t, shortLease, shortTimeout)
	for _, typ := range []string{"made.up.one", "made.up.two", "charge.disputed"} {
		ev := processor.Event{ID: "evt_" + typ, Object: "event", Type: typ}
		if _, err := w.svc.HandleProcessorEvent(context.Background(), ev); err != nil {
			t.Fatal(err)
		}
	}
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	known := []string{processor.EventChargeSucceeded, processor.EventChargeFailed, processor.EventChargeRefunded, "other"}
	var types []string
	for _, f := range families {
		if f.GetName() != "payments_webhook_events_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "type" && !slices.Contains(types, l.GetValue()) {
					types = append(types, l.GetValue())
				}
			}
		}
	}
	slices.Sort(types)
	slices.Sort(known)
	if !slices.Equal(types, known) {
		t.Errorf("payments_webhook_events_total has types %q, want exactly %q", types, known)
	}
}
