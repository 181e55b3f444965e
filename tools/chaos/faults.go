package main

import (
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	toxiclient "github.com/Shopify/toxiproxy/v2/client"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// faults runs Toxiproxy inside this process and drives it through its
// own HTTP API, as a test in another process would: every link between
// the deployment's parts that a scenario faults goes through one of its
// proxies. (There is no tc/netem here; toxiproxy is how a link is
// faulted.)
type faults struct {
	server *toxiproxy.ApiServer
	client *toxiclient.Client
}

// startFaults starts the Toxiproxy API on a free loopback port.
func startFaults() (*faults, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	go func() { _ = server.Listen(addr) }()
	client := toxiclient.NewClient("http://" + addr)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := client.Version(); err == nil {
			break
		} else if time.Now().After(deadline) {
			return nil, fmt.Errorf("toxiproxy did not start: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &faults{server: server, client: client}, nil
}

// link is one faultable TCP link: clients dial Addr, which forwards to
// the upstream.
type link struct {
	name  string
	addr  string
	proxy *toxiclient.Proxy
}

// linkAttempts bounds the ports Link tries. Many processes here pick free
// ports the same way and bind them a moment later (etcd, Patroni,
// PostgreSQL, PgBouncer, NATS), so a port can be taken in between, now
// and then more than once in a row on a busy machine.
const linkAttempts = 20

// Link creates a proxy named name in front of upstream (host:port) on a
// free loopback port.
//
// The port is free when chosen and taken by toxiproxy a moment later;
// anything else on the machine may bind it in between, so a bind that
// fails is tried again on another port.
func (f *faults) Link(name, upstream string) (*link, error) {
	for attempt := 1; ; attempt++ {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		p, err := f.client.CreateProxy(name, addr, upstream)
		if err != nil && attempt < linkAttempts && strings.Contains(err.Error(), "address already in use") {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("toxiproxy %s: %w", name, err)
		}
		return &link{name: name, addr: addr, proxy: p}, nil
	}
}

// Addr is where clients of the link connect.
func (l *link) Addr() string { return l.addr }

// Down cuts the link: open connections are closed and new ones refused,
// as a partition looks to both ends.
func (l *link) Down() error { return l.proxy.Disable() }

// Up restores the link.
func (l *link) Up() error { return l.proxy.Enable() }

// Toxic adds a toxic (latency, timeout, reset_peer, ...) to the link in
// both directions' stream named by stream ("upstream" or "downstream"),
// applied to the fraction toxicity of connections.
func (l *link) Toxic(name, kind, stream string, toxicity float32, attrs toxiclient.Attributes) error {
	_, err := l.proxy.AddToxic(name, kind, stream, toxicity, attrs)
	return err
}

// Clear removes every toxic from the link.
func (l *link) Clear() error {
	toxics, err := l.proxy.Toxics()
	if err != nil {
		return err
	}
	for _, t := range toxics {
		if err := l.proxy.RemoveToxic(t.Name); err != nil {
			return err
		}
	}
	return nil
}

// Stop shuts the Toxiproxy API and its proxies down.
func (f *faults) Stop() {
	_ = f.client.ResetState()
	proxies, _ := f.client.Proxies()
	for _, p := range proxies {
		_ = p.Delete()
	}
	_ = f.server.Shutdown()
}

// freeAddr returns a loopback address whose port is free right now, for a
// process of the deployment to bind a moment later (etcd, Patroni,
// PostgreSQL, PgBouncer, an API, a link). It is taken from below the
// kernel's ephemeral range (ip_local_port_range), which no one asking
// for port 0 is ever given: on a machine running other tests, a port from
// inside that range was at times taken by someone else before our process
// bound it, and Patroni or etcd then failed to start. A port is handed out
// once per run. Where the range leaves no room below it, freeAddr falls
// back to port 0.
func freeAddr() (string, error) {
	ports.Lock()
	defer ports.Unlock()
	if ports.given == nil {
		ports.given = map[int]bool{}
		ports.low, ports.high = portsBelowEphemeral()
	}
	if ports.high-ports.low >= minPortRange {
		for range 200 {
			port := ports.low + mrand.IntN(ports.high-ports.low)
			if ports.given[port] {
				continue
			}
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err != nil {
				continue
			}
			_ = ln.Close()
			ports.given[port] = true
			return ln.Addr().String(), nil
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// ports is freeAddr's state: the range it picks from and what it gave.
var ports struct {
	sync.Mutex
	low, high int // [low, high)
	given     map[int]bool
}

// minPortRange is the least room below the ephemeral range freeAddr
// picks from.
const minPortRange = 2000

// portsBelowEphemeral is [10000, the ephemeral range's first port), read
// from /proc on Linux; empty elsewhere.
func portsBelowEphemeral() (low, high int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return 0, 0
	}
	first, err := strconv.Atoi(fields[0])
	if err != nil {
		return 0, 0
	}
	return 10000, first
}
