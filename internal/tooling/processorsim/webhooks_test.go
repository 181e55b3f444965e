package processorsim

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/webhook"
)

// Webhooks are delivered at least once: a receiver that fails is retried
// on the schedule, every attempt is signed with every secret over the
// exact bytes sent, and a duplicate fault (queued through the admin API)
// delivers the same event id again.
func TestWebhooksRetryDuplicateAndSign(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	received := map[string]int{} // event id -> 200s given
	attempts := 0
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		for _, secret := range []string{"old", "new"} {
			if err := webhook.Verify(body, r.Header.Get(webhook.Header), []string{secret}, time.Now(), webhook.DefaultTolerance); err != nil {
				t.Errorf("signature with %q: %v", secret, err)
			}
		}
		var ev processor.Event
		if err := json.Unmarshal(body, &ev); err != nil {
			t.Error(err)
		}
		mu.Lock()
		defer mu.Unlock()
		attempts++
		if attempts <= 2 {
			w.WriteHeader(http.StatusInternalServerError) // the first two attempts fail
			return
		}
		received[ev.ID]++
	}))
	t.Cleanup(receiver.Close)

	sim, client, base := newSim(t, Config{Webhooks: WebhookConfig{
		URL: receiver.URL, Secrets: []string{"old", "new"}, Retry: []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond},
	}}, 5*time.Second)
	res, err := http.Post(base+"/_sim/webhook-faults", "application/json", strings.NewReader(`{"duplicates":2}`))
	if err != nil || res.StatusCode != http.StatusNoContent {
		t.Fatalf("queue the webhook fault: %v %v", err, res)
	}
	res.Body.Close()
	ch, err := client.CreateCharge(t.Context(), visa(500), "wh-key")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := sim.WaitWebhooks(ctx); err != nil {
		t.Fatal(err)
	}
	evs := sim.Events()
	if len(evs) != 1 || evs[0].Type != processor.EventChargeSucceeded || evs[0].Data.Object.ID != ch.ID {
		t.Fatalf("events = %+v, want one charge.succeeded for %s", evs, ch.ID)
	}
	if got := received[evs[0].ID]; got != 3 {
		t.Errorf("deliveries answered 200 = %d, want 3 (the event and two duplicates)", got)
	}
	var failed int
	for _, d := range sim.Deliveries() {
		if d.EventID != evs[0].ID {
			t.Errorf("delivery of an unknown event: %+v", d)
		}
		if d.Status == http.StatusInternalServerError {
			failed++
		}
	}
	if n := len(sim.Deliveries()); n != 5 || failed != 2 {
		t.Errorf("attempts = %d with %d failed, want 5 with 2 failed (each retried)", n, failed)
	}
}
