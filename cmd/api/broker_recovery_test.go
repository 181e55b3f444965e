package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemref/payments/internal/broker"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// D7: the broker loses its storage while the API runs. A NATS restarted
// on an empty store has neither the streams nor the consumer; nothing
// recreated them before, so the relay's publishes found no stream every
// second, the order stayed unpaid, and /readyz said "flowing" with the
// gauge at 1, until the process was restarted.
//
// Here the broker first comes back without JetStream: events cannot
// flow, and /readyz (still 200) and the gauge say so; a payment made
// then waits in the outbox. Its row is then marked published, as if the
// old broker had acknowledged it and lost it with its storage before the
// consumer applied it. The broker then comes back with JetStream on an
// empty store: the API finds the stream missing, creates the streams and
// the consumer again, hands the lost event back to the relay, and the
// orders consumer pays the order, once.
func TestServeRecoversABrokerRestartedEmpty(t *testing.T) {
	t.Parallel()
	e := setup(t)
	port := freePort(t)
	ns := startNATSAt(t, port, t.TempDir())
	api := e.start(t, fmt.Sprintf("NATS_URL=nats://127.0.0.1:%d", port))
	testkit.WaitFor(t, 20*time.Second, func() bool { _, events := readiness(t, api); return events == "flowing" })

	ns.Shutdown()
	ns.WaitForShutdown()
	ns = startNATSAt(t, port, "")
	var events string
	defer func() {
		if t.Failed() {
			t.Logf("last /readyz events: %q", events)
		}
	}()
	testkit.WaitFor(t, 20*time.Second, func() bool {
		_, events = readiness(t, api)
		return strings.HasPrefix(events, "not flowing: reconnected to the broker")
	})
	if res := e.payUntilDone(t, api.base, "pay-key"); res.status != http.StatusCreated {
		t.Fatalf("payment while the broker has no JetStream: %d %s", res.status, res.body)
	}
	// The relay cannot publish the payment's event: /readyz says why.
	testkit.WaitFor(t, 10*time.Second, func() bool {
		var status int
		status, events = readiness(t, api)
		return status == http.StatusOK && strings.Contains(events, "; relaying the outbox fails: ")
	})
	if v := metric(t, api, brokerConnectedMetric); v != 0 {
		t.Errorf("%s = %v while events cannot flow, want 0", brokerConnectedMetric, v)
	}
	const paymentEvent = `SELECT id::text FROM outbox WHERE subject = 'payments.events.payment.succeeded'`
	if n := count(t, e.pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL AND subject = 'payments.events.payment.succeeded'`); n != 1 {
		t.Fatalf("unpublished payment.succeeded rows = %d, want 1", n)
	}
	// As if the old broker had taken it and lost it with its storage.
	if _, err := e.pool.Exec(t.Context(), `UPDATE outbox SET published_at = now() WHERE published_at IS NULL`); err != nil {
		t.Fatal(err)
	}

	ns.Shutdown()
	ns.WaitForShutdown()
	ns = startNATSAt(t, port, t.TempDir())
	testkit.WaitFor(t, 30*time.Second, func() bool {
		_, events = readiness(t, api)
		return count(t, e.pool, `SELECT amount_paid FROM orders WHERE id = $1`, e.orderID) == orderAmount
	})
	testkit.WaitFor(t, 10*time.Second, func() bool { _, events = readiness(t, api); return events == "flowing" })
	if v := metric(t, api, brokerConnectedMetric); v != 1 {
		t.Errorf("%s = %v after the recovery, want 1", brokerConnectedMetric, v)
	}
	if v := metric(t, api, "payments_events_broker_recreated_total"); v < 1 {
		t.Errorf("payments_events_broker_recreated_total = %v, want at least 1", v)
	}

	// Applied once: one inbox row, the order paid once, the event once on
	// the new stream under the outbox row's id, also after a redelivery
	// would have had time to land (EVENTS_ACK_WAIT is 300ms).
	time.Sleep(time.Second)
	var id string
	if err := e.pool.QueryRow(t.Context(), paymentEvent).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if n := count(t, e.pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'orders' AND message_id = $1`, id); n != 1 {
		t.Errorf("inbox rows of the payment's event = %d, want 1", n)
	}
	if n := count(t, e.pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'orders'`); n != 1 {
		t.Errorf("inbox rows of the orders consumer = %d, want 1", n)
	}
	if paid := count(t, e.pool, `SELECT amount_paid FROM orders WHERE id = $1`, e.orderID); paid != orderAmount {
		t.Errorf("order amount_paid = %d, want %d", paid, orderAmount)
	}
	if ids := streamMsgIDs(t, ns.ClientURL(), "payments.events.payment.succeeded"); len(ids) != 1 || ids[0] != id {
		t.Errorf("payment.succeeded messages on the new stream = %v, want [%s]", ids, id)
	}
}

// streamMsgIDs returns the Nats-Msg-Id of every message of subject on the
// events stream.
func streamMsgIDs(t *testing.T, url, subject string) []string {
	t.Helper()
	nc, js, err := broker.Connect(url, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	stream, err := js.Stream(t.Context(), broker.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject == subject {
			ids = append(ids, m.Header.Get("Nats-Msg-Id"))
		}
	}
	return ids
}

// natsVersionProxy forwards connections to the NATS server at upstream
// (host:port), and rewrites the version in the server's first INFO line to
// version: the server as a client sees an older one. It returns the URL
// to connect to.
func natsVersionProxy(t *testing.T, upstream, version string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	announced := regexp.MustCompile(`"version":"[^"]*"`)
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer client.Close()
				server, err := net.Dial("tcp", upstream)
				if err != nil {
					return
				}
				defer server.Close()
				r := bufio.NewReader(server)
				info, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if _, err := io.WriteString(client, announced.ReplaceAllString(info, `"version":"`+version+`"`)); err != nil {
					return
				}
				go func() { _, _ = io.Copy(server, client) }()
				_, _ = io.Copy(client, r)
			}()
		}
	}()
	return "nats://" + ln.Addr().String()
}

