package httpapi

import (
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/idemref/payments/internal/clientaddr"
)

// clientShare holds each client to its share of the requests the API has
// in flight, counted per client as internal/clientaddr names it: the
// real client behind a trusted proxy, the TCP peer otherwise.
//
// The listener already holds a direct client to a share of the
// connections (internal/connlimit), and HTTP/1.1 carries one request at a
// time per connection. A trusted proxy is exempt from that share, rightly,
// since every client behind it reaches the API over its connections; but
// a proxy that streams request bodies (HAProxy's default) opens one
// connection to the API per request whose header it has, so one client
// sending slow bodies through it held every connection until
// READ_TIMEOUT, and the clients behind the same proxy waited. Here the
// client is known: past its share, a request is answered at once, 429
// rate_limited with Retry-After, without reading its body, and its
// connection is closed, so that the slot goes back to the others.
type clientShare struct {
	resolver *clientaddr.Resolver
	limit    int

	mu       sync.Mutex
	inFlight map[string]int // by clientaddr.Key; no entry at zero
}

// newClientShare holds each client to limit requests in flight; limit <= 0
// turns it off (nil).
func newClientShare(resolver *clientaddr.Resolver, limit int) *clientShare {
	if limit <= 0 {
		return nil
	}
	return &clientShare{resolver: resolver, limit: limit, inFlight: map[string]int{}}
}

// enter counts a request of client in, unless client is at its share.
func (s *clientShare) enter(client string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight[client] >= s.limit {
		return false
	}
	s.inFlight[client]++
	return true
}

// leave counts a request of client out. The map holds only clients with
// requests in flight, so its size is bounded by the connections open.
func (s *clientShare) leave(client string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight[client]--; s.inFlight[client] <= 0 {
		delete(s.inFlight, client)
	}
}

// errClientShare is the answer past a client's share (sentinelProblems).
var errClientShare = errors.New("the client has its share of the requests in flight")

// middleware applies the share; s nil passes every request.
func (s *clientShare) middleware(next http.Handler) http.Handler {
	if s == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		client := clientaddr.Key(s.resolver.Client(r))
		if !s.enter(client) {
			// The body is never read: closing the connection is what gives
			// the slot back. net/http reads up to 256 KiB of an unread body
			// after the handler, even on a connection it closes, which for a
			// slow body is a wait until READ_TIMEOUT; the read deadline,
			// passed at once, ends it.
			w.Header().Set("Connection", "close")
			writeError(w, r, errClientShare)
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
			return
		}
		defer s.leave(client)
		next.ServeHTTP(w, r)
	})
}
