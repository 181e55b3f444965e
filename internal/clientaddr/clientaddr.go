// Package clientaddr decides who a request comes from, for the budgets that
// are kept per client (R4, R5): the TCP peer, or, when the peer is a proxy
// the deployment trusts, the client that proxy names in its forwarding
// header.
//
// Behind a TLS-terminating proxy or load balancer every connection comes
// from the proxy, so a budget kept per peer is one budget for every client:
// one abusive client empties it for all of them. Reading X-Forwarded-For
// from anyone is no answer either, since a client writes what it likes
// there and would dodge its own budget by naming another address each time.
// So the header is read only when the peer is a trusted proxy, and then
// from the right: each trusted proxy appends the address it received the
// request from, so the first address from the right that is not a trusted
// proxy is the client, and whatever a client wrote to the left of it is
// ignored.
package clientaddr

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Header names the forwarding header a trusted proxy writes.
type Header string

// The headers a Resolver reads.
const (
	// XForwardedFor is the de facto header: a comma-separated list of
	// addresses, each proxy appending the one it received the request from.
	XForwardedFor Header = "X-Forwarded-For"
	// Forwarded is RFC 7239's: elements separated by commas, each with a
	// for= parameter (an address, an [IPv6]:port or an obfuscated name).
	Forwarded Header = "Forwarded"
)

// Resolver resolves the client of a request. The zero value and a nil
// Resolver trust no proxy: the client is always the TCP peer.
type Resolver struct {
	trusted []netip.Prefix
	header  Header
}

// ErrBadTrustedProxies is returned by Parse for a list it cannot read.
var ErrBadTrustedProxies = errors.New("want comma-separated addresses or CIDR ranges of the proxies in front, such as 10.0.0.0/8,192.168.1.7")

// Parse builds a Resolver from a comma-separated list of addresses and CIDR
// ranges (the proxies in front of the API) and the header they write. An
// empty list trusts no proxy.
func Parse(trusted string, header Header) (*Resolver, error) {
	r := &Resolver{header: header}
	switch header {
	case XForwardedFor, Forwarded:
	default:
		return nil, fmt.Errorf("the forwarding header %q: want %s or %s", string(header), XForwardedFor, Forwarded)
	}
	for item := range strings.SplitSeq(trusted, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		p, err := netip.ParsePrefix(item)
		if err != nil {
			a, aerr := netip.ParseAddr(item)
			if aerr != nil {
				return nil, fmt.Errorf("%q: %w", item, ErrBadTrustedProxies)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		r.trusted = append(r.trusted, p.Masked())
	}
	return r, nil
}

// TrustsAny reports whether any proxy is trusted.
func (r *Resolver) TrustsAny() bool { return r != nil && len(r.trusted) > 0 }

// Trusted reports whether a is the address of a trusted proxy.
func (r *Resolver) Trusted(a netip.Addr) bool {
	if r == nil {
		return false
	}
	a = a.Unmap()
	for _, p := range r.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// TrustedPeer reports whether the peer at addr (a net.Conn's RemoteAddr) is
// a trusted proxy.
func (r *Resolver) TrustedPeer(addr net.Addr) bool {
	a, ok := peerAddr(addr.String())
	return ok && r.Trusted(a)
}

// Client is the address of the client behind req: its peer, unless the
// peer is a trusted proxy; then the rightmost address in the forwarding
// header that is not a trusted proxy. When every address in the header is
// a trusted proxy (or the header is missing), the leftmost trusted hop is
// the client: the request started inside the trusted network. An element
// that is not an address (garbage, "unknown", an obfuscated name) ends the
// walk: nothing to its left can be vouched for, so the hop to its right is
// the client.
func (r *Resolver) Client(req *http.Request) netip.Addr {
	peer, ok := peerAddr(req.RemoteAddr)
	if !ok || !r.Trusted(peer) {
		return peer
	}
	hops := r.hops(req.Header)
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := hops[i], hops[i].IsValid()
		if !ok {
			break
		}
		client = a
		if !r.Trusted(a) {
			break
		}
	}
	return client
}

// hops lists the addresses of the forwarding header, every line of it in
// order, left to right; an element that is not an address is the zero
// Addr.
func (r *Resolver) hops(h http.Header) []netip.Addr {
	var hops []netip.Addr
	for _, line := range h.Values(string(r.header)) {
		for element := range strings.SplitSeq(line, ",") {
			var a netip.Addr
			if r.header == Forwarded {
				a = forwardedFor(element)
			} else {
				// Some balancers append the port too (192.0.2.1:4711,
				// [2001:db8::1]:4711).
				a, _ = peerAddr(strings.TrimSpace(element))
			}
			hops = append(hops, a.Unmap())
		}
	}
	return hops
}

// forwardedFor reads the for= parameter of one element of a Forwarded
// header (RFC 7239 section 4): for=192.0.2.60, for="[2001:db8::1]:4711",
// for="192.0.2.60:80". Anything else is the zero Addr.
func forwardedFor(element string) netip.Addr {
	for pair := range strings.SplitSeq(element, ";") {
		name, value, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || !strings.EqualFold(name, "for") {
			continue
		}
		value = strings.Trim(value, `"`)
		if a, ok := peerAddr(value); ok {
			return a
		}
		a, _ := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(value, "["), "]"))
		return a
	}
	return netip.Addr{}
}

// peerAddr reads a "host:port" (or a bare address) as an address.
func peerAddr(hostport string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(hostport); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	a, err := netip.ParseAddr(hostport)
	return a.Unmap().WithZone(""), err == nil
}

// Key is what a per-client budget is kept under: the IPv4 address, or the
// IPv6 /64, since one client usually holds a whole /64. An invalid address
// (a peer that is not IP, such as a Unix socket) is one client, "unknown".
func Key(a netip.Addr) string {
	switch {
	case !a.IsValid():
		return "unknown"
	case a.Is6():
		p, _ := a.Prefix(64)
		return p.String()
	default:
		return a.String()
	}
}

// PeerKey is Key of a connection's peer.
func PeerKey(addr net.Addr) string {
	a, _ := peerAddr(addr.String())
	return Key(a)
}
