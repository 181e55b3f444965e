package testkit

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemref/payments/internal/broker"
	"github.com/idemref/payments/internal/tooling/natstmp"
)

// Broker starts a NATS server with JetStream in a temporary folder,
// connects to it and creates the streams of cfg, all stopped when the test
// ends: each test has a broker of its own.
func Broker(t testing.TB, cfg broker.Config) (*natstmp.Server, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	ns, err := natstmp.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	nc, js, err := broker.Connect(ns.URL(), "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if err := broker.Ensure(t.Context(), js, cfg); err != nil {
		t.Fatal(err)
	}
	return ns, nc, js
}
