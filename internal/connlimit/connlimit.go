// Package connlimit is the API's listener: it bounds the connections one
// process holds open (R3) and shares them out so that no client can make
// the API unreachable by holding them (R4).
package connlimit

import (
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/idemref/payments/internal/clientaddr"
)

// Listener applies the rule, for each new connection:
//
//   - a client address (an IPv4 address, or an IPv6 /64) holds at most
//     Share(limit) connections: past that, the new connection takes the
//     place of one of that address's connections that may give way (below)
//     or, if none may, is closed at once, unanswered;
//   - at most limit connections are open: at the limit, the new connection
//     takes the place of a connection of any address that may give way or,
//     if none may, waits (Accept waits, the kernel's backlog holds the rest)
//     until one closes or may give way.
//
// Two kinds of connection may give way, in this order:
//
//  1. a silent one: open for longer than Options.Silent without having sent
//     a whole request header (the server has not seen a request on it). A
//     slowloris client that opens connections and sends nothing, or a byte
//     at a time, would otherwise hold its slots until ReadHeaderTimeout;
//     the oldest silent connection goes first.
//  2. an idle keep-alive connection: no request is in flight on it, and
//     HTTP lets a server close one at any time (clients open a new one; Go's
//     retries a request that met such a close if it is idempotent or carries
//     an Idempotency-Key). The one idle longest goes first.
//
// A connection with a request in flight is never closed here;
// ReadTimeout and WriteTimeout bound those.
//
// A trusted proxy (Options.Proxies) is not held to an address's share:
// every client behind it reaches the API over its connections, and at a
// quarter of the slots it would be refused while three quarters are free.
// Fairness between the clients behind a proxy is the proxy's own limits'
// job; the budgets kept per client in the HTTP layer see the real client
// (internal/clientaddr).
//
// The server reports each connection's state through Track, which must be
// its http.Server.ConnState.
type Listener struct {
	net.Listener
	limit, share int
	silent       time.Duration
	proxies      *clientaddr.Resolver
	now          func() time.Time

	mu      sync.Mutex
	changed *sync.Cond // a connection closed, turned idle or went silent
	conns   map[*conn]struct{}
	perAddr map[string]int
	idleSeq uint64 // orders idle connections: the smallest idleSince is the longest idle
	closed  bool
	timer   *time.Timer // wakes a waiting Accept when the oldest silent connection may give way
}

// Options are a Listener's settings beyond its limit.
type Options struct {
	// Silent is how long a new connection may stay without a whole request
	// header before it may give way; zero means DefaultSilent.
	Silent time.Duration
	// Proxies are the trusted proxies, not held to an address's share;
	// nil trusts none.
	Proxies *clientaddr.Resolver
}

// DefaultSilent is long enough for any client that means to send a
// request (a request header is one write), short enough that a slowloris
// flood gives way to a real client within about a second.
const DefaultSilent = time.Second

// conn is a connection the Listener holds a slot for.
type conn struct {
	net.Conn
	l         *Listener
	addr      string    // the client address it counts against; "" for a trusted proxy
	openedAt  time.Time // when it was accepted
	spoke     bool      // the server has seen a request header on it; guarded by l.mu
	idleSince uint64    // 0 unless idle; guarded by l.mu
}

// New returns a Listener over l holding at most limit connections.
func New(l net.Listener, limit int, opts Options) *Listener {
	if opts.Silent <= 0 {
		opts.Silent = DefaultSilent
	}
	m := &Listener{
		Listener: l, limit: limit, share: Share(limit), silent: opts.Silent, proxies: opts.Proxies, now: time.Now,
		conns: map[*conn]struct{}{}, perAddr: map[string]int{},
	}
	m.changed = sync.NewCond(&m.mu)
	return m
}

// Share is how many of limit connections one client address may hold: a
// quarter, at least 4, and never every one (unless limit is 1).
func Share(limit int) int {
	return max(min(max(limit/4, 4), limit-1), 1)
}

// Accept returns the next connection admitted by the rule.
func (m *Listener) Accept() (net.Conn, error) {
	for {
		c, err := m.Listener.Accept()
		if err != nil {
			return nil, err
		}
		mc, err := m.admit(c)
		if err != nil {
			return nil, err
		}
		if mc != nil {
			return mc, nil
		}
		// Refused: on to the next one.
	}
}

