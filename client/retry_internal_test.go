package client

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"
)

func TestBackoffIsFullJitterUnderTheCeiling(t *testing.T) {
	t.Parallel()
	p := Policy{BaseDelay: 10 * time.Millisecond, MaxDelay: 100 * time.Millisecond}.withDefaults()
	for n, ceiling := range map[int]time.Duration{1: 10 * time.Millisecond, 2: 20 * time.Millisecond, 4: 80 * time.Millisecond, 5: 100 * time.Millisecond, 64: 100 * time.Millisecond} {
		var most time.Duration
		for range 200 {
			d := p.backoff(n)
			if d < 0 || d >= ceiling {
				t.Fatalf("backoff(%d) = %v, want in [0, %v)", n, d, ceiling)
			}
			most = max(most, d)
		}
		// Full jitter uses the whole window, not just its top.
		if most < ceiling/2 {
			t.Errorf("backoff(%d) never above %v in 200 draws", n, most)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 1, 15, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, value string
		want        time.Duration
		ok          bool
	}{
		{"seconds", "3", 3 * time.Second, true},
		{"zero", "0", 0, true},
		{"date", now.Add(2 * time.Second).Format(http.TimeFormat), 2 * time.Second, true},
		{"past date", now.Add(-time.Minute).Format(http.TimeFormat), 0, true},
		{"negative", "-1", 0, false},
		{"garbage", "soon", 0, false},
		{"absent", "", 0, false},
	} {
		got, ok := parseRetryAfter(tc.value, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: parseRetryAfter(%q) = %v, %v; want %v, %v", tc.name, tc.value, got, ok, tc.want, tc.ok)
		}
	}
}

// The retry table of the package documentation, row by row.
func TestRetryTable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status int
		code   string
		retry  bool
	}{
		{409, "idempotency_key_in_use", true},
		{409, "conflicting_write_in_progress", true},
		{429, "rate_limited", true},
		{502, "", true},
		{503, "service_unavailable", true},
		{503, "processor_outcome_unknown", true},
		{504, "", true},
		{400, "validation_failed", false},
		{401, "unauthorized", false},
		{402, "card_declined", false},
		{403, "", false},
		{404, "not_found", false},
		{409, "order_reference_exists", false},
		{409, "payment_exists", false},
		{409, "idempotency_result_expired", false},
		{409, "", false}, // a 409 that does not say "in progress" is not one
		{412, "precondition_failed", false},
		{413, "body_too_large", false},
		{415, "unsupported_media_type", false},
		{422, "idempotency_key_reused", false},
		{500, "internal_error", false},
		{201, "", false},
	} {
		if got := retryable(tc.status, tc.code); got != tc.retry {
			t.Errorf("retryable(%d, %q) = %v, want %v", tc.status, tc.code, got, tc.retry)
		}
	}
}

// A request that cannot be built is not sent, so it is neither retried nor
// an unknown outcome.
func TestUnbuildableRequestIsNotRetried(t *testing.T) {
	t.Parallel()
	c, err := New("http://localhost:1", "key")
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	_, _, err = c.run(t.Context(), "POST /v1/orders", "k", func(context.Context) (*http.Response, error) {
		calls++
		return nil, errors.New("json: unsupported value")
	})
	if err == nil || errors.Is(err, ErrOutcomeUnknown) || calls != 1 {
		t.Errorf("err = %v after %d calls; want the build error itself, once", err, calls)
	}
}
