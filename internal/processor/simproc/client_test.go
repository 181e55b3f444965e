package simproc

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemref/payments/internal/processor"
)

// The simulator's tests cover the client against the real wire; these pin
// down how each kind of answer is classified, including answers the
// simulator never gives.
func TestClientClassifiesAnswers(t *testing.T) {
	t.Parallel()
	req := processor.ChargeRequest{Amount: 1000, Currency: "EUR", PaymentMethod: "pm_card_visa"}

	tests := []struct {
		name           string
		handler        http.HandlerFunc
		wantClass      processor.Class
		wantDecline    *processor.DeclineError
		wantRequest    *processor.RequestError
		wantRetryAfter time.Duration
		// ours: the answer refused our own configuration (S8).
		ours bool
	}{
		{name: "SuccessIsFinal", handler: reply(200, `{"id":"ch_1","amount":1000,"status":"succeeded"}`), wantClass: processor.ClassFinal},
		{
			name:        "DeclineIsFinal",
			handler:     reply(402, `{"error":{"type":"card_error","code":"card_declined","decline_code":"insufficient_funds","message":"Your card was declined.","charge":"ch_1"}}`),
			wantClass:   processor.ClassFinal,
			wantDecline: &processor.DeclineError{Code: "card_declined", DeclineCode: "insufficient_funds", Message: "Your card was declined.", ChargeID: "ch_1"},
		},
		{
			name:        "ValidationErrorIsFinal",
			handler:     reply(400, `{"error":{"type":"invalid_request_error","code":"amount_too_large","message":"too much"}}`),
			wantClass:   processor.ClassFinal,
			wantRequest: &processor.RequestError{Status: 400, Type: "invalid_request_error", Code: "amount_too_large", Message: "too much"},
		},
		{
			name:        "UnprocessableIsFinal",
			handler:     reply(422, `{"error":{"type":"invalid_request_error","code":"parameter_invalid","message":"bad"}}`),
			wantClass:   processor.ClassFinal,
			wantRequest: &processor.RequestError{Status: 422, Type: "invalid_request_error", Code: "parameter_invalid", Message: "bad"},
		},
		{
			name:        "PlainTextClientErrorKeepsItsBody",
			handler:     reply(400, "400 bad request\n"),
			wantClass:   processor.ClassFinal,
			wantRequest: &processor.RequestError{Status: 400, Message: "400 bad request"},
		},
		{
			name:        "MissingChargeIsFinal",
			handler:     reply(404, `{"error":{"type":"invalid_request_error","code":"resource_missing","param":"id","message":"No such charge: 'ch_9'"}}`),
			wantClass:   processor.ClassFinal,
			wantRequest: &processor.RequestError{Status: 404, Type: "invalid_request_error", Code: "resource_missing", Message: "No such charge: 'ch_9'"},
		},
		// S8: our own configuration refused, never the request's outcome.
		{name: "UnauthorizedIsOurs", handler: reply(401, `{"error":{"type":"invalid_request_error","message":"Invalid API key provided: ****1234"}}`), wantClass: processor.ClassNotExecuted, ours: true},
		{name: "ForbiddenIsOurs", handler: reply(403, `{"error":{"type":"invalid_request_error","message":"This key may not create charges."}}`), wantClass: processor.ClassNotExecuted, ours: true},
		{name: "UnrecognizedURLIsOurs", handler: reply(404, `{"error":{"type":"invalid_request_error","message":"Unrecognized request URL (POST /api/v1/charges)."}}`), wantClass: processor.ClassNotExecuted, ours: true},
		{name: "PlainTextNotFoundIsOurs", handler: reply(404, "404 page not found\n"), wantClass: processor.ClassNotExecuted, ours: true},
		{name: "KeyReusedIsUnknown", handler: reply(400, `{"error":{"type":"idempotency_error","code":"idempotency_key_reused","message":"other parameters"}}`), wantClass: processor.ClassOutcomeUnknown},
		{name: "KeyInUseIsUnknown", handler: reply(409, `{"error":{"type":"idempotency_error","code":"idempotency_key_in_use","message":"in progress"}}`), wantClass: processor.ClassOutcomeUnknown},
		{name: "RateLimitedIsNotExecuted", handler: replyWith(429, "2", `{"error":{"type":"rate_limit_error","message":"slow down"}}`), wantClass: processor.ClassNotExecuted, wantRetryAfter: 2 * time.Second},
		{name: "RequestTimeoutIsUnknown", handler: reply(408, `{"error":{"type":"api_error","message":"timeout"}}`), wantClass: processor.ClassOutcomeUnknown},
		{name: "TooEarlyIsUnknown", handler: reply(425, `{"error":{"type":"api_error","message":"too early"}}`), wantClass: processor.ClassOutcomeUnknown},
		{name: "ServerErrorIsUnknown", handler: reply(500, `{"error":{"type":"api_error","message":"boom"}}`), wantClass: processor.ClassOutcomeUnknown},
		{name: "BadGatewayIsUnknown", handler: reply(502, "bad gateway"), wantClass: processor.ClassOutcomeUnknown},
		{name: "ServiceUnavailableKeepsRetryAfter", handler: replyWith(503, "7", "down"), wantClass: processor.ClassOutcomeUnknown, wantRetryAfter: 7 * time.Second},
		{name: "RedirectIsUnknown", handler: reply(304, ""), wantClass: processor.ClassOutcomeUnknown},
		{name: "UnreadableSuccessIsUnknown", handler: reply(200, `{"id":`), wantClass: processor.ClassOutcomeUnknown},
		// A 2xx that parses but names no charge, or no outcome, tells
		// nothing: taken as final, a success with an empty charge id would
		// have the sweep refund the real charge.
		{name: "EmptySuccessIsUnknown", handler: reply(200, `{}`), wantClass: processor.ClassOutcomeUnknown},
		{name: "SuccessWithoutIDIsUnknown", handler: reply(200, `{"amount":1000,"status":"succeeded"}`), wantClass: processor.ClassOutcomeUnknown},
		{name: "SuccessWithoutStatusIsUnknown", handler: reply(200, `{"id":"ch_1","amount":1000}`), wantClass: processor.ClassOutcomeUnknown},
		{name: "ClosedConnectionIsUnknown", handler: hangUp, wantClass: processor.ClassOutcomeUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(tt.handler)
			t.Cleanup(srv.Close)
			_, err := NewClient(srv.URL, 0).CreateCharge(context.Background(), req, "k1")

			if got := processor.ClassOf(err); got != tt.wantClass {
				t.Errorf("ClassOf(%v) = %v, want %v", err, got, tt.wantClass)
			}
			if got := errors.Is(err, processor.ErrOutcomeUnknown); got != (tt.wantClass == processor.ClassOutcomeUnknown) {
				t.Errorf("errors.Is(%v, ErrOutcomeUnknown) = %v", err, got)
			}
			if got := errors.Is(err, processor.ErrNotExecuted); got != (tt.wantClass == processor.ClassNotExecuted) {
				t.Errorf("errors.Is(%v, ErrNotExecuted) = %v", err, got)
			}
			if got := errors.Is(err, processor.ErrMisconfigured); got != tt.ours {
				t.Errorf("errors.Is(%v, ErrMisconfigured) = %v", err, got)
			}
			if tt.ours && strings.Contains(err.Error(), "1234") {
				t.Errorf("%v carries the processor's message, which may name our key", err)
			}
			if got := processor.RetryAfterOf(err); got != tt.wantRetryAfter {
				t.Errorf("RetryAfterOf = %v, want %v", got, tt.wantRetryAfter)
			}
			var decline *processor.DeclineError
			if errors.As(err, &decline) != (tt.wantDecline != nil) {
				t.Errorf("err = %v, want DeclineError %v", err, tt.wantDecline)
			} else if tt.wantDecline != nil {
				if diff := cmp.Diff(*tt.wantDecline, *decline); diff != "" {
					t.Errorf("decline (-want +got):\n%s", diff)
				}
			}
			var reqErr *processor.RequestError
			if errors.As(err, &reqErr) != (tt.wantRequest != nil) {
				t.Errorf("err = %v, want RequestError %v", err, tt.wantRequest)
			} else if tt.wantRequest != nil {
				if diff := cmp.Diff(*tt.wantRequest, *reqErr); diff != "" {
					t.Errorf("request error (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// A refusal of our configuration is counted on its own, beside its
// not_executed call, so an alert can page on it (S8). Not parallel: it
// reads process-wide counters.
func TestClientCountsRefusalsOfOurConfiguration(t *testing.T) {
	srv := httptest.NewServer(reply(401, `{"error":{"type":"invalid_request_error","message":"Invalid API key."}}`))
	t.Cleanup(srv.Close)
	const op = "POST /v1/charges"
	refused := func() float64 { return counter(t, "processor_misconfigured_calls_total", "op", op) }
	notExecuted := func() float64 { return counter(t, "processor_calls_total", "op", op, "class", "not_executed") }
	beforeRefused, beforeNotExecuted := refused(), notExecuted()
	_, _ = NewClient(srv.URL, 0).CreateCharge(context.Background(), processor.ChargeRequest{Amount: 1, Currency: "EUR", PaymentMethod: "pm_card_visa"}, "k1")
	if got := refused() - beforeRefused; got != 1 {
		t.Errorf("processor_misconfigured_calls_total{op=%q} rose by %v, want 1", op, got)
	}
	if got := notExecuted() - beforeNotExecuted; got != 1 {
		t.Errorf("processor_calls_total{op=%q,class=not_executed} rose by %v, want 1", op, got)
	}
}

// counter reads the counter name{labels...} (name, value pairs) from
// the default registry.
func counter(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for i := 0; i < len(labels); i += 2 {
				if got[labels[i]] != labels[i+1] {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}

// A refused connection proves nothing was sent: not executed, unlike a
// connection that closes after the request went out.
func TestClientRefusedConnectionIsNotExecuted(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	_, err := NewClient(url, 0).CreateCharge(context.Background(), processor.ChargeRequest{Amount: 1, Currency: "EUR", PaymentMethod: "pm_card_visa"}, "k1")
	if got := processor.ClassOf(err); got != processor.ClassNotExecuted {
		t.Errorf("ClassOf(%v) = %v, want not executed", err, got)
	}
}

// Lookups read every page: the charge on the last page is found.
func TestClientListsEveryPage(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var afters []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		after := r.URL.Query().Get("starting_after")
		mu.Lock()
		afters = append(afters, after)
		mu.Unlock()
		switch after {
		case "":
			reply(200, `{"object":"list","data":[{"id":"ch_1","amount":1,"status":"succeeded"},{"id":"ch_2","amount":1,"status":"failed"}],"has_more":true}`)(w, r)
		case "ch_2":
			reply(200, `{"object":"list","data":[{"id":"ch_3","amount":1,"status":"failed"}],"has_more":true}`)(w, r)
		case "ch_3":
			reply(200, `{"object":"list","data":[{"id":"ch_4","amount":1,"status":"succeeded"}],"has_more":false}`)(w, r)
		default:
			reply(400, `{"error":{"type":"invalid_request_error","message":"bad cursor"}}`)(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	charges, err := NewClient(srv.URL, 0).ChargesByIdempotencyKey(context.Background(), "k1")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, ch := range charges {
		ids = append(ids, ch.ID)
	}
	if diff := cmp.Diff([]string{"ch_1", "ch_2", "ch_3", "ch_4"}, ids); diff != "" {
		t.Errorf("charges (-want +got):\n%s", diff)
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff([]string{"", "ch_2", "ch_3"}, afters); diff != "" {
		t.Errorf("starting_after of each page (-want +got):\n%s", diff)
	}
}

func TestClientStopsOnAnEmptyPageThatHasMore(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(reply(200, `{"object":"list","data":[],"has_more":true}`))
	t.Cleanup(srv.Close)
	if _, err := NewClient(srv.URL, 0).RefundsByCharge(context.Background(), "ch_1"); processor.ClassOf(err) == processor.ClassFinal {
		t.Errorf("err = %v, want an unsettled lookup", err)
	}
}

func TestClientSendsTheKeyAndBody(t *testing.T) {
	t.Parallel()
	// The handler hands over what it saw through a channel, so the test
	// reads it with a happens-before edge the race detector can see.
	type seen struct{ key, body string }
	seenc := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seenc <- seen{r.Header.Get("Idempotency-Key"), string(b)}
		reply(200, `{"id":"ch_1","object":"charge","amount":1000,"currency":"EUR","status":"succeeded","idempotency_key":"k1"}`)(w, r)
	}))
	t.Cleanup(srv.Close)

	ch, err := NewClient(srv.URL+"/", 0).CreateCharge(context.Background(),
		processor.ChargeRequest{Amount: 1000, Currency: "EUR", PaymentMethod: "pm_card_visa", Metadata: map[string]string{"payment_id": "p1"}}, "k1")
	if err != nil {
		t.Fatal(err)
	}
	got := <-seenc
	if diff := cmp.Diff(
		[]string{"k1", `{"amount":1000,"currency":"EUR","payment_method":"pm_card_visa","metadata":{"payment_id":"p1"}}`, "ch_1"},
		[]string{got.key, got.body, ch.ID},
	); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestClientRequiresAKey(t *testing.T) {
	t.Parallel()
	_, err := NewClient("http://127.0.0.1:1", 0).Refund(context.Background(), processor.RefundRequest{Charge: "ch_1"}, "")
	if err == nil || processor.ClassOf(err) != processor.ClassNotExecuted {
		t.Errorf("err = %v, want an error before any call, classified not executed", err)
	}
}

func reply(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

func replyWith(status int, retryAfter, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", retryAfter)
		reply(status, body)(w, r)
	}
}

func hangUp(w http.ResponseWriter, _ *http.Request) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	conn.Close()
}

// A lookup answered 2xx with something that is no list ({}, or a list
// without data) is no answer: taken for an empty page, it would read as
// "nothing under this key", and after the settle window the caller would
// send again (found by the schedule explorer).
func TestClientRefusesALookupThatIsNoList(t *testing.T) {
	t.Parallel()
	for _, body := range []string{`{}`, `{"object":"list"}`, `{"data":[]}`, `{"object":"charge","data":[]}`} {
		srv := httptest.NewServer(reply(200, body))
		_, err := NewClient(srv.URL, 0).ChargesByIdempotencyKey(context.Background(), "k1")
		srv.Close()
		if processor.ClassOf(err) != processor.ClassOutcomeUnknown {
			t.Errorf("a lookup answered 200 %s = %v (%v), want outcome unknown", body, err, processor.ClassOf(err))
		}
	}
	srv := httptest.NewServer(reply(200, `{"object":"list","data":[],"has_more":false}`))
	defer srv.Close()
	if charges, err := NewClient(srv.URL, 0).ChargesByIdempotencyKey(context.Background(), "k1"); err != nil || len(charges) != 0 {
		t.Errorf("an empty list = %v, %v; want no charges and no error", charges, err)
	}
}