// admit applies the rule to a new connection: it returns the connection
// holding its slot, or nil if it was refused (and closed).
func (m *Listener) admit(c net.Conn) (*conn, error) {
	addr := clientaddr.PeerKey(c.RemoteAddr())
	if m.proxies.TrustedPeer(c.RemoteAddr()) {
		addr = ""
	}
	var evicted []*conn
	defer func() {
		// Closed outside the lock; their Close finds them gone already.
		for _, v := range evicted {
			v.Conn.Close()
		}
	}()
	m.mu.Lock()
	defer m.mu.Unlock()
	for {
		switch {
		case m.closed:
			c.Close()
			return nil, net.ErrClosed
		case addr != "" && m.perAddr[addr] >= m.share:
			v := m.mayGiveWay(addr)
			if v == nil {
				c.Close()
				return nil, nil
			}
			m.release(v)
			evicted = append(evicted, v)
		case len(m.conns) >= m.limit:
			if v := m.mayGiveWay(""); v != nil {
				m.release(v)
				evicted = append(evicted, v)
			} else {
				m.wakeWhenSilent()
				m.changed.Wait()
			}
		default:
			mc := &conn{Conn: c, l: m, addr: addr, openedAt: m.now()}
			m.conns[mc] = struct{}{}
			if addr != "" {
				m.perAddr[addr]++
			}
			return mc, nil
		}
	}
}

// mayGiveWay is the connection to close to make room, of addr or (addr ==
// "") of any address: the oldest silent one, else the one idle longest;
// nil if none may give way. A scan of at most limit connections, made only
// when a slot must be found.
func (m *Listener) mayGiveWay(addr string) *conn {
	var silent, idle *conn
	horizon := m.now().Add(-m.silent)
	for c := range m.conns {
		if addr != "" && c.addr != addr {
			continue
		}
		switch {
		case !c.spoke && c.openedAt.Before(horizon):
			if silent == nil || c.openedAt.Before(silent.openedAt) {
				silent = c
			}
		case c.idleSince != 0:
			if idle == nil || c.idleSince < idle.idleSince {
				idle = c
			}
		}
	}
	if silent != nil {
		return silent
	}
	return idle
}

// wakeWhenSilent arranges for a waiting Accept to look again when the
// oldest connection that has not spoken may give way: no event marks that
// moment. Called with m.mu held.
func (m *Listener) wakeWhenSilent() {
	var oldest time.Time
	for c := range m.conns {
		if !c.spoke && (oldest.IsZero() || c.openedAt.Before(oldest)) {
			oldest = c.openedAt
		}
	}
	if oldest.IsZero() || m.timer != nil {
		return
	}
	m.timer = time.AfterFunc(max(oldest.Add(m.silent).Sub(m.now()), time.Millisecond), func() {
		m.mu.Lock()
		m.timer = nil
		m.changed.Broadcast()
		m.mu.Unlock()
	})
}

// release frees c's slot, if it still holds one. Called with m.mu held.
func (m *Listener) release(c *conn) {
	if _, ok := m.conns[c]; !ok {
		return
	}
	delete(m.conns, c)
	if c.addr != "" {
		if m.perAddr[c.addr]--; m.perAddr[c.addr] == 0 {
			delete(m.perAddr, c.addr)
		}
	}
	m.changed.Broadcast()
}

// Track is the server's ConnState hook: it records which connections have
// sent a request, and which are idle, since when.
func (m *Listener) Track(c net.Conn, state http.ConnState) {
	mc, ok := c.(*conn)
	if !ok {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.conns[mc]; !ok {
		return // evicted, or closed already
	}
	switch state {
	case http.StateNew:
		// Accepted: silent until the server reads a request header.
	case http.StateIdle:
		mc.spoke = true
		m.idleSeq++
		mc.idleSince = m.idleSeq
		m.changed.Broadcast()
	case http.StateClosed:
		m.release(mc)
	default: // active, or hijacked (held until the handler closes it)
		mc.spoke = true
		mc.idleSince = 0
	}
}

// Close stops Accept, including one waiting for a slot.
func (m *Listener) Close() error {
	m.mu.Lock()
	m.closed = true
	if m.timer != nil {
		m.timer.Stop()
	}
	m.changed.Broadcast()
	m.mu.Unlock()
	return m.Listener.Close()
}

// Close gives the slot back (once, however often it is called).
func (c *conn) Close() error {
	c.l.mu.Lock()
	c.l.release(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}
