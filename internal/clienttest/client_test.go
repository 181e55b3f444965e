package clienttest

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemref/payments/client"
	"github.com/idemref/payments/client/api"
)

func orderRequest(ref string) api.CreateOrderRequest {
	return api.CreateOrderRequest{Reference: ref, CustomerId: "cus_1", Amount: 2500, Currency: "EUR"}
}

// wantOneKey checks that every attempt carried the same Idempotency-Key,
// the one the operation reports.
func wantOneKey(t *testing.T, attempts []seen, key string, n int) {
	t.Helper()
	if len(attempts) != n {
		t.Errorf("attempts = %d, want %d", len(attempts), n)
	}
	for i, a := range attempts {
		if a.key != key {
			t.Errorf("attempt %d sent Idempotency-Key %q, want %q on every attempt", i+1, a.key, key)
		}
	}
}

// A create retried through every kind of fault ends with exactly one order,
// and the result says whether the server replayed it.
func TestCreateOrderRetriedThroughFaults(t *testing.T) {
	t.Parallel()

	t.Run("CutAfterCommitIsReplayed", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		// 503 from the front end, 429 (Retry-After 0), a real 409 in
		// progress, a connection cut after the commit, then the replay.
		e.faults.play(status(503, ""), status(429, "0"), e.heldByAnother(t), cutAfterCommit)
		key := client.NewKey()
		res, err := e.client(t, client.Policy{MaxAttempts: 6}).CreateOrder(t.Context(), key, orderRequest("inv-faults"))
		if err != nil {
			t.Fatal(err)
		}
		if !res.Replayed || res.Status != http.StatusCreated || res.Key != key || res.Attempts != 5 {
			t.Errorf("result: replayed %v, status %d, key %q, attempts %d; want replayed 201 under %q after 5 attempts",
				res.Replayed, res.Status, res.Key, res.Attempts, key)
		}
		if res.Value.Reference != "inv-faults" {
			t.Errorf("order reference = %q", res.Value.Reference)
		}
		wantOneKey(t, e.faults.seen(), key, 5)
		e.wantRows(t, "inv-faults", 1, 1)
	})

	t.Run("FaultsBeforeExecutionAreNotReplays", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		// 502 and 504 from a gateway, a real 409 in progress, a real 409
		// conflicting_write_in_progress: none ran anything.
		e.faults.play(status(502, ""), status(504, ""), e.heldByAnother(t), e.writtenByAnother(t))
		res, err := e.client(t, client.Policy{}).CreateOrder(t.Context(), "", orderRequest("inv-fresh"))
		if err != nil {
			t.Fatal(err)
		}
		if res.Replayed || res.Status != http.StatusCreated {
			t.Errorf("result: replayed %v, status %d; want a fresh 201", res.Replayed, res.Status)
		}
		if len(res.Key) != 32 {
			t.Errorf("generated key %q: want 32 hex digits (128 bits)", res.Key)
		}
		wantOneKey(t, e.faults.seen(), res.Key, 5)
		e.wantRows(t, "inv-fresh", 1, 1)
	})
}

// A recorded failure lost on the way back is replayed like a success: the
// error says so.
func TestRecordedFailureIsReplayed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client(t, client.Policy{})
	if _, err := c.CreateOrder(t.Context(), "", orderRequest("inv-twice")); err != nil {
		t.Fatal(err)
	}
	// A new key for the same order: the backstop answers 409, recorded;
	// that answer is cut off, and the retry gets its replay.
	e.faults.play(cutAfterCommit)
	_, err := c.CreateOrder(t.Context(), "", orderRequest("inv-twice"))
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Code() != "order_reference_exists" || !apiErr.Replayed || apiErr.Attempts != 2 {
		t.Fatalf("error = %#v, want a replayed 409 order_reference_exists after 2 attempts", err)
	}
	if apiErr.Problem.OrderId == nil {
		t.Error("the problem does not name the existing order")
	}
	e.wantRows(t, "inv-twice", 1, 2)
}

