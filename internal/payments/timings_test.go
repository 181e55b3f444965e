package payments

import (
	"errors"
	"testing"
	"time"
)

// Each rule of the payment's clocks is refused with its own error, and
// the defaults keep all of them.
func TestTimingsCheck(t *testing.T) {
	ok := Timings{RequestTimeout: 20 * time.Second, ProcessorTimeout: 10 * time.Second, Lease: time.Minute, SettleWindow: time.Minute}
	if err := ok.Check(); err != nil {
		t.Fatalf("the defaults' timings: %v", err)
	}
	tests := []struct {
		name   string
		change func(*Timings)
		want   error
	}{
		{"CallOutlastsRequest", func(t *Timings) { t.ProcessorTimeout = t.RequestTimeout }, ErrProcessorCallOutlastsRequest},
		{"LeaseWithinCall", func(t *Timings) { t.Lease = t.ProcessorTimeout }, ErrLeaseWithinProcessorCall},
		{"SettleWithinCall", func(t *Timings) { t.SettleWindow = t.ProcessorTimeout }, ErrSettleWithinProcessorCall},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			timings := ok
			tt.change(&timings)
			if err := timings.Check(); !errors.Is(err, tt.want) {
				t.Errorf("Check() = %v, want %v", err, tt.want)
			}
		})
	}
}
