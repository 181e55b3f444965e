package testkit

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Gauge reads an unlabelled gauge of the process's default registry, the
// one /metrics serves; it fails the test if there is none.
func Gauge(t testing.TB, name string) float64 {
	t.Helper()
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no unlabelled gauge %s", name)
	return 0
}
