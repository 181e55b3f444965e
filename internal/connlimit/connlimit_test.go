package connlimit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemref/payments/internal/clientaddr"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// The tests below play several clients from one machine: every address of
// 127.0.0.0/8 is local, so a connection dialled from 127.0.0.2 is another
// client address than one from 127.0.0.1.

// dialFrom opens a connection to addr from the local address from.
func dialFrom(from, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	return d.Dial("tcp", addr)
}

// heldConn is a keep-alive connection an attacker holds.
type heldConn struct {
	net.Conn
	br *bufio.Reader
}

func holdFrom(from, addr string) (*heldConn, error) {
	c, err := dialFrom(from, addr)
	if err != nil {
		return nil, err
	}
	h := &heldConn{Conn: c, br: bufio.NewReader(c)}
	if err := h.ping(); err != nil {
		c.Close()
		return nil, err
	}
	return h, nil
}

// ping sends one GET /healthz on the connection and reads its answer,
// leaving the connection open (idle) afterwards.
func (h *heldConn) ping() error {
	if err := h.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return err
	}
	if _, err := io.WriteString(h, "GET /healthz HTTP/1.1\r\nHost: api\r\n\r\n"); err != nil {
		return err
	}
	res, err := http.ReadResponse(h.br, nil)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if err == nil && res.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %d", res.StatusCode)
	}
	return err
}

// attack keeps n connections from one address open to addr until the test
// ends, the way a client trying to hold every slot would: each is opened,
// used once, then either left idle (every == 0) or used again every
// `every` to keep it busy; whenever the server closes or refuses one, it
// is opened again at once. It returns the count of answered requests.
func attack(t *testing.T, from, addr string, n int, every time.Duration) *atomic.Int64 {
	var pings atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	for range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				if h, err := holdFrom(from, addr); err == nil {
					pings.Add(1)
					stop := context.AfterFunc(ctx, func() { h.Close() })
					if every == 0 {
						// Idle until the server closes it.
						_ = h.SetDeadline(time.Time{})
						_, _ = h.br.ReadByte()
					} else {
						for ctx.Err() == nil && h.ping() == nil {
							pings.Add(1)
							time.Sleep(every)
						}
					}
					stop()
					h.Close()
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	return &pings
}

// quietGet is the other client: one GET from 127.0.0.1 on a new
// connection, which must be answered within a second.
func quietGet(base, path string) (status int, body string, waited time.Duration, err error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}
	client := &http.Client{
		Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true},
		Timeout:   time.Second,
	}
	start := time.Now()
	res, err := client.Get(base + path)
	if err != nil {
		return 0, "", time.Since(start), err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, string(b), time.Since(start), err
}

// startManaged serves a small handler behind a Listener of limit
// connections, silent ones giving way after silent (0: DefaultSilent); observe, when set, sees every connection state change.
func startManaged(t *testing.T, limit int, silent time.Duration, observe func(net.Conn, http.ConnState)) string {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := New(inner, limit, Options{Silent: silent})
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "served")
		}),
		ConnState: func(c net.Conn, s http.ConnState) {
			m.Track(c, s)
			if observe != nil {
				observe(c, s)
			}
		},
	}
	go func() { _ = srv.Serve(m) }()
	t.Cleanup(func() { srv.Close() })
	return inner.Addr().String()
}

