package db

import "math"

// Int32 converts n for an int4 query parameter (a LIMIT, a batch size, a
// status code), saturating at the bounds of int32 instead of wrapping: a
// row limit of 1<<32 is "no practical limit", never a negative one.
func Int32(n int) int32 {
	if n > math.MaxInt32 {
		return math.MaxInt32
	}
	if n < math.MinInt32 {
		return math.MinInt32
	}
	return int32(n)
}