// Answers that are final are never retried: one attempt, and nothing new
// written.
func TestFinalAnswersAreNotRetried(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client(t, client.Policy{})
	if _, err := c.CreateOrder(t.Context(), "", orderRequest("inv-taken")); err != nil {
		t.Fatal(err)
	}
	reused := client.NewKey()
	if _, err := c.CreateOrder(t.Context(), reused, orderRequest("inv-reused")); err != nil {
		t.Fatal(err)
	}
	bad, err := client.New(e.url, "wrong-key", client.WithHTTPClient(&http.Client{Transport: e.faults}))
	if err != nil {
		t.Fatal(err)
	}
	invalid := orderRequest("inv-invalid")
	invalid.Amount = 0

	for _, tc := range []struct {
		name   string
		call   func() error
		status int
		code   string
	}{
		{"400 validation_failed", func() error { _, err := c.CreateOrder(t.Context(), "", invalid); return err }, 400, "validation_failed"},
		{"401 unauthorized", func() error { _, err := bad.CreateOrder(t.Context(), "", orderRequest("inv-401")); return err }, 401, "unauthorized"},
		{"403 from a proxy", func() error {
			e.faults.play(status(403, ""))
			_, err := c.CreateOrder(t.Context(), "", orderRequest("inv-403"))
			return err
		}, 403, ""},
		{"404 not_found", func() error { _, err := c.GetOrder(t.Context(), [16]byte{1}); return err }, 404, "not_found"},
		{"409 order_reference_exists", func() error { _, err := c.CreateOrder(t.Context(), "", orderRequest("inv-taken")); return err }, 409, "order_reference_exists"},
		{"422 idempotency_key_reused", func() error { _, err := c.CreateOrder(t.Context(), reused, orderRequest("inv-other")); return err }, 422, "idempotency_key_reused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(e.faults.seen())
			err := tc.call()
			var apiErr *client.Error
			if !errors.As(err, &apiErr) || apiErr.Status != tc.status || apiErr.Code() != tc.code {
				t.Fatalf("error = %v, want a %d %s", err, tc.status, tc.code)
			}
			if n := len(e.faults.seen()) - before; n != 1 {
				t.Errorf("attempts = %d, want 1: a final answer is never retried", n)
			}
		})
	}
	// Only the two creates that succeeded and the recorded validation
	// failure left rows.
	if got := e.count(t, "SELECT count(*) FROM orders WHERE tenant_id = $1", e.tenantID); got != 2 {
		t.Errorf("orders = %d, want 2", got)
	}
}

// During an outage the budget, not the number of callers times
// MaxAttempts, bounds the retries.
func TestBudgetStopsRetryStorm(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.faults.forever(status(503, ""))
	const callers, capacity = 20, 5
	c := e.client(t, client.Policy{MaxAttempts: 5}, client.WithBudget(client.NewBudget(capacity, 1, 0.1)))

	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := range callers {
		wg.Go(func() {
			_, err := c.CreateOrder(t.Context(), "", orderRequest("inv-storm-"+string(rune('a'+i))))
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, client.ErrOutcomeUnknown) {
			t.Errorf("error = %v, want an OutcomeUnknownError", err)
		}
	}
	// Each caller's first attempt, plus at most capacity retries between
	// them all (no answer ever refilled the bucket), instead of 20 × 5.
	if got, most := len(e.faults.seen()), callers+capacity; got > most || got < callers {
		t.Errorf("attempts = %d, want from %d to %d", got, callers, most)
	}
}

// The client never waits past the context's deadline: a Retry-After that
// would end after it stops the operation at once.
func TestDeadlineIsRespected(t *testing.T) {
	t.Parallel()

	t.Run("RetryAfterBeyondDeadline", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.faults.forever(status(503, "2"))
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := e.client(t, client.Policy{}).CreateOrder(ctx, "", orderRequest("inv-deadline"))
		var unknown *client.OutcomeUnknownError
		if !errors.As(err, &unknown) || unknown.Key == "" {
			t.Fatalf("error = %v, want an OutcomeUnknownError with the key", err)
		}
		if took := time.Since(start); took > 250*time.Millisecond {
			t.Errorf("took %v: the client should have stopped at once, not waited toward the deadline", took)
		}
		if n := len(e.faults.seen()); n != 1 {
			t.Errorf("attempts = %d, want 1", n)
		}
	})

	t.Run("BackoffEndsAtDeadline", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.faults.forever(status(503, ""))
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := e.client(t, client.Policy{MaxAttempts: 1000, BaseDelay: 20 * time.Millisecond, MaxDelay: 50 * time.Millisecond},
			client.WithBudget(client.NewBudget(1000, 1, 1))).CreateOrder(ctx, "", orderRequest("inv-backoff"))
		if !errors.Is(err, client.ErrOutcomeUnknown) {
			t.Fatalf("error = %v, want an OutcomeUnknownError", err)
		}
		if took := time.Since(start); took > 400*time.Millisecond {
			t.Errorf("took %v, past the 300 ms deadline", took)
		}
	})
}

