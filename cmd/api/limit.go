package main

import (
	"net"
	"net/http"
	"net/netip"
	"sync"
)

// connManager is the server's listener. It bounds the connections one
// process holds open (R3), and shares them out so that no client can make
// the API unreachable by holding them (R4). The rule, for each new
// connection:
//
//   - a client address (an IPv4 address, or an IPv6 /64) holds at most
//     perAddressShare(limit) connections: past that, the new connection
//     takes the place of that address's longest-idle connection or, if none
//     of them is idle, is closed at once, unanswered;
//   - at most limit connections are open: at the limit, the new connection
//     takes the place of the longest-idle connection of any address or, if
//     none is idle, waits (Accept waits, the kernel's backlog holds the
//     rest) until one closes or turns idle.
//
// Only an idle keep-alive connection is ever closed to make room: no
// request is in flight on it, and HTTP lets a server close one at any time
// (clients open a new one; Go's retries a request that met such a close if
// it is idempotent or carries an Idempotency-Key). A connection with a
// request in flight, or whose first request has not arrived yet, is never
// closed here; ReadHeaderTimeout, ReadTimeout and WriteTimeout bound those.
//
// The server reports each connection's state through track, which must be
// its http.Server.ConnState.
type connManager struct {
	net.Listener
	limit, share int

	mu      sync.Mutex
	changed *sync.Cond // a connection closed or turned idle
	conns   map[*managedConn]struct{}
	perAddr map[string]int
	idleSeq uint64 // orders idle connections: the smallest idleSince is the longest idle
	closed  bool
}

// managedConn is a connection the manager holds a slot for.
type managedConn struct {
	net.Conn
	m         *connManager
	addr      string // the client address it counts against
	idleSince uint64 // 0 unless idle; guarded by m.mu
}

func newConnManager(l net.Listener, limit int) *connManager {
	m := &connManager{
		Listener: l, limit: limit, share: perAddressShare(limit),
		conns: map[*managedConn]struct{}{}, perAddr: map[string]int{},
	}
	m.changed = sync.NewCond(&m.mu)
	return m
}

// perAddressShare is how many of limit connections one client address may
// hold: a quarter, at least 4, and never every one (unless limit is 1).
func perAddressShare(limit int) int {
	return max(min(max(limit/4, 4), limit-1), 1)
}

func (m *connManager) Accept() (net.Conn, error) {
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
func (m *connManager) admit(c net.Conn) (*managedConn, error) {
	addr := clientAddress(c.RemoteAddr())
	var evicted []*managedConn
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
		case m.perAddr[addr] >= m.share:
			v := m.longestIdle(addr)
			if v == nil {
				c.Close()
				return nil, nil
			}
			m.release(v)
			evicted = append(evicted, v)
		case len(m.conns) >= m.limit:
			if v := m.longestIdle(""); v != nil {
				m.release(v)
				evicted = append(evicted, v)
			} else {
				m.changed.Wait()
			}
		default:
			mc := &managedConn{Conn: c, m: m, addr: addr}
			m.conns[mc] = struct{}{}
			m.perAddr[addr]++
			return mc, nil
		}
	}
}

// longestIdle is the connection idle longest, of addr or (addr == "") of
// any address; nil if none is idle. A scan of at most limit connections,
// made only when a slot must be found.
func (m *connManager) longestIdle(addr string) *managedConn {
	var oldest *managedConn
	for c := range m.conns {
		if c.idleSince == 0 || (addr != "" && c.addr != addr) {
			continue
		}
		if oldest == nil || c.idleSince < oldest.idleSince {
			oldest = c
		}
	}
	return oldest
}

// release frees c's slot, if it still holds one. Called with m.mu held.
func (m *connManager) release(c *managedConn) {
	if _, ok := m.conns[c]; !ok {
		return
	}
	delete(m.conns, c)
	if m.perAddr[c.addr]--; m.perAddr[c.addr] == 0 {
		delete(m.perAddr, c.addr)
	}
	m.changed.Broadcast()
}

// track is the server's ConnState hook: it records which connections are
// idle, and since when.
func (m *connManager) track(c net.Conn, state http.ConnState) {
	mc, ok := c.(*managedConn)
	if !ok {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.conns[mc]; !ok {
		return // evicted, or closed already
	}
	switch state {
	case http.StateIdle:
		m.idleSeq++
		mc.idleSince = m.idleSeq
		m.changed.Broadcast()
	case http.StateClosed:
		m.release(mc)
	default: // new, active, or hijacked (held until the handler closes it)
		mc.idleSince = 0
	}
}

// Close stops Accept, including one waiting for a slot.
func (m *connManager) Close() error {
	m.mu.Lock()
	m.closed = true
	m.changed.Broadcast()
	m.mu.Unlock()
	return m.Listener.Close()
}

// Close gives the slot back (once, however often it is called).
func (c *managedConn) Close() error {
	c.m.mu.Lock()
	c.m.release(c)
	c.m.mu.Unlock()
	return c.Conn.Close()
}

// clientAddress is who a connection counts against: its peer's IP address,
// or its /64 for IPv6, since one client usually holds a whole /64. Behind a
// proxy every client is the proxy.
func clientAddress(a net.Addr) string {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return a.String()
	}
	ip := ap.Addr().Unmap()
	if ip.Is6() {
		p, _ := ip.WithZone("").Prefix(64)
		return p.String()
	}
	return ip.String()
}
