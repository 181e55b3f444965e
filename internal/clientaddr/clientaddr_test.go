package clientaddr

import (
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

func TestClient(t *testing.T) {
	t.Parallel()
	xff, err := Parse("10.0.0.0/8, 192.168.1.7, 2001:db8:ffff::/48", XForwardedFor)
	if err != nil {
		t.Fatal(err)
	}
	fwd, err := Parse("10.0.0.0/8", Forwarded)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name    string
		r       *Resolver
		peer    string
		headers []string // values of the resolver's header, one per line
		want    string
	}{
		{"NoProxyTrustedIsThePeer", nil, "203.0.113.5:4000", []string{"198.51.100.1"}, "203.0.113.5"},
		{"UntrustedPeerIsItselfWhateverItWrites", xff, "203.0.113.5:4000", []string{"198.51.100.1"}, "203.0.113.5"},
		{"TrustedPeerNamesTheClient", xff, "10.1.2.3:4000", []string{"198.51.100.1"}, "198.51.100.1"},
		{"WhatTheClientWroteLeftOfItIsIgnored", xff, "10.1.2.3:4000", []string{"1.2.3.4, 198.51.100.1"}, "198.51.100.1"},
		{"TwoTrustedHops", xff, "10.1.2.3:4000", []string{"1.2.3.4, 198.51.100.1, 192.168.1.7"}, "198.51.100.1"},
		{"SeveralHeaderLinesInOrder", xff, "10.1.2.3:4000", []string{"1.2.3.4", "198.51.100.1, 10.9.9.9"}, "198.51.100.1"},
		{"EveryHopTrustedIsTheLeftmost", xff, "10.1.2.3:4000", []string{"10.0.0.1, 10.0.0.2"}, "10.0.0.1"},
		{"NoHeaderIsThePeer", xff, "10.1.2.3:4000", nil, "10.1.2.3"},
		{"GarbageEndsTheWalk", xff, "10.1.2.3:4000", []string{"198.51.100.1, junk, 10.0.0.9"}, "10.0.0.9"},
		{"XForwardedForWithPort", xff, "10.1.2.3:4000", []string{"1.2.3.4, 198.51.100.1:4711"}, "198.51.100.1"},
		{"XForwardedForIPv6WithPort", xff, "10.1.2.3:4000", []string{"[2001:db8:1:2:3::9]:4711"}, "2001:db8:1:2:3::9"},
		{"IPv6Client", xff, "[2001:db8:ffff::1]:4000", []string{"2001:db8:1:2:3::9"}, "2001:db8:1:2:3::9"},
		{"MappedPeer", xff, "[::ffff:10.1.2.3]:4000", []string{"198.51.100.1"}, "198.51.100.1"},
		{"Forwarded", fwd, "10.1.2.3:4000", []string{`for=1.2.3.4, for="[2001:db8::1]:4711";proto=https`}, "2001:db8::1"},
		{"ForwardedWithPort", fwd, "10.1.2.3:4000", []string{`for="198.51.100.1:80"`}, "198.51.100.1"},
		{"ForwardedUnknownEndsTheWalk", fwd, "10.1.2.3:4000", []string{`for=unknown`}, "10.1.2.3"},
		{"ForwardedIgnoresXForwardedFor", fwd, "10.1.2.3:4000", nil, "10.1.2.3"},
		{"XForwardedForIgnoresForwarded", xff, "10.1.2.3:4000", nil, "10.1.2.3"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := &http.Request{RemoteAddr: tt.peer, Header: http.Header{}}
			name, other := XForwardedFor, `Forwarded: for=198.51.100.99`
			if tt.r == fwd {
				name, other = Forwarded, "X-Forwarded-For: 198.51.100.99"
			}
			for _, v := range tt.headers {
				r.Header.Add(string(name), v)
			}
			// The header the resolver does not read names another client:
			// it is never believed.
			k, v, _ := strings.Cut(other, ": ")
			r.Header.Add(k, v)
			if got := tt.r.Client(r); got != netip.MustParseAddr(tt.want) {
				t.Errorf("Client = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestKey(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"198.51.100.1":      "198.51.100.1",
		"2001:db8:1:2:3::9": "2001:db8:1:2::/64",
		"2001:db8:1:2:ff::": "2001:db8:1:2::/64",
	} {
		if got := Key(netip.MustParseAddr(in)); got != want {
			t.Errorf("Key(%s) = %s, want %s", in, got, want)
		}
	}
	if got := Key(netip.Addr{}); got != "unknown" {
		t.Errorf("Key(invalid) = %s, want unknown", got)
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"10.0.0.0/33", "proxy.internal", "10.0.0.1:80"} {
		if _, err := Parse(bad, XForwardedFor); !errors.Is(err, ErrBadTrustedProxies) {
			t.Errorf("Parse(%q) = %v, want ErrBadTrustedProxies", bad, err)
		}
	}
	if _, err := Parse("10.0.0.0/8", "X-Real-IP"); err == nil {
		t.Error("Parse with the header X-Real-IP: no error, want one naming the two it reads")
	}
	r, err := Parse("", XForwardedFor)
	if err != nil || r.TrustsAny() {
		t.Errorf("Parse of nothing = %v, %v; want a resolver that trusts no proxy", r, err)
	}
}
