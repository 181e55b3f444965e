package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// R4 behind a balancer that streams request bodies (HAProxy's default, and
// the proxy here): it opens a connection to the API for each request whose
// header it has, and a trusted proxy is not held to one address's share of
// MAX_CONNECTIONS. One client sending slow bodies through it must not hold
// every connection: with MAX_CONNECTIONS=16 (a share of 4), it opens 24
// requests that never finish their body. Past its share each is answered
// 429 at once and its connection closed, and another client behind the
// same proxy is served, not made to wait for READ_TIMEOUT (60 s here).
func TestSlowBodiesThroughAProxyLeaveRoom(t *testing.T) {
	t.Parallel()
	pool, dbURL := testdb.NewPool(t)
	key := runTenantCreate(t, dbURL, "tenant")
	srv := startServer(t, dbURL, "TRUSTED_PROXIES=127.0.0.1", "MAX_CONNECTIONS=16", "READ_TIMEOUT=60s", "WRITE_TIMEOUT=90s")
	proxy, forwarded := startProxy(t, srv.base)
	addr := strings.TrimPrefix(proxy, "http://")

	const slow, share = 24, 4
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range slow {
		wg.Go(func() {
			c, err := dialerFrom("127.0.0.50").Dial("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			go func() { <-stop; c.Close() }()
			_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
			// A header, then ten bytes of a body of a hundred, then nothing.
			head := fmt.Sprintf("POST /v1/orders HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nIdempotency-Key: slow-%d\r\nContent-Length: 100\r\n\r\n{\"referen", key, i)
			if _, err := io.WriteString(c, head); err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, c) // until the test ends
		})
	}
	t.Cleanup(func() { close(stop); wg.Wait() })
	testkit.WaitFor(t, 10*time.Second, func() bool { return forwarded.started.Load() >= slow })

	// Another client behind the same proxy.
	start := time.Now()
	body := `{"reference":"patient","customer_id":"c","amount":1,"currency":"EUR"}`
	req, err := http.NewRequest(http.MethodPost, proxy+"/v1/orders", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "patient")
	c := clientFrom("127.0.0.51")
	c.Timeout = 20 * time.Second
	res, err := c.Do(req)
	if err != nil {
		t.Fatalf("a create behind the proxy while another client holds %d slow bodies: %v (after %s)", slow, err, time.Since(start).Round(time.Millisecond))
	}
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Errorf("a create behind the proxy while another client holds slow bodies: %s, want 201 Created", res.Status)
	}
	t.Logf("a create behind the proxy while another client holds %d slow bodies: %s in %s", slow, res.Status, time.Since(start).Round(time.Millisecond))
	if got := count(t, pool, `SELECT count(*) FROM orders WHERE reference = 'patient'`); got != 1 {
		t.Errorf("%d orders 'patient', want 1", got)
	}

	// Past its share, every slow request was answered at once (the API's
	// access log says so: the proxy here relays an answer only once it has
	// sent the whole body, which never comes), and nothing of it written.
	refused := func() int {
		n := 0
		for _, l := range srv.logLines() {
			if strings.Contains(l, `"status":429`) && strings.Contains(l, `"code":"rate_limited"`) {
				n++
			}
		}
		return n
	}
	testkit.WaitFor(t, 10*time.Second, func() bool { return refused() >= slow-share })
	if n := refused(); n != slow-share {
		t.Errorf("%d of the %d slow bodies were answered 429, want the %d past the share", n, slow, slow-share)
	}
	if got := count(t, pool, `SELECT count(*) FROM idempotency_keys WHERE idem_key LIKE 'slow-%'`); got != 0 {
		t.Errorf("%d keys of slow requests recorded, want 0", got)
	}
}
