package main

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemref/payments/internal/broker"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// streamMessages is how many messages the test's events stream holds.
func streamMessages(t *testing.T, e *bundle) uint64 {
	t.Helper()
	nc, js, err := broker.Connect(natsURLFor(t, e.url), "test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, broker.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// metric reads one sample from a process's /metrics, such as
// `consumer_duplicates_skipped_total{consumer="orders"}`; 0 when absent.
func metric(t *testing.T, p *serverProcess, sample string) float64 {
	t.Helper()
	res, err := http.Get(p.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return 0
}

// consumerAckFloor is the stream sequence up to which the orders consumer
// has acknowledged every message.
func consumerAckFloor(t *testing.T, e *bundle) uint64 {
	t.Helper()
	nc, js, err := broker.Connect(natsURLFor(t, e.url), "test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, broker.StreamEvents, "orders")
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.AckFloor.Stream
}

const (
	duplicatesSkipped = `consumer_duplicates_skipped_total{consumer="orders"}`
	// streamDuplicates: the skipped first deliveries, second copies on the
	// stream, which DuplicatesBeyondTheWindow pages for.
	streamDuplicates = `consumer_stream_duplicates_total{consumer="orders"}`
)

// T5, M1: the orders consumer's process is killed (SIGKILL, failpoint
// consumer-after-commit) after the inbox row and the order update
// committed and before the ack. The broker redelivers the event to the
// next process's consumer, whose inbox skips it: the order is paid once.
func TestConsumerKilledAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	e := setup(t)
	doomed := e.start(t, "FAILPOINTS=consumer-after-commit=kill")
	go func() { _, _ = e.pay(doomed.base, "pay-key") }() // answered or not: the process dies
	if !doomed.killedBySIGKILL(t) {
		t.Fatalf("server exit: %v, want death by SIGKILL", doomed.cmd.ProcessState)
	}
	// What committed before the kill: the event applied once, not acked.
	if n := count(t, e.pool, `SELECT count(*) FROM processed_messages WHERE consumer = 'orders'`); n != 1 {
		t.Fatalf("inbox rows when the consumer died = %d, want 1", n)
	}
	if paid := count(t, e.pool, `SELECT amount_paid FROM orders WHERE id = $1`, e.orderID); paid != orderAmount {
		t.Fatalf("amount_paid when the consumer died = %d, want %d", paid, orderAmount)
	}

	api := e.start(t)
	// The redelivery reaches the new process's consumer and is settled
	// there (skipped, or applied again if the inbox failed).
	testkit.WaitFor(t, 20*time.Second, func() bool {
		return metric(t, api, `consumer_redeliveries_total{consumer="orders"}`) >= 1 &&
			metric(t, api, duplicatesSkipped)+metric(t, api, `consumer_processed_total{consumer="orders"}`) >= 1
	})
	if paid := count(t, e.pool, `SELECT amount_paid FROM orders WHERE id = $1`, e.orderID); paid != orderAmount {
		t.Errorf("amount_paid after the redelivery = %d, want %d", paid, orderAmount)
	}
	if n := metric(t, api, duplicatesSkipped); n != 1 {
		t.Errorf("duplicates the second consumer skipped = %v, want 1", n)
	}
	// A redelivery after a lost ack is no copy on the stream: nothing
	// for DuplicatesBeyondTheWindow to page about.
	if n := metric(t, api, streamDuplicates); n != 0 {
		t.Errorf("stream duplicates counted for a redelivery = %v, want 0", n)
	}
	if final := e.payUntilDone(t, api.base, "pay-key"); final.status != http.StatusCreated {
		t.Fatalf("final answer %d: %s", final.status, final.body)
	}
	e.assertPaidOnce(t)
	if n := streamMessages(t, e); n != 1 {
		t.Errorf("messages on the stream = %d, want 1", n)
	}
	if n := metric(t, api, `consumer_processed_total{consumer="orders"}`); n != 0 {
		t.Errorf("events the second consumer applied = %v, want 0", n)
	}
}

// T5, M2: the relay's process is killed (failpoint relay-after-publish)
// after the stream acknowledged the publish and before the row was marked
// published. Once the claim expires, the next process's relay publishes
// the row again with the same Nats-Msg-Id. Within the stream's duplicates
// window the stream drops the copy (one message); beyond it (a window
// shorter than the claim) the stream keeps both and the consumer's inbox
// drops the second. The order is paid once either way.
func TestRelayKilledAfterPublishBeforeMark(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// env: the duplicates window against the relay's claim hold.
		env        []string
		streamMsgs uint64
	}{
		{"WithinTheDuplicatesWindow", []string{"EVENTS_DUPLICATE_WINDOW=2m", "OUTBOX_CLAIM_HOLD=500ms"}, 1},
		// The copy is published at least 3 s after the first; the server
		// forgets ids between one and two windows after it saw them.
		{"BeyondTheDuplicatesWindow", []string{"EVENTS_DUPLICATE_WINDOW=1s", "OUTBOX_CLAIM_HOLD=3s"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			doomed := e.start(t, append(tc.env, "FAILPOINTS=relay-after-publish=kill")...)
			go func() { _, _ = e.pay(doomed.base, "pay-key") }()
			if !doomed.killedBySIGKILL(t) {
				t.Fatalf("server exit: %v, want death by SIGKILL", doomed.cmd.ProcessState)
			}
			if n := count(t, e.pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`); n != 1 {
				t.Fatalf("unmarked outbox rows when the relay died = %d, want 1", n)
			}
			if n := streamMessages(t, e); n != 1 {
				t.Fatalf("messages on the stream when the relay died = %d, want 1", n)
			}

			api := e.start(t, tc.env...)
			testkit.WaitFor(t, 20*time.Second, func() bool {
				return count(t, e.pool, `SELECT count(*) FROM outbox WHERE published_at IS NOT NULL AND publish_attempts = 2`) == 1
			})
			if n := streamMessages(t, e); n != tc.streamMsgs {
				t.Errorf("messages on the stream after the republish = %d, want %d", n, tc.streamMsgs)
			}
			dropped := metric(t, api, "outbox_publish_duplicates_total")
			if want := float64(2 - tc.streamMsgs); dropped != want {
				t.Errorf("republishes the stream dropped as duplicates = %v, want %v", dropped, want)
			}
			if tc.streamMsgs == 2 {
				// Both copies were delivered (the first maybe to the dead
				// process): wait until the stream's last message is acked.
				testkit.WaitFor(t, 20*time.Second, func() bool { return consumerAckFloor(t, e) == 2 })
			}
			// The second copy's first delivery is what the stream let
			// through, whichever process took the first copy.
			if got, want := metric(t, api, streamDuplicates), float64(tc.streamMsgs-1); got != want {
				t.Errorf("stream duplicates = %v, want %v", got, want)
			}
			if final := e.payUntilDone(t, api.base, "pay-key"); final.status != http.StatusCreated {
				t.Fatalf("final answer %d: %s", final.status, final.body)
			}
			e.assertPaidOnce(t)
		})
	}
}
