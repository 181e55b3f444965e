package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Policy says how a Client retries. The zero value of a field takes its
// default.
type Policy struct {
	// MaxAttempts bounds the attempts of one operation, the first included
	// (default 5).
	MaxAttempts int
	// BaseDelay and MaxDelay shape the full-jitter exponential backoff: the
	// wait before retry n is uniform in [0, min(MaxDelay, BaseDelay·2ⁿ⁻¹))
	// (defaults 100 ms and 5 s).
	BaseDelay, MaxDelay time.Duration
	// MaxRetryAfter is the longest Retry-After the client waits for; a
	// server asking for more ends the operation (default 60 s). The
	// context's deadline caps it further.
	MaxRetryAfter time.Duration
	// OnAttempt, when set, is called after every attempt, before any wait:
	// for logging and metrics.
	OnAttempt func(Attempt)
}

// Attempt describes one finished attempt of an operation.
type Attempt struct {
	Endpoint string // route template, such as "POST /v1/orders"
	Key      string // the operation's Idempotency-Key; "" for reads
	N        int    // 1 for the first attempt
	Status   int    // 0 when no answer arrived
	Err      error  // the transport error, if any
	// Retry says whether another attempt follows, and Delay how long the
	// client waits before it.
	Retry bool
	Delay time.Duration
}

const (
	defaultMaxAttempts   = 5
	defaultBaseDelay     = 100 * time.Millisecond
	defaultMaxDelay      = 5 * time.Second
	defaultMaxRetryAfter = 60 * time.Second
	// maxBody bounds how much of an answer is read.
	maxBody = 8 << 20
)

func (p Policy) withDefaults() Policy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = defaultMaxAttempts
	}
	if p.BaseDelay <= 0 {
		p.BaseDelay = defaultBaseDelay
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = defaultMaxDelay
	}
	if p.MaxRetryAfter <= 0 {
		p.MaxRetryAfter = defaultMaxRetryAfter
	}
	return p
}

// backoff is the full-jitter wait before retry n (n ≥ 1): uniform in
// [0, min(MaxDelay, BaseDelay·2ⁿ⁻¹)). Full jitter spreads the retries of
// many clients that failed together over the whole window, instead of
// sending them back in synchronized waves.
func (p Policy) backoff(n int) time.Duration {
	ceiling := p.MaxDelay
	if n-1 < 32 {
		if d := p.BaseDelay << (n - 1); d > 0 && d < ceiling {
			ceiling = d
		}
	}
	return rand.N(ceiling)
}

// retryable is the retry table: which answers are safe and useful to send
// again with the same key. Everything else is the server's final answer for
// this key (and a recorded one is replayed to any retry anyway).
func retryable(status int, code string) bool {
	switch status {
	case http.StatusTooManyRequests, // rate limited before the claim: nothing ran
		http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	case http.StatusConflict:
		// Only "another attempt holds this key" and "another request is
		// writing what this one must write": in both, nothing was recorded
		// for this key, and the retry runs (it is no replay). The
		// natural-key conflict (order_reference_exists) and
		// idempotency_result_expired are final.
		return code == codeKeyInUse || code == codeConflictingWrite
	}
	return false
}

const (
	codeKeyInUse         = "idempotency_key_in_use"
	codeConflictingWrite = "conflicting_write_in_progress"
)

// parseRetryAfter reads Retry-After as delay-seconds or an HTTP-date.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		return time.Duration(min(n, 1<<30)) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// answer is one attempt's complete response.
type answer struct {
	status int
	header http.Header
	body   []byte
	code   string // the problem code, when the body is a problem
}

// Why the client stopped retrying, joined into OutcomeUnknownError.Last.
var (
	errBudget      = errors.New("retry budget exhausted")
	errDeadline    = errors.New("the next attempt could not start before the context deadline")
	errRetryAfter  = errors.New("the server's Retry-After exceeds the client's MaxRetryAfter")
	errMaxAttempts = errors.New("attempts exhausted")
)

