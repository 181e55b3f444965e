package pgwire

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"
)

// Counts is what the proxy counted over some stretch of traffic.
type Counts struct {
	// Connections is the number of connections opened.
	Connections int64
	// RoundTrips is the number of times a client waited on the server
	// (see the package documentation for the exact rule).
	RoundTrips int64
	// Statements is the number of simple Query and Execute messages.
	Statements int64
	// Opaque is the number of connections whose traffic could not be read
	// (encrypted, or framing lost) and went uncounted from then on.
	Opaque int64
}

// Sub returns c minus before: the counts of what happened in between.
func (c Counts) Sub(before Counts) Counts {
	return Counts{
		Connections: c.Connections - before.Connections,
		RoundTrips:  c.RoundTrips - before.RoundTrips,
		Statements:  c.Statements - before.Statements,
		Opaque:      c.Opaque - before.Opaque,
	}
}

func (c *Counts) add(d Counts) {
	c.Connections += d.Connections
	c.RoundTrips += d.RoundTrips
	c.Statements += d.Statements
	c.Opaque += d.Opaque
}

// ConnCounts is one connection's counts since it opened or since the last
// Reset.
type ConnCounts struct {
	// ID numbers connections in the order the proxy accepted them, from 1.
	ID int
	Counts
	// Closed reports whether the connection has ended.
	Closed bool
}

// Snapshot is the proxy's counts at one moment.
type Snapshot struct {
	Total Counts
	// Conns has one entry per connection open at the last Reset or opened
	// since, ordered by ID.
	Conns []ConnCounts
}

// Statement is one statement a client ran, recorded when recording is on.
type Statement struct {
	Conn int
	// RoundTrip is the connection's round trip the statement was sent in,
	// numbered from 1 since the connection opened: statements that share
	// a number were pipelined together.
	RoundTrip int64
	// Kind is 'Q' (simple query) or 'E' (extended-protocol Execute).
	Kind byte
	// SQL is the statement's text (for 'E', the text of the prepared
	// statement behind the executed portal; empty if it was prepared
	// before recording could see it).
	SQL string
}

// Proxy is a counting TCP proxy in front of one PostgreSQL server, which
// can also cut a connection at its COMMIT (CutAtCommit).
type Proxy struct {
	upstream string
	ln       net.Listener

	mu         sync.Mutex
	total      Counts
	conns      map[int]*conn
	nextID     int
	recording  bool
	statements []Statement
	lastActive time.Time
	// cut is what CutAtCommit armed; zero when nothing is armed.
	cut CutMode

	wg sync.WaitGroup
}

// Listen starts a proxy on a free port of 127.0.0.1 that forwards every
// connection to upstream (host:port of a PostgreSQL server).
func Listen(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("pgwire: listen: %w", err)
	}
	p := &Proxy{upstream: upstream, ln: ln, conns: map[int]*conn{}, lastActive: time.Now()}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the proxy's address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns databaseURL (postgres://...) pointed at the proxy, with
// sslmode=disable so that the traffic stays readable. It does not check
// that databaseURL names the proxy's upstream.
func (p *Proxy) URL(databaseURL string) (string, error) {
	u, err := url.Parse(databaseURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", errors.New("pgwire: want a postgres:// URL")
	}
	u.Host = p.Addr()
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// Close stops accepting, ends every proxied connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.closeBoth()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// Snapshot returns the counts so far (since the last Reset).
func (p *Proxy) Snapshot() Snapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Snapshot{Total: p.total, Conns: make([]ConnCounts, 0, len(p.conns))}
	for _, c := range p.conns {
		s.Conns = append(s.Conns, ConnCounts{ID: c.id, Counts: c.counts, Closed: c.closed})
	}
	sort.Slice(s.Conns, func(i, j int) bool { return s.Conns[i].ID < s.Conns[j].ID })
	return s
}

// Reset zeroes every count, forgets closed connections and drops the
// recorded statements. Open connections stay, with zero counts.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.total = Counts{}
	for id, c := range p.conns {
		c.counts = Counts{}
		if c.closed {
			delete(p.conns, id)
		}
	}
	p.statements = nil
}

// Record turns recording of statement texts on or off. Recording keeps
// every statement until the next Reset, so leave it off under load.
func (p *Proxy) Record(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.recording = on
}

// Statements returns the statements recorded since the last Reset.
func (p *Proxy) Statements() []Statement {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Statement(nil), p.statements...)
}

