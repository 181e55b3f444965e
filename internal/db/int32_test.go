package db_test

import (
	"math"
	"testing"

	"github.com/idemref/payments/internal/db"
)

func TestInt32Saturates(t *testing.T) {
	for _, c := range []struct {
		in   int
		want int32
	}{
		{0, 0}, {101, 101}, {-1, -1},
		{math.MaxInt32, math.MaxInt32}, {math.MaxInt32 + 1, math.MaxInt32}, {1 << 40, math.MaxInt32},
		{math.MinInt32, math.MinInt32}, {math.MinInt32 - 1, math.MinInt32},
	} {
		if got := db.Int32(c.in); got != c.want {
			t.Errorf("Int32(%d) = %d, want %d", c.in, got, c.want)
		}
	}
}