// run sends one operation until it gets a final answer or has to stop. send
// must build a fresh request on every call, carrying the same key.
func (c *Client) run(ctx context.Context, endpoint, key string, send func(context.Context) (*http.Response, error)) (answer, int, error) {
	p := c.policy
	var sent time.Time // when the last attempt was sent
	for n := 1; ; n++ {
		var wrote sentAt
		res, err := send(httptrace.WithClientTrace(ctx, wrote.trace()))
		sent = wrote.get()
		var urlErr *url.Error
		if err != nil && !errors.As(err, &urlErr) {
			// Not a transport error (http.Client reports those as
			// *url.Error): the request could not even be built, so nothing
			// was sent and a retry would fail the same way.
			return answer{}, n, err
		}
		var a answer
		if err == nil {
			a, err = readAnswer(res)
		}
		if err != nil && ctx.Err() != nil {
			// The caller gave up (or its deadline passed) while the request
			// was in flight: it may have been executed.
			return answer{}, n, &OutcomeUnknownError{Key: key, Endpoint: endpoint, Attempts: n, LastSent: sent, Last: errors.Join(ctx.Err(), err)}
		}
		if err == nil && !retryable(a.status, a.code) {
			c.budget.answered()
			c.report(Attempt{Endpoint: endpoint, Key: key, N: n, Status: a.status})
			return a, n, nil
		}

		// A network error or a retryable status: the outcome of this
		// attempt is not known (or nothing ran); try again if allowed.
		last := err
		if last == nil {
			last = &Error{Status: a.status, Problem: decodeProblem(a), Key: key, Header: a.header, Attempts: n}
		}
		delay := p.backoff(n)
		if err == nil {
			if ra, ok := parseRetryAfter(a.header.Get("Retry-After"), time.Now()); ok {
				if ra > p.MaxRetryAfter {
					return c.stop(endpoint, key, n, sent, a.status, last, errRetryAfter)
				}
				// Retry-After is the server's minimum; jitter only above it.
				delay = max(delay, ra)
			}
		}
		switch {
		case n >= p.MaxAttempts:
			return c.stop(endpoint, key, n, sent, a.status, last, errMaxAttempts)
		case !fitsDeadline(ctx, delay):
			// Waiting would end past the deadline: stop now rather than
			// sleep for nothing or retry before the server asked.
			return c.stop(endpoint, key, n, sent, a.status, last, errDeadline)
		case !c.budget.take():
			return c.stop(endpoint, key, n, sent, a.status, last, errBudget)
		}
		c.report(Attempt{Endpoint: endpoint, Key: key, N: n, Status: a.status, Err: err, Retry: true, Delay: delay})
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return answer{}, n, &OutcomeUnknownError{Key: key, Endpoint: endpoint, Attempts: n, LastSent: sent, Last: errors.Join(ctx.Err(), last)}
		case <-t.C:
		}
	}
}

// sentAt is when an attempt was sent: when its request was written to the
// connection, or, when it never was, when the attempt started. The later
// the better for Resolve, which counts the server's commit window from it:
// the time spent dialling is not spent at the server.
type sentAt struct {
	start time.Time
	mu    sync.Mutex
	wrote time.Time
}

func (s *sentAt) trace() *httptrace.ClientTrace {
	s.start = time.Now()
	return &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) {
		s.mu.Lock()
		s.wrote = time.Now()
		s.mu.Unlock()
	}}
}

func (s *sentAt) get() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.wrote.IsZero() {
		return s.start
	}
	return s.wrote
}

func (c *Client) stop(endpoint, key string, n int, sent time.Time, status int, last, why error) (answer, int, error) {
	c.report(Attempt{Endpoint: endpoint, Key: key, N: n, Status: status, Err: last})
	return answer{}, n, &OutcomeUnknownError{Key: key, Endpoint: endpoint, Attempts: n, LastSent: sent, Last: errors.Join(why, last)}
}

func (c *Client) report(a Attempt) {
	if c.policy.OnAttempt != nil {
		c.policy.OnAttempt(a)
	}
}

// fitsDeadline reports whether an attempt starting after delay still starts
// before ctx's deadline.
func fitsDeadline(ctx context.Context, delay time.Duration) bool {
	d, ok := ctx.Deadline()
	return !ok || time.Now().Add(delay).Before(d)
}

// readAnswer reads the whole response: an answer whose body was cut off is
// a network error, as the status alone says nothing certain.
func readAnswer(res *http.Response) (answer, error) {
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, maxBody))
	if err != nil {
		return answer{}, fmt.Errorf("read the answer: %w", err)
	}
	a := answer{status: res.StatusCode, header: res.Header, body: body}
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/problem+json") {
		var p struct {
			Code string `json:"code"`
		}
		if json.Unmarshal(body, &p) == nil {
			a.code = p.Code
		}
	}
	return a, nil
}