// WaitQuiet returns once no byte has passed through the proxy for quiet,
// or when ctx ends. A caller measuring one request uses it to let traffic
// that outlives the response (a connection going back to its pool) land
// in the right window.
func (p *Proxy) WaitQuiet(ctx context.Context, quiet time.Duration) error {
	for {
		p.mu.Lock()
		idle := time.Since(p.lastActive)
		p.mu.Unlock()
		if idle >= quiet {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(quiet - idle):
		}
	}
}

// settleTime is how long Measure waits for the traffic to stop.
const settleTime = 20 * time.Millisecond

// Measure runs fn and returns the counts of the traffic through the proxy
// from its start until the traffic settles after it (no byte for 20 ms).
// Traffic of anyone else using the proxy meanwhile is counted too: measure
// one request at a time, on a proxy nothing else is busy on.
func (p *Proxy) Measure(ctx context.Context, fn func() error) (Counts, error) {
	before := p.Snapshot().Total
	if err := fn(); err != nil {
		return Counts{}, err
	}
	if err := p.WaitQuiet(ctx, settleTime); err != nil {
		return Counts{}, err
	}
	return p.Snapshot().Total.Sub(before), nil
}

// CutMode says what CutAtCommit does with the COMMIT it cuts at.
type CutMode int

const (
	// CommitDelivered lets the COMMIT reach the server, which commits,
	// and holds back every answer from then on: the client never learns
	// that its transaction committed.
	CommitDelivered CutMode = iota + 1
	// CommitDropped holds the COMMIT back: the server never sees it and
	// rolls the transaction back when the connection closes.
	CommitDropped
)

// CutAtCommit arms a one-shot fault: the next COMMIT any client sends
// through the proxy, as a simple Query or as the Execute of a statement
// prepared from COMMIT, loses its connection. What reaches the server
// depends on mode; either way both sides of that connection are closed,
// and the client sees its connection drop while it waits for the answer.
// It is how a test makes a commit's outcome unknown to the code that
// committed, deterministically, at the one moment that matters.
//
// The cut works on reads, not messages. With CommitDropped the read that
// carries the COMMIT is held back whole, with whatever arrived in it ahead
// of the COMMIT (statements of the same transaction, which die with it).
// With CommitDelivered every answer of the server from then on is held
// back, up to and including the ReadyForQuery that ends the COMMIT's
// round trip, and then the connection closes. Counting goes on as before:
// what the client sent is counted whether or not it was delivered.
func (p *Proxy) CutAtCommit(mode CutMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = mode
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Add(1)
		go p.serve(client)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", p.upstream, 10*time.Second)
	if err != nil {
		client.Close()
		return
	}
	p.mu.Lock()
	p.nextID++
	c := &conn{p: p, id: p.nextID, client: client, server: server}
	c.fromClient = framer{untyped: true, keep: keepClient}
	c.fromServer = framer{keep: func(byte) bool { return false }}
	c.counts.Connections = 1
	p.total.Connections++
	p.conns[c.id] = c
	p.mu.Unlock()

	done := make(chan struct{})
	go func() {
		c.pump(server, client, true)
		close(done)
	}()
	c.pump(client, server, false)
	<-done

	p.mu.Lock()
	c.closed = true
	p.mu.Unlock()
}

// keepClient: the client messages whose bodies we read. Untyped (0) ones
// for their code, Query, Parse, Bind and Execute for statement texts.
func keepClient(typ byte) bool {
	switch typ {
	case 0, 'Q', 'P', 'B', 'E':
		return true
	}
	return false
}

// conn is one proxied connection. Its counts and state are guarded by the
// proxy's mutex, which both directions take for every read they parse.
type conn struct {
	p              *Proxy
	id             int
	client, server net.Conn
	fromClient     framer
	fromServer     framer

	counts Counts
	closed bool
	// opaque: stop parsing; bytes still pass.
	opaque bool
	// ready: the first ReadyForQuery has arrived; startup is over.
	ready bool
	// answered: the server has answered since the client's last message,
	// so the client's next message starts a round trip.
	answered bool
	// roundTrips numbers this connection's round trips for Statement.
	roundTrips int64
	// prepared maps statement names to their text, portals maps portal
	// names to the statement text they were bound from.
	prepared map[string]string
	portals  map[string]string
	// cut is the CutAtCommit this connection is being cut by (zero: none);
	// cutAnswered: the server has finished answering the cut COMMIT.
	cut         CutMode
	cutAnswered bool
}

func (c *conn) closeBoth() {
	c.client.Close()
	c.server.Close()
}