// R4: with every slot held by idle keep-alive connections, a new client is
// served at once, and the connection closed to make room for it is the
// one idle longest.
func TestConnLimitIdleGiveWay(t *testing.T) {
	t.Parallel()
	const limit = 8 // a share of 4 per address
	var mu sync.Mutex
	idle := map[net.Conn]bool{}
	addr := startManaged(t, limit, 0, func(c net.Conn, s http.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		idle[c] = s == http.StateIdle
	})
	idleCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, i := range idle {
			if i {
				n++
			}
		}
		return n
	}
	// Two addresses take every slot, one connection after the other, each
	// idle (as the server sees it) before the next is opened.
	var held []*heldConn
	for i := range limit {
		h, err := holdFrom(fmt.Sprintf("127.0.0.%d", 2+i/4), addr)
		if err != nil {
			t.Fatalf("attacker connection %d: %v", i, err)
		}
		t.Cleanup(func() { h.Close() })
		held = append(held, h)
		testkit.WaitFor(t, 5*time.Second, func() bool { return idleCount() == i+1 })
	}

	status, body, waited, err := quietGet("http://"+addr, "/")
	t.Logf("the quiet client waited %s", waited)
	if err != nil || status != http.StatusOK || body != "served" {
		t.Fatalf("with every slot idle, a new client got %d %q, %v; want 200 \"served\" within 1s", status, body, err)
	}
	// The oldest idle connection gave way; the others still serve.
	_ = held[0].SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := held[0].br.ReadByte(); !errors.Is(err, io.EOF) && !isReset(err) {
		t.Errorf("the oldest idle connection: read %v, want it closed", err)
	}
	for i, h := range held[1:] {
		if err := h.ping(); err != nil {
			t.Errorf("idle connection %d, younger than the one closed: %v", i+1, err)
		}
	}
}

func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

// R4: one address keeping its connections busy (a request every few
// milliseconds, opening a new one whenever one is closed) holds no more
// than its share, and another client is served meanwhile.
func TestConnLimitPerAddress(t *testing.T) {
	t.Parallel()
	const limit = 8
	share := Share(limit)
	addr := startManaged(t, limit, 0, nil)
	pings := attack(t, "127.0.0.2", addr, limit, 5*time.Millisecond)
	testkit.WaitFor(t, 5*time.Second, func() bool { return pings.Load() >= 100 })

	status, body, waited, err := quietGet("http://"+addr, "/")
	t.Logf("the quiet client waited %s", waited)
	if err != nil || status != http.StatusOK || body != "served" {
		t.Fatalf("under a pinging client, a new client got %d %q, %v; want 200 \"served\" within 1s", status, body, err)
	}

	// The attacker opens every connection it can and checks which of them
	// the server still answers on: no more than the share.
	var conns []*heldConn
	for range limit {
		if h, err := holdFrom("127.0.0.3", addr); err == nil {
			conns = append(conns, h)
			t.Cleanup(func() { h.Close() })
		}
	}
	answered := 0
	for _, h := range conns {
		if h.ping() == nil {
			answered++
		}
	}
	if answered > share {
		t.Errorf("one address holds %d open connections out of %d, want at most its share, %d", answered, limit, share)
	}
	if answered == 0 {
		t.Error("one address holds no connection at all")
	}
}

