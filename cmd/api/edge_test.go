package main

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// The API as it is deployed: behind a reverse proxy (here
// net/http/httputil's, which appends the client's address to
// X-Forwarded-For as a load balancer does) that reaches it from
// 127.0.0.1, with TRUSTED_PROXIES naming it. Clients reach the proxy from
// other addresses of 127.0.0.0/8, all this machine's.

// dialerFrom dials from the local address from.
func dialerFrom(from string) *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
}

// clientFrom is an HTTP client whose connections come from from.
func clientFrom(from string) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: dialerFrom(from).DialContext}}
}

// countingTransport counts the requests the proxy has started forwarding.
type countingTransport struct {
	http.RoundTripper
	started atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.started.Add(1)
	return c.RoundTripper.RoundTrip(r)
}

// startProxy runs a reverse proxy in front of base and returns its
// address and how many requests it has forwarded. Its connections to the
// API come from 127.0.0.1.
func startProxy(t *testing.T, base string) (string, *countingTransport) {
	t.Helper()
	target, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	// A balancer's own pool: as many connections to the API as requests
	// in flight.
	forwarded := &countingTransport{RoundTripper: &http.Transport{DialContext: dialerFrom("127.0.0.1").DialContext, MaxIdleConnsPerHost: 64}}
	proxy.Transport = forwarded
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String(), forwarded
}

// madeUpKey is a well-formed API key of no tenant.
func madeUpKey() string {
	secret := make([]byte, 24)
	_, _ = rand.Read(secret)
	id := uuid.New()
	return "sk_" + hex.EncodeToString(id[:]) + "_" + hex.EncodeToString(secret)
}

