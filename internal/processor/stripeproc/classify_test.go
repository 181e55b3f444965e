package stripeproc_test

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/processor/stripeproc"
	"github.com/idemref/payments/internal/tooling/stripefake"
)

// Recorded success and processing bodies of POST /v1/payment_intents.
const (
	succeededIntent  = `{"id":"pi_1","object":"payment_intent","amount":1000,"currency":"eur","status":"succeeded","metadata":{"idempotency_key":"k1"},"created":1700000000}`
	processingIntent = `{"id":"pi_1","object":"payment_intent","amount":1000,"currency":"eur","status":"processing","metadata":{"idempotency_key":"k1"},"created":1700000000}`
	declineAnswer    = `{"error":{"type":"card_error","code":"card_declined","decline_code":"insufficient_funds","message":"Your card has insufficient funds.","charge":"ch_1","payment_intent":{"id":"pi_1","object":"payment_intent","amount":1000,"status":"requires_payment_method"}}}`
)

// Every kind of Stripe answer lands in its class (S6), through the
// adapter as the payment machine calls it, each served once by a test
// server that counts the requests: stripe-go's own retries are off, so
// exactly one request is sent whatever the answer.
func TestStripeAnswersAreClassified(t *testing.T) {
	t.Parallel()
	req := processor.ChargeRequest{Amount: 1000, Currency: "EUR", PaymentMethod: "pm_card_visa"}
	tests := []struct {
		name        string
		answer      stripefake.Answer
		want        processor.Class
		wantDecline *processor.DeclineError
		wantCode    string // of a *RequestError
	}{
		{name: "SucceededIsFinal", answer: stripefake.Answer{Status: 200, Body: succeededIntent}, want: processor.ClassFinal},
		{name: "DeclineIsFinal", answer: stripefake.Answer{Status: 402, Body: declineAnswer}, want: processor.ClassFinal,
			wantDecline: &processor.DeclineError{Code: "card_declined", DeclineCode: "insufficient_funds", Message: "Your card has insufficient funds.", ChargeID: "pi_1"}},
		{name: "InvalidRequestIsFinal", answer: stripefake.InvalidRequest, want: processor.ClassFinal, wantCode: "parameter_invalid_integer"},
		{name: "IdempotencyErrorIsUnknown", answer: stripefake.IdempotencyError, want: processor.ClassOutcomeUnknown},
		{name: "ConcurrentSameKey409IsUnknown", answer: stripefake.KeyInUse, want: processor.ClassOutcomeUnknown},
		// The status alone decides: a 409 without Stripe's type or header
		// (a proxy's, a future body) is still a same-key call in flight.
		{name: "Bare409IsUnknown", answer: stripefake.Answer{Status: 409, Body: `{"error":{"type":"invalid_request_error","message":"conflict"}}`}, want: processor.ClassOutcomeUnknown},
		{name: "RateLimitIsNotExecuted", answer: stripefake.RateLimited, want: processor.ClassNotExecuted},
		{name: "ServerErrorIsUnknown", answer: stripefake.ServerError, want: processor.ClassOutcomeUnknown},
		{name: "ServiceUnavailableIsUnknown", answer: stripefake.ServiceUnavailable, want: processor.ClassOutcomeUnknown},
		{name: "PlainTextBadGatewayIsUnknown", answer: stripefake.BadGateway, want: processor.ClassOutcomeUnknown},
		// Stripe-Should-Retry: true says this 400 is not the outcome.
		{name: "ShouldRetryTrueMakesA400Unknown", answer: stripefake.LockTimeout, want: processor.ClassOutcomeUnknown},
		// Stripe-Should-Retry: false says a resend gets the same 500
		// back, never that nothing was charged.
		{name: "ShouldRetryFalseLeavesA500Unknown", answer: stripefake.ServerError, want: processor.ClassOutcomeUnknown},
		{name: "ProcessingIntentIsUnknown", answer: stripefake.Answer{Status: 200, Body: processingIntent}, want: processor.ClassOutcomeUnknown},
		{name: "UnreadableSuccessIsUnknown", answer: stripefake.Answer{Status: 200, Body: `{"id":`}, want: processor.ClassOutcomeUnknown},
		{name: "SuccessWithoutAnIDIsUnknown", answer: stripefake.Answer{Status: 200, Body: `{"object":"payment_intent","amount":1000,"status":"succeeded"}`}, want: processor.ClassOutcomeUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var requests atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				requests.Add(1)
				for k, v := range tt.answer.Header {
					w.Header()[k] = v
				}
				w.WriteHeader(tt.answer.Status)
				_, _ = w.Write([]byte(tt.answer.Body))
			}))
			t.Cleanup(srv.Close)
			_, err := stripeproc.New(stripeproc.Config{APIKey: testKey, URL: srv.URL}).CreateCharge(t.Context(), req, "k1")

			if got := processor.ClassOf(err); got != tt.want {
				t.Errorf("class of %v = %s, want %s", err, got, tt.want)
			}
			if n := requests.Load(); n != 1 {
				t.Errorf("%d requests sent, want 1 (no retries of the library's own)", n)
			}
			var decline *processor.DeclineError
			if errors.As(err, &decline) != (tt.wantDecline != nil) {
				t.Errorf("err = %v, want decline %v", err, tt.wantDecline)
			} else if tt.wantDecline != nil && *decline != *tt.wantDecline {
				t.Errorf("decline = %+v, want %+v", *decline, *tt.wantDecline)
			}
			var rejected *processor.RequestError
			if errors.As(err, &rejected) != (tt.wantCode != "") {
				t.Errorf("err = %v, want a request error %q", err, tt.wantCode)
			} else if tt.wantCode != "" && rejected.Code != tt.wantCode {
				t.Errorf("request error code = %q, want %q", rejected.Code, tt.wantCode)
			}
		})
	}
}

