package main

import (
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	paymentsclient "github.com/idemref/payments/client"
	"github.com/idemref/payments/client/api"
	"github.com/idemref/payments/internal/tooling/testdb"
)

// T1 through the Go client: one CreateOrder call, the real server killed
// after its commit and restarted while the client waits to retry. The one
// call returns the replayed order, and there is one order.
func TestClientRetryAcrossServerCrash(t *testing.T) {
	t.Parallel()
	pool, dbURL := testdb.NewPool(t)
	apiKey := runTenantCreate(t, dbURL, "client")
	crashing := startServer(t, dbURL, "FAILPOINTS=idem-after-commit=kill")

	// The restarted server listens on another port: every attempt goes to
	// the server of the moment.
	var current atomic.Pointer[url.URL]
	u, _ := url.Parse(crashing.base)
	current.Store(u)
	route := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.URL.Host = current.Load().Host
		return http.DefaultTransport.RoundTrip(r)
	})
	c, err := paymentsclient.New("http://server", apiKey,
		paymentsclient.WithHTTPClient(&http.Client{Transport: route, Timeout: 10 * time.Second}),
		paymentsclient.WithPolicy(paymentsclient.Policy{
			OnAttempt: func(a paymentsclient.Attempt) {
				if a.N == 1 && a.Retry {
					// The first attempt broke off: the server died after
					// its commit. Bring it back before the retry.
					if !crashing.killedBySIGKILL(t) {
						t.Errorf("server exit: %v, want death by SIGKILL", crashing.cmd.ProcessState)
					}
					next, _ := url.Parse(startServer(t, dbURL).base)
					current.Store(next)
				}
			},
		}))
	if err != nil {
		t.Fatal(err)
	}
	key := paymentsclient.NewKey()
	res, err := c.CreateOrder(t.Context(), key, api.CreateOrderRequest{Reference: "client-crash", CustomerId: "cus_1", Amount: 1999, Currency: "EUR"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Replayed || res.Attempts != 2 || res.Value.Reference != "client-crash" {
		t.Errorf("result: replayed %v after %d attempts, order %+v; want the replay after 2", res.Replayed, res.Attempts, res.Value)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE reference = 'client-crash'`); n != 1 {
		t.Errorf("orders = %d, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM idempotency_keys WHERE idem_key = $1 AND state = 'completed'`, key); n != 1 {
		t.Errorf("completed keys = %d, want 1", n)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
