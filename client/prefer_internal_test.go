package client

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemref/payments/client/api"
)

// WithPreferWait sends Prefer: wait=N, in whole seconds, on every create
// and on nothing else; without it, no create sends one.
func TestPreferWaitIsSentOnCreatesOnly(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	seen := map[string]string{} // method and path: the Prefer header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Method+" "+r.URL.Path] = r.Header.Get("Prefer")
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusCreated)
		}
		_, _ = w.Write([]byte(`{}` + "\n"))
	}))
	t.Cleanup(srv.Close)
	for _, tt := range []struct {
		name string
		opts []Option
		want string
	}{
		{"WithWait", []Option{WithPreferWait(7500 * time.Millisecond)}, "wait=7"},
		{"Without", nil, ""},
		{"UnderASecond", []Option{WithPreferWait(time.Millisecond)}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(srv.URL, "key", tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			id := uuid.New()
			if _, err := c.CreateOrder(ctx, "", api.CreateOrderRequest{}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.CreatePayment(ctx, "", api.CreatePaymentRequest{}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.CreateRefund(ctx, "", id, api.CreateRefundRequest{}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.GetOrder(ctx, id); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, create := range []string{"POST /v1/orders", "POST /v1/payments", "POST /v1/payments/" + id.String() + "/refunds"} {
				if got := seen[create]; got != tt.want {
					t.Errorf("%s: Prefer = %q, want %q", create, got, tt.want)
				}
			}
			if got := seen["GET /v1/orders/"+id.String()]; got != "" {
				t.Errorf("a read sent Prefer %q", got)
			}
		})
	}
}