// api_connection_error, as stripe-go has it: no HTTP answer. A refused
// connection sent nothing; a connection closed after the request went out
// may hide a charge.
func TestStripeConnectionErrorsAreClassified(t *testing.T) {
	t.Parallel()
	req := processor.ChargeRequest{Amount: 1000, Currency: "EUR", PaymentMethod: "pm_card_visa"}

	t.Run("RefusedIsNotExecuted", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		url := "http://" + ln.Addr().String()
		ln.Close()
		_, err = stripeproc.New(stripeproc.Config{APIKey: testKey, URL: url}).CreateCharge(t.Context(), req, "k1")
		if got := processor.ClassOf(err); got != processor.ClassNotExecuted {
			t.Errorf("class of %v = %s, want not_executed", err, got)
		}
	})
	t.Run("ClosedAfterSendingIsUnknown", func(t *testing.T) {
		t.Parallel()
		var requests atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			requests.Add(1)
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		}))
		t.Cleanup(srv.Close)
		_, err := stripeproc.New(stripeproc.Config{APIKey: testKey, URL: srv.URL}).CreateCharge(t.Context(), req, "k1")
		if got := processor.ClassOf(err); got != processor.ClassOutcomeUnknown {
			t.Errorf("class of %v = %s, want outcome_unknown", err, got)
		}
		if n := requests.Load(); n != 1 {
			t.Errorf("%d requests reached the server, want 1: nothing may resend on its own", n)
		}
	})
}

// The derived key goes out as Stripe's Idempotency-Key and into the
// PaymentIntent's metadata, where the lookup searches for it.
func TestStripeChargeCarriesTheKeyTwice(t *testing.T) {
	t.Parallel()
	fake := stripefake.Start(t)
	a := stripeproc.New(stripeproc.Config{APIKey: testKey, URL: fake.URL})
	if _, err := a.CreateCharge(t.Context(), processor.ChargeRequest{Amount: 1000, Currency: "EUR", PaymentMethod: stripefake.PaymentMethodVisa,
		Metadata: map[string]string{"payment_id": "p1"}}, "derived-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ChargesByIdempotencyKey(t.Context(), "derived-1"); err != nil {
		t.Fatal(err)
	}
	calls := fake.Calls()
	if len(calls) != 2 {
		t.Fatalf("calls = %+v, want a create and a search", calls)
	}
	create, search := calls[0], calls[1]
	if create.IdempotencyKey != "derived-1" || create.Form.Get("metadata[idempotency_key]") != "derived-1" || create.Form.Get("metadata[payment_id]") != "p1" {
		t.Errorf("create = %+v, want Idempotency-Key and metadata[idempotency_key] derived-1, metadata[payment_id] p1", create)
	}
	if create.Form.Get("confirm") != "true" || create.Form.Get("off_session") != "true" || create.Form.Get("currency") != "eur" {
		t.Errorf("create form = %v, want confirm, off_session, currency eur", create.Form)
	}
	// Neither requires_action nor requires_capture may be left behind.
	if create.Form.Get("error_on_requires_action") != "true" || create.Form.Get("capture_method") != "automatic" {
		t.Errorf("create form = %v, want error_on_requires_action and capture_method automatic", create.Form)
	}
	if q := search.Form.Get("query"); q != "metadata['idempotency_key']:'derived-1'" || !strings.HasPrefix(search.Path, "/v1/payment_intents/search") {
		t.Errorf("search = %s %q", search.Path, q)
	}
}