// getOrdersStatus sends GET /v1/orders with apiKey through c; extra
// headers are added as given.
func getOrdersStatus(t *testing.T, c *http.Client, base, apiKey string, extra ...string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+"/v1/orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	for i := 0; i+1 < len(extra); i += 2 {
		req.Header.Add(extra[i], extra[i+1])
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// R4, R5 behind a balancer: every client's requests reach the API from the
// proxy's address. With TRUSTED_PROXIES naming it, the budgets kept per
// client see the client behind it: one abusive client is held back alone,
// every tenant is served, a direct client cannot dodge its budget by
// writing X-Forwarded-For, and the proxy may hold more than one address's
// share of the connections.
func TestBehindATrustedProxy(t *testing.T) {
	t.Parallel()
	pool, dbURL := testdb.NewPool(t)
	var keys []string
	for i := range 3 {
		keys = append(keys, runTenantCreate(t, dbURL, fmt.Sprintf("tenant %d", i)))
	}
	// AUTH_CACHE_TTL=0: every request is looked up, as a key is after a
	// restart, for a new tenant, or once the cache's TTL has passed.
	// MAX_CONNECTIONS=8: a share of 4 per address.
	srv := startServer(t, dbURL, "TRUSTED_PROXIES=127.0.0.1", "AUTH_CACHE_TTL=0", "MAX_CONNECTIONS=8")
	proxy, forwarded := startProxy(t, srv.base)

	t.Run("ProxyHoldsMoreThanAShareOfConnections", func(t *testing.T) {
		// Seven creates in flight through the proxy at once (each client
		// sends its body in two parts and waits between them): the proxy
		// opens seven connections to the API, past one address's share of
		// four. Each is answered 201, and seven orders exist.
		const n = 7
		addr := strings.TrimPrefix(proxy, "http://")
		release := make(chan struct{})
		statuses := make(chan string, n)
		for i := range n {
			go func() {
				body := fmt.Sprintf(`{"reference":"held-%d","customer_id":"c","amount":1,"currency":"EUR"}`, i)
				c, err := dialerFrom(fmt.Sprintf("127.0.0.%d", 10+i)).Dial("tcp", addr)
				if err != nil {
					statuses <- err.Error()
					return
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				head := fmt.Sprintf("POST /v1/orders HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nIdempotency-Key: held-%d\r\nContent-Length: %d\r\n\r\n%s",
					keys[0], i, len(body), body[:10])
				_, err = io.WriteString(c, head)
				<-release
				if err == nil {
					_, err = io.WriteString(c, body[10:])
				}
				if err != nil {
					statuses <- err.Error()
					return
				}
				res, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					statuses <- err.Error()
					return
				}
				res.Body.Close()
				statuses <- res.Status
			}()
		}
		// The proxy forwards each request as soon as its header is in;
		// none can finish before its body comes, so once all seven are
		// forwarded, seven connections to the API are open at once.
		testkit.WaitFor(t, 10*time.Second, func() bool { return forwarded.started.Load() >= n })
		close(release)
		for range n {
			if s := <-statuses; s != "201 Created" {
				t.Errorf("a create through the proxy, with others in flight: %s, want 201 Created", s)
			}
		}
		if got := count(t, pool, `SELECT count(*) FROM orders WHERE reference LIKE 'held-%'`); got != n {
			t.Errorf("%d orders after %d creates through the proxy, want %d", got, n, n)
		}
	})

	t.Run("AbusiveClientLocksNoTenantOut", func(t *testing.T) {
		// One client, no tenant, sends made-up keys through the proxy
		// until it is refused: its own budget is spent.
		abuser := clientFrom("127.0.0.20")
		refused := 0
		for range 60 {
			if getOrdersStatus(t, abuser, proxy, madeUpKey()) == http.StatusTooManyRequests {
				refused++
			}
		}
		if refused == 0 {
			t.Fatal("60 made-up keys from one client through the proxy were never refused: its budget is not kept")
		}
		// Every tenant, each on its own address behind the same proxy and
		// none of them cached, is served.
		for i, key := range keys {
			if status := getOrdersStatus(t, clientFrom(fmt.Sprintf("127.0.0.%d", 21+i)), proxy, key); status != http.StatusOK {
				t.Errorf("tenant %d behind the proxy, after another client's flood: %d, want 200", i, status)
			}
		}
	})

	t.Run("DirectClientCannotSpoofItsAddress", func(t *testing.T) {
		// 127.0.0.30 is not a trusted proxy: what it writes in
		// X-Forwarded-For is ignored, and a new address in each request
		// buys it no new budget.
		direct := clientFrom("127.0.0.30")
		unauthorized, refused := 0, 0
		for i := range 60 {
			switch getOrdersStatus(t, direct, srv.base, madeUpKey(), "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i)) {
			case http.StatusUnauthorized:
				unauthorized++
			case http.StatusTooManyRequests:
				refused++
			}
		}
		// Its budget is a burst of 20 and 2 a second: a few more for the
		// seconds the loop takes.
		if refused == 0 || unauthorized > 30 {
			t.Errorf("60 made-up keys, each with a new X-Forwarded-For: %d looked up (401), %d refused (429); want at most 30 looked up", unauthorized, refused)
		}
	})
}

// R4 and slowloris, against the real server: with MAX_CONNECTIONS=16,
// six addresses open every connection they may (four each, 24 in all) and
// never send a request, reopening any the server closes. A quiet client's
// request is answered in about the silent bound (a second), not after
// READ_HEADER_TIMEOUT (30 s here): a connection that has not sent a
// request header is the first to give way. The idle and busy keep-alive
// attackers are internal/connlimit's tests.
func TestServerSilentConnectionsGiveWay(t *testing.T) {
	t.Parallel()
	_, dbURL := testdb.NewPool(t)
	srv := startServer(t, dbURL, "MAX_CONNECTIONS=16", "READ_HEADER_TIMEOUT=30s")
	addr := strings.TrimPrefix(srv.base, "http://")

	var opened atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(stop); wg.Wait() })
	for i := range 6 {
		from := fmt.Sprintf("127.0.0.%d", 40+i)
		for range 4 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					c, err := dialerFrom(from).Dial("tcp", addr)
					if err != nil {
						time.Sleep(10 * time.Millisecond)
						continue
					}
					opened.Add(1)
					holdSilent(c, stop)
					c.Close()
				}
			})
		}
	}
	testkit.WaitFor(t, 10*time.Second, func() bool { return opened.Load() >= 24 })

	quiet := clientFrom("127.0.0.1")
	quiet.Timeout = 10 * time.Second
	start := time.Now()
	res, err := quiet.Get(srv.base + "/healthz")
	t.Logf("the quiet client waited %s", time.Since(start))
	if err != nil {
		t.Fatalf("with every slot held by silent connections, GET /healthz: %v; want 200 within 10s", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("with every slot held by silent connections, GET /healthz = %d, want 200", res.StatusCode)
	}
}

// holdSilent keeps c open without sending anything until the server
// closes it or stop is closed.
func holdSilent(c net.Conn, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
			return
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
