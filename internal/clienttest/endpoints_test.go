package clienttest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/idemref/payments/client"
	"github.com/idemref/payments/client/api"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
)

// sent is one request as the server would scope its key: the endpoint
// the router matched (method plus route template) and the key.
type sent struct{ endpoint, key string }

// tableServer routes exactly the endpoints of httpapi.Endpoints, the way the
// server does, and records what each request matched; any other request is
// 404.
func tableServer(t *testing.T) (*httptest.Server, func() []sent) {
	t.Helper()
	var (
		mu   sync.Mutex
		seen []sent
	)
	r := chi.NewRouter()
	for _, e := range httpapi.Endpoints {
		r.Method(e.Method, e.Route, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			mu.Lock()
			seen = append(seen, sent{req.Method + " " + chi.RouteContext(req.Context()).RoutePattern(), req.Header.Get(idem.HeaderName)})
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{}`))
		}))
	}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return srv, func() []sent {
		mu.Lock()
		defer mu.Unlock()
		return append([]sent(nil), seen...)
	}
}

// The client lives apart from the server's packages (a fork may publish it
// alone), so its endpoints are checked against httpapi.Endpoints here: every
// operation that sends an Idempotency-Key sends it to an endpoint of the
// table, under the name the client gives that endpoint (its key-status
// lookups and errors use it), and every endpoint of the table has such an
// operation.
func TestIdempotentOperationsFollowTable(t *testing.T) {
	t.Parallel()
	srv, requests := tableServer(t)
	c, err := client.New(srv.URL, "sk_test")
	if err != nil {
		t.Fatal(err)
	}
	ops := []struct {
		endpoint string // the name the client uses
		call     func(ctx context.Context, key string) error
	}{
		{client.EndpointCreateOrder, func(ctx context.Context, key string) error {
			_, err := c.CreateOrder(ctx, key, api.CreateOrderRequest{})
			return err
		}},
		{client.EndpointCreatePayment, func(ctx context.Context, key string) error {
			_, err := c.CreatePayment(ctx, key, api.CreatePaymentRequest{})
			return err
		}},
		{client.EndpointCreateRefund, func(ctx context.Context, key string) error {
			_, err := c.CreateRefund(ctx, key, uuid.New(), api.CreateRefundRequest{})
			return err
		}},
	}
	covered := map[string]bool{}
	for _, op := range ops {
		key := "k-" + uuid.NewString()
		if err := op.call(t.Context(), key); err != nil {
			t.Errorf("%s: %v (sent to a route httpapi.Endpoints does not list?)", op.endpoint, err)
			continue
		}
		got := requests()
		if last, want := got[len(got)-1], (sent{op.endpoint, key}); last != want {
			t.Errorf("the operation named %s sent %+v, want %+v", op.endpoint, last, want)
		}
		covered[op.endpoint] = true
	}
	for _, e := range httpapi.Endpoints {
		if !covered[e.String()] {
			t.Errorf("the client has no operation for %s", e)
		}
	}
}
