package main

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

	"github.com/idemref/payments/internal/tooling/testdb"
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

// startManaged serves a small handler behind a connManager of limit
// connections; observe, when set, sees every connection state change.
func startManaged(t *testing.T, limit int, observe func(net.Conn, http.ConnState)) string {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := newConnManager(inner, limit)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "served")
		}),
		ConnState: func(c net.Conn, s http.ConnState) {
			m.track(c, s)
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
	addr := startManaged(t, limit, func(c net.Conn, s http.ConnState) {
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
	share := perAddressShare(limit)
	addr := startManaged(t, limit, nil)
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
	ln := newConnManager(inner, 2) // a share of 1 per address
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

// R4, against the real server: with MAX_CONNECTIONS=16 and every slot
// taken by clients that hold idle or busy keep-alive connections and open
// a new one whenever one is closed, a quiet client's request is answered
// within a second.
func TestServerConnectionsGiveWay(t *testing.T) {
	t.Parallel()
	_, url := testdb.NewPool(t)
	srv := startServer(t, url, "MAX_CONNECTIONS=16")
	addr := strings.TrimPrefix(srv.base, "http://")
	var pings []*atomic.Int64
	for i := range 8 {
		every := time.Duration(0) // idle
		if i%2 == 1 {
			every = 20 * time.Millisecond // busy
		}
		pings = append(pings, attack(t, fmt.Sprintf("127.0.0.%d", 2+i), addr, 16, every))
	}
	// Every slot is taken once 16 connections were answered.
	testkit.WaitFor(t, 10*time.Second, func() bool {
		var n int64
		for _, p := range pings {
			n += p.Load()
		}
		return n >= 16
	})

	status, body, waited, err := quietGet(srv.base, "/healthz")
	t.Logf("the quiet client waited %s", waited)
	if err != nil || status != http.StatusOK || !strings.Contains(body, `"ok"`) {
		t.Fatalf("with every slot taken, GET /healthz got %d %q, %v; want 200 within 1s", status, body, err)
	}
}
