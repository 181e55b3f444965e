package reaper

import "testing"

// The duty doubles after every catchUpAfter full batches in a row, up to
// maxCatchUpDuty, and a Duty set above that cap is never lowered.
func TestCatchUpDuty(t *testing.T) {
	cases := []struct {
		base float64
		full int
		want float64
	}{
		{0.05, 0, 0.05},
		{0.05, catchUpAfter - 1, 0.05},
		{0.05, catchUpAfter, 0.1},
		{0.05, 2 * catchUpAfter, 0.2},
		{0.05, 3 * catchUpAfter, 0.4},
		{0.05, 4 * catchUpAfter, maxCatchUpDuty},
		{0.05, 1000 * catchUpAfter, maxCatchUpDuty},
		{0.3, catchUpAfter, maxCatchUpDuty},
		{0.8, 0, 0.8},
		{0.8, 10 * catchUpAfter, 0.8},
	}
	for _, c := range cases {
		if got := catchUpDuty(c.base, c.full); got != c.want {
			t.Errorf("catchUpDuty(%v, %d) = %v, want %v", c.base, c.full, got, c.want)
		}
	}
}