// R3: at the limit, with no connection idle, Accept waits until one
// closes; a connection beyond its address's share, with none of that
// address's connections idle, is closed at once; a second Close frees no
// second slot.
func TestConnLimitWaitsWhileEveryConnectionIsBusy(t *testing.T) {
	t.Parallel()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := New(inner, 2, Options{Silent: time.Hour}) // a share of 1 per address
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func(from string) net.Conn {
		t.Helper()
		c, err := dialFrom(from, inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// Without an http.Server no connection ever turns idle: they are all
	// busy as far as the manager knows.
	dial("127.0.0.2")
	dial("127.0.0.3")
	first, second := <-accepted, <-accepted
	dial("127.0.0.4")
	select {
	case <-accepted:
		t.Fatal("a third connection was accepted while two were open and busy")
	case <-time.After(200 * time.Millisecond): // proving a negative needs a bound
	}
	refused := dial("127.0.0.3") // 127.0.0.3 already holds its share
	first.Close()
	first.Close() // a second Close must not free a second slot
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the third connection was not accepted after one closed")
	}
	_ = refused.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := refused.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !isReset(err) {
		t.Errorf("a connection past its address's share: read %v, want it closed", err)
	}
	select {
	case c := <-accepted:
		t.Fatalf("a connection from %s was accepted past its address's share or the limit", c.RemoteAddr())
	case <-time.After(200 * time.Millisecond):
	}
	second.Close()
}

// R4, slowloris: five addresses open every connection they may and send
// nothing, or a request header a byte at a time, never finishing it. A
// client on a sixth address is answered: the oldest silent connection
// gives way to it once it has been silent for the Silent bound, without
// waiting for ReadHeaderTimeout (the test's server has none).
func TestSilentConnectionsGiveWay(t *testing.T) {
	t.Parallel()
	const limit = 40 // a share of 10 per address: five addresses can fill it
	const silent = 200 * time.Millisecond
	addr := startManaged(t, limit, silent, nil)
	var held []net.Conn
	for i := range 5 * Share(limit) {
		c, err := dialFrom(fmt.Sprintf("127.0.0.%d", 2+i%5), addr)
		if err != nil {
			t.Fatalf("silent connection %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		if i%2 == 0 {
			// Half of them trickle an unfinished header.
			if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: api\r\nX-Slow: "); err != nil {
				t.Fatal(err)
			}
		}
		held = append(held, c)
	}
	// Every slot is taken by a silent connection (or they wait in the
	// backlog) when the real client comes.
	status, body, waited, err := quietGet("http://"+addr, "/")
	t.Logf("the quiet client waited %s", waited)
	if err != nil || status != http.StatusOK || body != "served" {
		t.Fatalf("with every slot held by silent connections, a new client got %d %q, %v; want 200 \"served\" within 1s", status, body, err)
	}
	// Some silent connection was closed to make room: the first one of
	// its address to have been accepted is among the oldest.
	closed := 0
	for _, c := range held {
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); errors.Is(err, io.EOF) || isReset(err) {
			closed++
		}
	}
	if closed == 0 {
		t.Error("no silent connection was closed, yet the new client was served")
	}
}

// R4 behind a balancer: every request reaches the API through the proxy's
// connections. A trusted proxy holds more than an address's share (12
// requests in flight at once, three shares); an address that is not
// trusted is still held to its share.
func TestTrustedProxyIsNotHeldToAShare(t *testing.T) {
	t.Parallel()
	const limit = 16 // a share of 4
	proxies, err := clientaddr.Parse("127.0.0.2", clientaddr.XForwardedFor)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := New(inner, limit, Options{Proxies: proxies})
	release := make(chan struct{})
	var inFlight atomic.Int64
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inFlight.Add(1)
			<-release
			_, _ = io.WriteString(w, "served")
		}),
		ConnState: m.Track,
	}
	go func() { _ = srv.Serve(m) }()
	t.Cleanup(func() { srv.Close() })
	addr := inner.Addr().String()

	send := func(from string) <-chan error {
		done := make(chan error, 1)
		go func() {
			c, err := dialFrom(from, addr)
			if err != nil {
				done <- err
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: api\r\n\r\n"); err != nil {
				done <- err
				return
			}
			res, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err == nil {
				res.Body.Close()
				if res.StatusCode != http.StatusOK {
					err = fmt.Errorf("status %d", res.StatusCode)
				}
			}
			done <- err
		}()
		return done
	}
	var viaProxy, direct []<-chan error
	for range 3 * Share(limit) {
		viaProxy = append(viaProxy, send("127.0.0.2"))
	}
	testkit.WaitFor(t, 5*time.Second, func() bool { return inFlight.Load() == 3*int64(Share(limit)) })
	// 127.0.0.3 is not trusted: it fills its share, and past it a
	// connection is refused, none of its own being idle.
	for range Share(limit) {
		direct = append(direct, send("127.0.0.3"))
	}
	testkit.WaitFor(t, 5*time.Second, func() bool { return inFlight.Load() == limit })
	if err := <-send("127.0.0.3"); err == nil {
		t.Error("a connection from an untrusted address past its share was served")
	}
	close(release)
	for i, done := range viaProxy {
		if err := <-done; err != nil {
			t.Errorf("request %d through the trusted proxy: %v, want it served", i, err)
		}
	}
	for i, done := range direct {
		if err := <-done; err != nil {
			t.Errorf("direct request %d, within its share: %v, want it served", i, err)
		}
	}
}
