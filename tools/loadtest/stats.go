package main

import (
	"math"
	"slices"
	"strconv"
	"time"
)

// series is one figure measured once per round.
type series []float64

func (s series) median() float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	v := slices.Sorted(slices.Values(s))
	if n := len(v); n%2 == 1 {
		return v[n/2]
	} else {
		return (v[n/2-1] + v[n/2]) / 2
	}
}

// format returns "median (min–max)" with prec decimals.
func (s series) format(prec int) string {
	if len(s) == 0 {
		return "n/a"
	}
	// Adding 0 turns a negative zero, which a small negative figure rounds
	// to, into "0" rather than "-0".
	f := func(v float64) string {
		return strconv.FormatFloat(math.Round(v*math.Pow10(prec))/math.Pow10(prec)+0, 'f', prec, 64)
	}
	if len(s) == 1 {
		return f(s[0])
	}
	return f(s.median()) + " (" + f(slices.Min(s)) + "–" + f(slices.Max(s)) + ")"
}

// ratio divides a by b round by round: the rounds are interleaved, so a
// ratio within one round compares figures measured minutes apart at most.
func ratio(a, b series) series {
	out := make(series, 0, len(a))
	for i := range min(len(a), len(b)) {
		out = append(out, a[i]/b[i])
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