// pump copies src to dst. Every read is parsed before it is forwarded:
// counting a client message before the server can see it, and a server
// answer before the client can see it, keeps the two directions in
// causal order although they run on two goroutines. The same order lets
// a cut (CutAtCommit) hold back a read before the other side has seen any
// of it.
func (c *conn) pump(dst, src net.Conn, fromClient bool) {
	defer c.closeBoth()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			switch c.observe(buf[:n], fromClient) {
			case forward:
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			case drop:
				// Held back: the other side never sees these bytes.
			case hangUp:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// action is what pump does with a read once it has been observed.
type action int

const (
	forward action = iota
	drop           // hold it back and read on
	hangUp         // hold it back and close both sides
)

func (c *conn) observe(b []byte, fromClient bool) action {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	c.p.lastActive = time.Now()
	if !c.opaque {
		var err error
		if fromClient {
			err = c.fromClient.feed(b, clientSide{c})
		} else {
			err = c.fromServer.feed(b, serverSide{c})
		}
		if err != nil {
			c.goOpaque()
		}
	}
	return c.cutAction(fromClient)
}

func (c *conn) goOpaque() {
	if !c.opaque {
		c.opaque = true
		c.bump(Counts{Opaque: 1})
	}
}

func (c *conn) bump(d Counts) {
	c.counts.add(d)
	c.p.total.add(d)
}

type clientSide struct{ c *conn }

func (s clientSide) rawByte(byte) { s.c.goOpaque() } // clients send no unframed bytes

func (s clientSide) message(typ byte, body []byte) {
	c := s.c
	if typ == 0 {
		if len(body) < 4 {
			c.goOpaque()
			return
		}
		switch binary.BigEndian.Uint32(body) {
		case codeSSLRequest, codeGSSRequest:
			// One unframed byte answers; if it is 'N' the client goes on
			// with a StartupMessage, still untyped.
			c.fromServer.raw = 1
		case codeProtocol3:
			c.fromClient.untyped = false
		case codeCancel:
			// The server closes this connection without a word.
		default:
			c.goOpaque()
		}
		return
	}
	if !c.ready || typ == 'X' {
		return // authentication messages; Terminate waits for nothing
	}
	if c.answered {
		c.answered = false
		c.roundTrips++
		c.bump(Counts{RoundTrips: 1})
	}
	switch typ {
	case 'Q':
		text, _, _ := cstring(body)
		c.statement('Q', text)
		c.maybeCut(text)
	case 'P':
		name, rest, ok := cstring(body)
		text, _, ok2 := cstring(rest)
		if ok && ok2 {
			if c.prepared == nil {
				c.prepared = map[string]string{}
			}
			c.prepared[name] = text
		}
	case 'B':
		portal, rest, ok := cstring(body)
		name, _, ok2 := cstring(rest)
		if ok && ok2 {
			if c.portals == nil {
				c.portals = map[string]string{}
			}
			c.portals[portal] = c.prepared[name]
		}
	case 'E':
		portal, _, _ := cstring(body)
		c.statement('E', c.portals[portal])
		c.maybeCut(c.portals[portal])
	}
}

func (c *conn) statement(kind byte, text string) {
	c.bump(Counts{Statements: 1})
	if c.p.recording {
		c.p.statements = append(c.p.statements, Statement{Conn: c.id, RoundTrip: c.roundTrips, Kind: kind, SQL: text})
	}
}

type serverSide struct{ c *conn }

func (s serverSide) rawByte(b byte) {
	if b != 'N' {
		s.c.goOpaque() // encryption accepted: the rest is unreadable
	}
}

func (s serverSide) message(typ byte, _ []byte) {
	c := s.c
	switch typ {
	case 'N', 'A', 'S':
		// NoticeResponse, NotificationResponse, ParameterStatus: the
		// server may send these at any time; they answer nothing.
		return
	case 'Z':
		c.ready = true
		if c.cut == CommitDelivered {
			c.cutAnswered = true
		}
	}
	if c.ready {
		c.answered = true
	}
}

// maybeCut starts cutting the connection if text, a statement the client
// is sending, is a COMMIT and a cut is armed. The proxy's mutex is held.
func (c *conn) maybeCut(text string) {
	if c.p.cut == 0 || c.cut != 0 || !isCommit(text) {
		return
	}
	c.cut, c.p.cut = c.p.cut, 0
}

// cutAction decides the fate of a read in the direction given, once the
// connection's cut (if any) has seen it.
func (c *conn) cutAction(fromClient bool) action {
	switch {
	case c.cut == CommitDropped && fromClient:
		return hangUp
	case c.cut == CommitDelivered && !fromClient && c.cutAnswered:
		return hangUp
	case c.cut == CommitDelivered && !fromClient:
		return drop
	}
	return forward
}

// isCommit reports whether a statement's text is a COMMIT, in any case,
// with or without a final semicolon.
func isCommit(text string) bool {
	text = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(text), ";"))
	return strings.EqualFold(text, "COMMIT")
}