// Retry-After is the server's minimum wait: the retry does not come
// earlier, even when the backoff alone would be shorter.
func TestRetryAfterIsHonoured(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.faults.play(status(429, "1"))
	res, err := e.client(t, client.Policy{}).CreateOrder(t.Context(), "", orderRequest("inv-retry-after"))
	if err != nil {
		t.Fatal(err)
	}
	attempts := e.faults.seen()
	if len(attempts) != 2 {
		t.Fatalf("attempts = %d, want 2", len(attempts))
	}
	if gap := attempts[1].at.Sub(attempts[0].at); gap < time.Second {
		t.Errorf("retried after %v, before the 1 s Retry-After", gap)
	}
	if res.Replayed {
		t.Error("a 429 ran nothing: the retry is not a replay")
	}
	e.wantRows(t, "inv-retry-after", 1, 1)
}

// When retries run out, the error carries the key, and the key-status
// lookup says what happened.
func TestOutcomeUnknownIsResolvedByKeyStatus(t *testing.T) {
	t.Parallel()

	t.Run("Executed", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.faults.play(cutAfterCommit)
		e.faults.forever(status(503, ""))
		c := e.client(t, client.Policy{MaxAttempts: 3})
		_, err := c.CreateOrder(t.Context(), "", orderRequest("inv-unknown"))
		var unknown *client.OutcomeUnknownError
		if !errors.As(err, &unknown) {
			t.Fatalf("error = %v, want an OutcomeUnknownError", err)
		}
		if unknown.Attempts != 3 || unknown.Endpoint != client.EndpointCreateOrder {
			t.Errorf("attempts %d, endpoint %q", unknown.Attempts, unknown.Endpoint)
		}
		wantOneKey(t, e.faults.seen(), unknown.Key, 3)
		e.faults.forever(nil)
		st, err := c.Resolve(t.Context(), unknown)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != "completed" || st.ResponseStatus == nil || *st.ResponseStatus != 201 || st.Resource == nil {
			t.Errorf("key status = %+v, want completed with 201 and the order", st)
		}
		e.wantRows(t, "inv-unknown", 1, 1)
		// Sending again with the key is the other way to resolve: a replay.
		res, err := c.CreateOrder(t.Context(), unknown.Key, orderRequest("inv-unknown"))
		if err != nil || !res.Replayed || "/v1/orders/"+res.Value.Id.String() != *st.Resource {
			t.Errorf("resend: %+v, %v; want the replay of %s", res, err, *st.Resource)
		}
		e.wantRows(t, "inv-unknown", 1, 1)
	})

	// No attempt reached the server, but the client cannot know that: an
	// attempt may still be running there (the server records its key at
	// the end of its transaction). Resolve only says ErrKeyUnknown from a
	// lookup sent once the server's commit window has passed since the
	// last attempt; asked with less time than that, it says the key is not
	// recorded yet.
	t.Run("NeverExecuted", func(t *testing.T) {
		t.Parallel()
		// Short server timeouts, so that the window is short.
		to := timeouts{request: time.Second, lock: 100 * time.Millisecond}
		e := setup(t, to)
		e.faults.play(status(503, ""), status(503, ""))
		c := e.client(t, client.Policy{MaxAttempts: 2})
		_, err := c.CreateOrder(t.Context(), "", orderRequest("inv-never"))
		var unknown *client.OutcomeUnknownError
		if !errors.As(err, &unknown) {
			t.Fatalf("error = %v, want an OutcomeUnknownError", err)
		}
		lastAttempt := e.faults.seen()[1].at

		short, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		_, err = c.Resolve(short, unknown)
		cancel()
		if !errors.Is(err, client.ErrKeyNotYetRecorded) || errors.Is(err, client.ErrKeyUnknown) {
			t.Errorf("Resolve inside the window: %v, want ErrKeyNotYetRecorded", err)
		}

		if _, err := c.Resolve(t.Context(), unknown); !errors.Is(err, client.ErrKeyUnknown) {
			t.Errorf("Resolve: %v, want ErrKeyUnknown", err)
		}
		seen := e.faults.seen()
		if asked := seen[len(seen)-1].at; asked.Before(lastAttempt.Add(to.request + to.lock)) {
			t.Errorf("ErrKeyUnknown concluded from a lookup sent %v after the last attempt, inside the window (%v at least)",
				asked.Sub(lastAttempt), to.request+to.lock)
		}
		e.wantRows(t, "inv-never", 0, 0)
	})
}
