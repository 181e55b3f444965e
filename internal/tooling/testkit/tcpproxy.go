package testkit

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/db"
)

// DatabaseProxy puts a TCP proxy the test can cut between a pool and the
// database at databaseURL, and returns the proxy and a pool configuration
// that connects through it. The proxy dials the database however the URL
// reaches it: host:port, or a Unix socket directory.
func DatabaseProxy(t testing.TB, databaseURL string) (*TCPProxy, *pgxpool.Config) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		t.Fatalf("parse database URL: %v", err)
	}
	db.Configure(cfg)
	network, target := "tcp", net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	if strings.HasPrefix(cfg.ConnConfig.Host, "/") {
		network, target = "unix", fmt.Sprintf("%s/.s.PGSQL.%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	}
	p := newTCPProxy(t, network, target)
	host, port, _ := net.SplitHostPort(p.Addr())
	n, _ := strconv.ParseUint(port, 10, 16)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(n)
	cfg.ConnConfig.Fallbacks = nil
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	return p, cfg
}

// TCPProxy forwards connections from a local port to target. Cut closes
// the listener and every open connection, so the pool behind it sees the
// database vanish; Restore listens on the same address again.
type TCPProxy struct {
	t       testing.TB
	network string
	target  string
	addr    string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// newTCPProxy starts a proxy on a free port of 127.0.0.1 to target (an
// address on network), stopped when the test ends.
func newTCPProxy(t testing.TB, network, target string) *TCPProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &TCPProxy{t: t, network: network, target: target, addr: ln.Addr().String(), conns: map[net.Conn]struct{}{}}
	p.serve(ln)
	t.Cleanup(func() {
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Addr is the host:port to connect to instead of the target.
func (p *TCPProxy) Addr() string { return p.addr }

func (p *TCPProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			down, err := ln.Accept()
			if err != nil {
				return // listener closed by Cut
			}
			up, err := net.DialTimeout(p.network, p.target, 5*time.Second)
			if err != nil {
				down.Close()
				continue
			}
			if !p.track(down, up) {
				continue
			}
			p.wg.Add(2)
			go p.pipe(down, up)
			go p.pipe(up, down)
		}
	}()
}

// track registers a connection pair, or closes it if the proxy was cut in
// the meantime.
func (p *TCPProxy) track(down, up net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		down.Close()
		up.Close()
		return false
	}
	p.conns[down] = struct{}{}
	p.conns[up] = struct{}{}
	return true
}

func (p *TCPProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	// One direction ended: end the pair, as a broken link would.
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// Cut closes the listener (new connections are refused) and every
// connection in flight.
func (p *TCPProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// Restore listens on the same address again.
func (p *TCPProxy) Restore() {
	p.t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("proxy listen again on %s: %v", p.addr, err)
	}
	p.serve(ln)
}
