package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// R4 behind HAProxy with its default settings, which stream request
// bodies: it opens a connection to the API for each request whose header
// it has, and a trusted proxy is not held to one address's share of
// MAX_CONNECTIONS. One client sending slow bodies through it must not hold
// every connection: with MAX_CONNECTIONS=16 (a share of 4) it opens 24
// requests that never finish their body. Past its share each is answered
// 429 at once and its connection closed (the unread body is not waited
// for), and another client behind the same proxy, and a client reaching
// the API directly, are served, not made to wait for READ_TIMEOUT (60 s
// here).
func TestSlowBodiesThroughAProxyLeaveRoom(t *testing.T) {
	t.Parallel()
	pool, dbURL := testdb.NewPool(t)
	key := runTenantCreate(t, dbURL, "tenant")
	slowKey := runTenantCreate(t, dbURL, "slow tenant")
	srv := startServer(t, dbURL, "TRUSTED_PROXIES=127.0.0.1", "MAX_CONNECTIONS=16", "READ_TIMEOUT=60s", "WRITE_TIMEOUT=90s")
	proxy := startHAProxy(t, strings.TrimPrefix(srv.base, "http://"))

	const slow, share = 24, 4
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range slow {
		wg.Go(func() {
			c, err := dialerFrom("127.0.0.50").Dial("tcp", proxy)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			go func() { <-stop; c.Close() }()
			// A header, then ten bytes of a body of a hundred, then nothing.
			head := fmt.Sprintf("POST /v1/orders HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nIdempotency-Key: slow-%d\r\nContent-Length: 100\r\n\r\n{\"referen", slowKey, i)
			if _, err := io.WriteString(c, head); err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, c) // until the test ends
		})
	}
	t.Cleanup(func() { close(stop); wg.Wait() })
	time.Sleep(time.Second) // HAProxy forwards each header within milliseconds

	for name, send := range map[string]func() (*http.Response, error){
		"ACreateBehindTheProxy": func() (*http.Response, error) {
			body := `{"reference":"patient","customer_id":"c","amount":1,"currency":"EUR"}`
			req, err := http.NewRequest(http.MethodPost, "http://"+proxy+"/v1/orders", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+key)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", "patient")
			return clientWithin("127.0.0.51", 10*time.Second).Do(req)
		},
		"AHealthCheckReachingTheAPIDirectly": func() (*http.Response, error) {
			return clientWithin("127.0.0.52", 10*time.Second).Get(srv.base + "/healthz")
		},
	} {
		start := time.Now()
		res, err := send()
		if err != nil {
			t.Fatalf("%s while another client holds %d slow bodies: %v (after %s)", name, slow, err, time.Since(start).Round(time.Millisecond))
		}
		res.Body.Close()
		if res.StatusCode >= 300 {
			t.Errorf("%s while another client holds slow bodies: %s", name, res.Status)
		}
		t.Logf("%s while another client holds %d slow bodies: %s in %s", name, slow, res.Status, time.Since(start).Round(time.Millisecond))
	}
	if got := count(t, pool, `SELECT count(*) FROM orders WHERE reference = 'patient'`); got != 1 {
		t.Errorf("%d orders 'patient', want 1", got)
	}

	// Past its share, every slow request was answered at once (the API's
	// access log says so), and nothing of it was written.
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

// clientWithin is clientFrom(from) that gives up after timeout.
func clientWithin(from string, timeout time.Duration) *http.Client {
	c := clientFrom(from)
	c.Timeout = timeout
	return c
}

// startHAProxy runs Debian's HAProxy with its default settings (bodies
// streamed, server connections reused, X-Forwarded-For appended) in front
// of api, and returns the address it listens on. Its connections to the
// API come from 127.0.0.1.
func startHAProxy(t *testing.T, api string) string {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Fatal("this test runs HAProxy: apt-get install haproxy (.ci/run does)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := filepath.Join(t.TempDir(), "haproxy.cfg")
	config := fmt.Sprintf(`defaults
  mode http
  timeout connect 5s
  timeout client 2m
  timeout server 2m
  option forwardfor
frontend api
  bind %s
  default_backend api
backend api
  server api %s
`, addr, api)
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-f", cfg, "-db")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("haproxy's output:\n%s", out.String())
		}
	})
	testkit.WaitFor(t, 10*time.Second, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return addr
}
