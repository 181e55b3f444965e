package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/idemref/payments/internal/broker"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// freePort returns a loopback port where nothing listens.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startNATSAt starts a NATS server with JetStream on a given port, storing
// in dir (without JetStream when dir is ""), and returns it (shut down when
// the test ends, if still running).
func startNATSAt(t *testing.T, port int, dir string) *server.Server {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: dir != "", StoreDir: dir, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS did not start within 10s")
	}
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	return srv
}

// readiness is the status of /readyz and the events detail it gives.
func readiness(t *testing.T, p *serverProcess) (status int, events string) {
	t.Helper()
	res, err := http.Get(p.base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body struct{ Events string }
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, body.Events
}

const brokerConnectedMetric = "payments_events_broker_connected"

// Defect: `api serve` exited at once while NATS was unreachable, although
// a running API serves every payment without it. Now it starts, serves a
// payment, and says in /readyz (still 200: the load balancer keeps it)
// and in the gauge that events do not flow; the payment's event waits in
// the outbox. When the broker comes, the process connects, creates the
// stream, and the outbox drains: the event is on the stream and the
// orders consumer pays the order. When the broker goes away and comes
// back, the process follows, and events flow again. A process still
// trying to connect stops cleanly on SIGTERM.
func TestServeStartsWhileTheBrokerIsDown(t *testing.T) {
	t.Parallel()
	e := setup(t)
	port := freePort(t)
	api := e.start(t, fmt.Sprintf("NATS_URL=nats://127.0.0.1:%d", port))

	status, events := readiness(t, api)
	if status != http.StatusOK || !strings.HasPrefix(events, "not flowing: ") {
		t.Errorf("readyz without a broker = %d, events %q; want 200 and not flowing", status, events)
	}
	if v := metric(t, api, brokerConnectedMetric); v != 0 {
		t.Errorf("%s = %v without a broker, want 0", brokerConnectedMetric, v)
	}
	if res := e.payUntilDone(t, api.base, "pay-key"); res.status != http.StatusCreated {
		t.Fatalf("payment without a broker: %d %s", res.status, res.body)
	}
	if n := count(t, e.pool, `SELECT count(*) FROM payments WHERE status = 'succeeded'`); n != 1 {
		t.Fatalf("succeeded payments = %d, want 1", n)
	}
	if n := count(t, e.pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`); n != 1 {
		t.Fatalf("unpublished outbox rows = %d, want 1: the payment's event waits for the broker", n)
	}

	dir := t.TempDir()
	ns := startNATSAt(t, port, dir)
	// The relay marks the row after the stream acknowledged it, maybe after
	// the consumer applied it.
	testkit.WaitFor(t, 30*time.Second, func() bool {
		return count(t, e.pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0 &&
			count(t, e.pool, `SELECT amount_paid FROM orders WHERE id = $1`, e.orderID) == orderAmount
	})
	testkit.WaitFor(t, 10*time.Second, func() bool { _, events := readiness(t, api); return events == "flowing" })
	if v := metric(t, api, brokerConnectedMetric); v != 1 {
		t.Errorf("%s = %v with the broker, want 1", brokerConnectedMetric, v)
	}
	nc, js, err := broker.Connect(ns.ClientURL(), "test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	stream, err := js.Stream(t.Context(), broker.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.GetLastMsgForSubject(t.Context(), "payments.events.>")
	if err != nil {
		t.Fatal(err)
	}
	if id := count(t, e.pool, `SELECT count(*) FROM outbox WHERE id::text = $1`, msg.Header.Get("Nats-Msg-Id")); id != 1 || msg.Sequence != 1 {
		t.Errorf("stream message %d, Nats-Msg-Id %q; want the outbox row's id, once", msg.Sequence, msg.Header.Get("Nats-Msg-Id"))
	}

	// The broker goes away, and comes back.
	ns.Shutdown()
	ns.WaitForShutdown()
	testkit.WaitFor(t, 10*time.Second, func() bool {
		status, events := readiness(t, api)
		return status == http.StatusOK && strings.HasPrefix(events, "not flowing: lost the connection to the broker")
	})
	if v := metric(t, api, brokerConnectedMetric); v != 0 {
		t.Errorf("%s = %v after the broker left, want 0", brokerConnectedMetric, v)
	}
	startNATSAt(t, port, dir)
	testkit.WaitFor(t, 30*time.Second, func() bool { _, events := readiness(t, api); return events == "flowing" })
	if v := metric(t, api, brokerConnectedMetric); v != 1 {
		t.Errorf("%s = %v after the broker came back, want 1", brokerConnectedMetric, v)
	}

	// A process that is still trying to connect stops cleanly.
	waiting := e.start(t, fmt.Sprintf("NATS_URL=nats://127.0.0.1:%d", freePort(t)))
	if err := waiting.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-waiting.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("a process still connecting to the broker did not stop within 10s of SIGTERM")
	}
	if code := waiting.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0", code)
	}
}
