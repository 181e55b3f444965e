package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemref/payments/internal/broker"
	"github.com/idemref/payments/internal/events"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// runDeadLetters runs `api deadletters action` against the test's broker
// and database and returns what it printed and whether it succeeded.
func runDeadLetters(t *testing.T, natsURL, databaseURL, action string) (stdout, stderr string, ok bool) {
	t.Helper()
	cmd := exec.Command(apiBinary(t), "deadletters", action)
	cmd.Env = append(os.Environ(), "NATS_URL="+natsURL, "DATABASE_URL="+databaseURL)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if exitErr := (*exec.ExitError)(nil); err != nil && !errors.As(err, &exitErr) {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), err == nil
}

// An event the orders consumer gave up on (its order did not exist yet, for
// every delivery) is listed by `api deadletters list`; once the cause is
// fixed (the order exists), `api deadletters redrive` publishes it again to
// its subject with its original message id and payload (the inbox has
// pruned nothing, so it vouches that the event was not applied), the
// consumer applies it once, and the dead letter is gone. Within the events
// stream's duplicates window of the original the stream would drop the
// copy: redrive then keeps the dead letter and says to come back after the
// window. A second redrive finds nothing to do.
func TestDeadLettersRedrive(t *testing.T) {
	t.Parallel()
	pool, url := testdb.NewPool(t)
	tenant, _, err := tenants.Create(t.Context(), pool, "redrive")
	if err != nil {
		t.Fatal(err)
	}
	api := startServer(t, url, "EVENTS_ACK_WAIT=100ms", "EVENTS_MAX_DELIVER=2")
	testkit.WaitFor(t, 20*time.Second, func() bool { _, events := readiness(t, api); return events == "flowing" })
	natsURL := natsURLFor(t, url)
	nc, js, err := broker.Connect(natsURL, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	order := uuid.New()
	data, _ := json.Marshal(payments.PaymentEvent{OrderID: order, Amount: 700, Currency: "EUR", Status: "succeeded"})
	env := events.Envelope{ID: uuid.New(), Type: payments.TypePaymentSucceeded, SchemaVersion: events.SchemaVersion, TenantID: tenant, Data: data}
	payload, _ := json.Marshal(env)
	if _, err := js.PublishMsg(t.Context(), &nats.Msg{Subject: events.Subject(env.Type), Data: payload}, jetstream.WithMsgID(env.ID.String())); err != nil {
		t.Fatal(err)
	}
	dead, err := js.Stream(t.Context(), broker.StreamDeadLetters)
	if err != nil {
		t.Fatal(err)
	}
	deadLetters := func() uint64 {
		info, err := dead.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	testkit.WaitFor(t, 20*time.Second, func() bool { return deadLetters() == 1 })

	out, _, ok := runDeadLetters(t, natsURL, url, "list")
	if !ok || !strings.Contains(out, "orders") || !strings.Contains(out, "max_deliver") ||
		!strings.Contains(out, events.Subject(env.Type)) || !strings.Contains(out, env.ID.String()) {
		t.Fatalf("deadletters list printed:\n%s\nwant the event's consumer, reason, subject and id", out)
	}
	// The cause, fixed.
	if _, err := pool.Exec(t.Context(), `INSERT INTO orders (tenant_id, id, reference, customer_id, amount, currency)
		VALUES ($1, $2, 'redrive', 'cus', 700, 'EUR')`, tenant, order); err != nil {
		t.Fatal(err)
	}

	// Within the duplicates window (2 min) of the original.
	out, errOut, ok := runDeadLetters(t, natsURL, url, "redrive")
	if ok || !strings.Contains(out, "redriven 0, applied 0, kept 1, refused 0") || !strings.Contains(errOut, "EVENTS_DUPLICATE_WINDOW") {
		t.Fatalf("redrive within the duplicates window: ok %v, printed:\n%s%s\nwant the dead letter kept, and why", ok, out, errOut)
	}
	if n := deadLetters(); n != 1 {
		t.Fatalf("dead letters after a redrive within the window = %d, want 1", n)
	}
	// The window passes (shortened, as its end would come).
	if err := broker.Ensure(t.Context(), js, broker.Config{DuplicateWindow: time.Second}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 20*time.Second, func() bool {
		out, _, ok = runDeadLetters(t, natsURL, url, "redrive")
		return ok
	})
	if !strings.Contains(out, "redriven 1, applied 0, kept 0, refused 0") {
		t.Errorf("redrive printed:\n%s\nwant one redriven", out)
	}
	testkit.WaitFor(t, 20*time.Second, func() bool {
		return count(t, pool, `SELECT amount_paid FROM orders WHERE id = $1`, order) == 700
	})
	if n := count(t, pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'orders' AND message_id = $1`, env.ID.String()); n != 1 {
		t.Errorf("inbox rows of the event = %d, want 1", n)
	}
	if n := deadLetters(); n != 0 {
		t.Errorf("dead letters after the redrive = %d, want 0", n)
	}
	// The copy on the events stream is the original: same id, same bytes.
	stream, err := js.Stream(t.Context(), broker.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	last, err := stream.GetLastMsgForSubject(t.Context(), events.Subject(env.Type))
	if err != nil {
		t.Fatal(err)
	}
	if last.Sequence != 2 || last.Header.Get(jetstream.MsgIDHeader) != env.ID.String() || !bytes.Equal(last.Data, payload) {
		t.Errorf("redriven message: seq %d, Nats-Msg-Id %q, data %s; want seq 2, %s, the original payload",
			last.Sequence, last.Header.Get(jetstream.MsgIDHeader), last.Data, env.ID)
	}

	out, _, ok = runDeadLetters(t, natsURL, url, "redrive")
	if !ok || !strings.Contains(out, "redriven 0, applied 0, kept 0, refused 0") {
		t.Errorf("second redrive: ok %v, printed:\n%s\nwant nothing to do", ok, out)
	}
	if paid := count(t, pool, `SELECT amount_paid FROM orders WHERE id = $1`, order); paid != 700 {
		t.Errorf("amount_paid after the second redrive = %d, want 700", paid)
	}
}
