package main

import (
	"fmt"
	"net"
	"strings"
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
		if err != nil && attempt < 5 && strings.Contains(err.Error(), "address already in use") {
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

// freeAddr returns a loopback address with a port free right now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
