package processor

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The simulator's tests cover the client against the real wire; these pin
// down how each kind of answer is classified, including answers the
// simulator never gives.
func TestClientClassifiesAnswers(t *testing.T) {
	t.Parallel()
	req := ChargeRequest{Amount: 1000, Currency: "EUR", PaymentMethod: "pm_card_visa"}

	tests := []struct {
		name          string
		handler       http.HandlerFunc
		wantTransient bool
		wantDecline   *DeclineError
		wantRequest   *RequestError
	}{
		{
			name:        "DeclineIsFinal",
			handler:     reply(402, `{"error":{"type":"card_error","code":"card_declined","decline_code":"insufficient_funds","message":"Your card was declined.","charge":"ch_1"}}`),
			wantDecline: &DeclineError{Code: "card_declined", DeclineCode: "insufficient_funds", Message: "Your card was declined.", ChargeID: "ch_1"},
		},
		{
			name:        "OtherClientErrorIsFinal",
			handler:     reply(400, `{"error":{"type":"invalid_request_error","code":"amount_too_large","message":"too much"}}`),
			wantRequest: &RequestError{Status: 400, Type: "invalid_request_error", Code: "amount_too_large", Message: "too much"},
		},
		{
			name:        "PlainTextClientErrorKeepsItsBody",
			handler:     reply(404, "404 page not found\n"),
			wantRequest: &RequestError{Status: 404, Message: "404 page not found"},
		},
		{name: "ServerErrorIsTransient", handler: reply(500, `{"error":{"type":"api_error","message":"boom"}}`), wantTransient: true},
		{name: "BadGatewayIsTransient", handler: reply(502, "bad gateway"), wantTransient: true},
		{name: "TooManyRequestsIsTransient", handler: reply(429, `{"error":{"type":"rate_limit_error","message":"slow down"}}`), wantTransient: true},
		{name: "UnreadableSuccessIsTransient", handler: reply(200, `{"id":`), wantTransient: true},
		{name: "ClosedConnectionIsTransient", handler: hangUp, wantTransient: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(tt.handler)
			t.Cleanup(srv.Close)
			_, err := NewClient(srv.URL, 0).CreateCharge(context.Background(), req, "k1")

			if got := errors.Is(err, ErrTransient); got != tt.wantTransient {
				t.Errorf("errors.Is(%v, ErrTransient) = %v, want %v", err, got, tt.wantTransient)
			}
			var decline *DeclineError
			if errors.As(err, &decline) != (tt.wantDecline != nil) {
				t.Errorf("err = %v, want DeclineError %v", err, tt.wantDecline)
			} else if tt.wantDecline != nil {
				if diff := cmp.Diff(*tt.wantDecline, *decline); diff != "" {
					t.Errorf("decline (-want +got):\n%s", diff)
				}
			}
			var reqErr *RequestError
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
		ChargeRequest{Amount: 1000, Currency: "EUR", PaymentMethod: "pm_card_visa", Metadata: map[string]string{"payment_id": "p1"}}, "k1")
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
	_, err := NewClient("http://127.0.0.1:1", 0).Refund(context.Background(), RefundRequest{Charge: "ch_1"}, "")
	if err == nil || errors.Is(err, ErrTransient) {
		t.Errorf("err = %v, want a non-transient error before any call", err)
	}
}

func reply(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

func hangUp(w http.ResponseWriter, _ *http.Request) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	conn.Close()
}