// S8: Stripe refusing our own configuration (a wrong or revoked secret
// key, a restricted key without the permission, a base URL Stripe has no
// endpoint at) is never the request's outcome: every call is not
// executed, matches processor.ErrMisconfigured, and its error carries
// nothing of Stripe's message (which names our key). A 404 about a
// PaymentIntent that does not exist is the request's own answer: final.
func TestStripeRefusingOurConfigurationIsNotExecuted(t *testing.T) {
	t.Parallel()
	fake := stripefake.Start(t)
	charge := processor.ChargeRequest{Amount: 1000, Currency: "EUR", PaymentMethod: stripefake.PaymentMethodVisa}
	calls := map[string]func(a *stripeproc.Adapter) error{
		"CreateCharge": func(a *stripeproc.Adapter) error {
			_, err := a.CreateCharge(t.Context(), charge, "k-config")
			return err
		},
		"Refund": func(a *stripeproc.Adapter) error {
			_, err := a.Refund(t.Context(), processor.RefundRequest{Charge: "pi_fake000001"}, "k-config-refund")
			return err
		},
		"ChargesByIdempotencyKey": func(a *stripeproc.Adapter) error {
			_, err := a.ChargesByIdempotencyKey(t.Context(), "k-config")
			return err
		},
		"RefundsByCharge": func(a *stripeproc.Adapter) error {
			_, err := a.RefundsByCharge(t.Context(), "pi_fake000001")
			return err
		},
	}
	for _, tt := range []struct {
		name   string
		config stripeproc.Config
		refuse *stripefake.Answer
	}{
		{name: "WrongKey", config: stripeproc.Config{APIKey: "sk_live_wrongkey9876", URL: fake.URL}},
		{name: "KeyWithoutPermission", config: stripeproc.Config{APIKey: testKey, URL: fake.URL}, refuse: &stripefake.Forbidden},
		{name: "UnrecognizedURL", config: stripeproc.Config{APIKey: testKey, URL: fake.URL + "/stripe"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.refuse != nil {
				fake.Refuse(*tt.refuse)
				defer fake.Lift()
			}
			a := stripeproc.New(tt.config)
			for op, call := range calls {
				err := call(a)
				if got := processor.ClassOf(err); got != processor.ClassNotExecuted || !errors.Is(err, processor.ErrMisconfigured) {
					t.Errorf("%s: %v is %s, want not_executed and processor.ErrMisconfigured", op, err, got)
				}
				if err == nil {
					continue
				}
				for _, leak := range []string{"API Key", "9876", "permission", "Unrecognized"} {
					if strings.Contains(err.Error(), leak) {
						t.Errorf("%s: the error %q carries Stripe's message (%q)", op, err, leak)
					}
				}
			}
		})
	}
	if n := len(fake.PaymentIntents()); n != 0 {
		t.Errorf("%d PaymentIntents created, want none", n)
	}

	_, err := stripeproc.New(stripeproc.Config{APIKey: testKey, URL: fake.URL}).Refund(t.Context(), processor.RefundRequest{Charge: "pi_missing"}, "k-missing")
	var rejected *processor.RequestError
	if !errors.As(err, &rejected) || rejected.Code != "resource_missing" {
		t.Errorf("refund of a PaymentIntent that does not exist = %v, want the final resource_missing", err)
	}
}