// A NATS server older than broker.MinServerVersion (Debian 12 ships
// 2.9.10) is refused at connect, with an error naming the version
// required, and /readyz answers 503 with it: such a broker refuses the
// consumer's configuration, which the process used to retry for ever,
// cryptically, while it said it was ready.
func TestServeRefusesABrokerTooOld(t *testing.T) {
	t.Parallel()
	_, url := testdb.NewPool(t)
	ns := startNATSAt(t, freePort(t), t.TempDir())
	api := startServer(t, url, "NATS_URL="+natsVersionProxy(t, ns.Addr().String(), "2.9.10"))
	assertBrokerRefused(t, api, "2.9.10")
}

// assertBrokerRefused checks that api refuses its broker of version:
// /readyz answers 503 naming it and broker.MinServerVersion, and the
// gauge is 0.
func assertBrokerRefused(t *testing.T, api *serverProcess, version string) {
	t.Helper()
	var status int
	var p struct{ Code, Detail string }
	testkit.WaitFor(t, 20*time.Second, func() bool {
		res, err := http.Get(api.base + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		status = res.StatusCode
		_ = json.NewDecoder(res.Body).Decode(&p)
		return status == http.StatusServiceUnavailable
	})
	if p.Code != "service_unavailable" || !strings.Contains(p.Detail, "nats-server "+version+"; "+broker.MinServerVersion+" or later is required") {
		t.Errorf("readyz with nats-server %s: %d %+v; want 503 service_unavailable naming %s", version, status, p, broker.MinServerVersion)
	}
	if v := metric(t, api, brokerConnectedMetric); v != 0 {
		t.Errorf("%s = %v with a refused broker, want 0", brokerConnectedMetric, v)
	}
}

// The same with the real old server, where the machine has one (Debian's
// nats-server package); CI does not install it.
func TestServeRefusesTheSystemNATSServerWhenTooOld(t *testing.T) {
	t.Parallel()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		t.Fatal("this test runs Debian's nats-server: apt-get install nats-server (.ci/run does)")
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimPrefix(strings.TrimSpace(strings.TrimPrefix(string(out), "nats-server:")), "v")
	if broker.CheckServerVersion(version) == nil {
		t.Skipf("the system's nats-server %s is recent enough", version)
	}
	port := freePort(t)
	srv := exec.Command(bin, "-js", "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-sd", t.TempDir())
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
	})
	_, url := testdb.NewPool(t)
	api := startServer(t, url, fmt.Sprintf("NATS_URL=nats://127.0.0.1:%d", port))
	assertBrokerRefused(t, api, version)
}
