package httpapi_test

import (
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	httpapi "github.com/idemref/payments/internal/http"
)

// R1: a tenant past its rate limit gets 429 with Retry-After and the
// RateLimit headers, before the idempotency layer: nothing is claimed or
// recorded, another tenant is not affected, and the retry with the same key
// after Retry-After runs normally.
func TestRateLimitPerTenant(t *testing.T) {
	t.Parallel()
	e := setup(t, withRateLimit(2, 2))

	for i, ref := range []string{"inv-1", "inv-2"} {
		res := e.post(t, e.a.Key, "k-"+ref, orderBody(ref))
		wantStatus(t, res, http.StatusCreated)
		if got, want := res.header.Get("RateLimit"), `"tenant";r=`+strconv.Itoa(1-i); !regexp.MustCompile(`^` + want + `;t=\d+$`).MatchString(got) {
			t.Errorf("RateLimit = %q, want %s;t=N", got, want)
		}
		if got := res.header.Get("RateLimit-Policy"); got != `"tenant";q=2;w=1` {
			t.Errorf("RateLimit-Policy = %q", got)
		}
	}
	e.wantRows(t, 2, 2)

	limited := e.post(t, e.a.Key, "k-inv-3", orderBody("inv-3"))
	wantProblem(t, limited, http.StatusTooManyRequests, httpapi.CodeRateLimited)
	retryAfter, err := strconv.Atoi(limited.header.Get("Retry-After"))
	if err != nil || retryAfter < 1 {
		t.Fatalf("Retry-After = %q, want whole seconds >= 1", limited.header.Get("Retry-After"))
	}
	if got := limited.header.Get("RateLimit"); !regexp.MustCompile(`^"tenant";r=0;t=[1-9]\d*$`).MatchString(got) {
		t.Errorf("RateLimit on the 429 = %q, want r=0 and t >= 1", got)
	}
	e.wantRows(t, 2, 2) // the 429 claimed nothing

	t.Run("OtherTenantIsNotLimited", func(t *testing.T) {
		wantStatus(t, e.post(t, e.b.Key, "k-b-1", orderBody("inv-b-1")), http.StatusCreated)
	})

	t.Run("RetryAfterRetryAfterRuns", func(t *testing.T) {
		time.Sleep(time.Duration(retryAfter) * time.Second) // the client honours Retry-After
		res := e.post(t, e.a.Key, "k-inv-3", orderBody("inv-3"))
		wantStatus(t, res, http.StatusCreated)
		if res.header.Get(httpapi.ReplayedHeader) != "" {
			t.Error("the retry after a 429 was a replay: the 429 must not have been recorded")
		}
		if n := e.countOrdersWithReference(t, e.a.ID, "inv-3"); n != 1 {
			t.Errorf("orders inv-3 = %d, want 1", n)
		}
	})
}