// A PaymentIntent that stops after its confirm at a state waiting for an
// action nobody here takes (requires_action, requires_capture,
// requires_confirmation) would read as pending forever. The adapter
// cancels it and answers a decline: at once when the create's answer
// shows it, and from the lookup after an answer was lost.
func TestStripeStoppedPaymentIntentEndsAsADecline(t *testing.T) {
	t.Parallel()
	for _, status := range []string{"requires_action", "requires_capture", "requires_confirmation"} {
		t.Run(status, func(t *testing.T) {
			t.Parallel()
			fake := stripefake.Start(t)
			a := stripeproc.New(stripeproc.Config{APIKey: testKey, URL: fake.URL, SearchLag: time.Millisecond})
			req := processor.ChargeRequest{Amount: 1000, Currency: "EUR", PaymentMethod: stripefake.PaymentMethodVisa}

			fake.StopNext(status)
			_, err := a.CreateCharge(t.Context(), req, "k-answered")
			pi := fake.PaymentIntents()[0]
			var declined *processor.DeclineError
			if !errors.As(err, &declined) || declined.ChargeID != pi.ID || declined.DeclineCode != "abandoned" || processor.ClassOf(err) != processor.ClassFinal {
				t.Errorf("CreateCharge = %v, want a final decline (abandoned) of %s", err, pi.ID)
			}
			if pi.Status != "canceled" || pi.CancellationReason != "abandoned" {
				t.Errorf("PaymentIntent %s is %s (%q), want canceled as abandoned", pi.ID, pi.Status, pi.CancellationReason)
			}

			fake.StopNext(status)
			fake.Queue("/v1/payment_intents", stripefake.After, stripefake.ServerError)
			if _, err := a.CreateCharge(t.Context(), req, "k-lost"); processor.ClassOf(err) != processor.ClassOutcomeUnknown {
				t.Fatalf("CreateCharge behind a 500 = %v, want an unknown outcome", err)
			}
			time.Sleep(2 * time.Millisecond) // the search's lag
			charges, err := a.ChargesByIdempotencyKey(t.Context(), "k-lost")
			lost := fake.PaymentIntents()[1]
			if err != nil || len(charges) != 1 || charges[0].ID != lost.ID || charges[0].Status != processor.StatusFailed || charges[0].DeclineCode != "abandoned" {
				t.Errorf("lookup = %+v, %v; want %s failed (abandoned)", charges, err, lost.ID)
			}
			if lost.Status != "canceled" {
				t.Errorf("PaymentIntent %s is %s, want canceled", lost.ID, lost.Status)
			}
			if n := len(fake.PaymentIntents()); n != 2 {
				t.Errorf("%d PaymentIntents, want 2: nothing is created again", n)
			}
		})
	}
}

// A stopped PaymentIntent whose cancel gets no answer is not a decline:
// it may still be whatever it was, so the outcome stays unknown until a
// lookup cancels it.
func TestStripeStoppedPaymentIntentWithoutACancelIsUnknown(t *testing.T) {
	t.Parallel()
	fake := stripefake.Start(t)
	a := stripeproc.New(stripeproc.Config{APIKey: testKey, URL: fake.URL, SearchLag: time.Millisecond})
	fake.StopNext("requires_action")
	fake.Queue("/v1/payment_intents/pi_fake000001/cancel", stripefake.Before, stripefake.ServerError)
	_, err := a.CreateCharge(t.Context(), processor.ChargeRequest{Amount: 1000, Currency: "EUR", PaymentMethod: stripefake.PaymentMethodVisa}, "k-stuck")
	if got := processor.ClassOf(err); got != processor.ClassOutcomeUnknown {
		t.Errorf("CreateCharge with its cancel unanswered = %v (%s), want an unknown outcome", err, got)
	}
	time.Sleep(2 * time.Millisecond) // the search's lag
	if charges, err := a.ChargesByIdempotencyKey(t.Context(), "k-stuck"); err != nil || len(charges) != 1 || charges[0].Status != processor.StatusFailed {
		t.Errorf("lookup = %+v, %v; want the PaymentIntent, canceled: failed", charges, err)
	}
}
