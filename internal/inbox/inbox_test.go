package inbox

import (
	"errors"
	"testing"
	"time"
)

// Processed ids outlive every sender's redelivery horizon, strictly.
func TestCheckRetention(t *testing.T) {
	for _, c := range []struct {
		retention time.Duration
		horizons  []time.Duration
		want      error
	}{
		{time.Hour, []time.Duration{time.Minute, 30 * time.Minute}, nil},
		{time.Hour, []time.Duration{time.Minute, time.Hour}, ErrRetentionWithinRedelivery},
		{time.Hour, []time.Duration{2 * time.Hour}, ErrRetentionWithinRedelivery},
	} {
		if err := CheckRetention(c.retention, c.horizons...); !errors.Is(err, c.want) {
			t.Errorf("CheckRetention(%s, %v) = %v, want %v", c.retention, c.horizons, err, c.want)
		}
	}
}
