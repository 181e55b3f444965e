package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// T1: the server commits the order and its recorded response, then dies
// (SIGKILL, armed by a failpoint) before writing the response. The client
// sees a broken connection and cannot know whether the order exists. Its
// retry with the same key, against the restarted server, must get the
// stored 201 byte for byte, and there must be exactly one order.
func TestCrashAfterCommitReplaysStoredResponse(t *testing.T) {
	t.Parallel()
	pool, url := testdb.NewPool(t)
	apiKey := runTenantCreate(t, url, "t1")
	body := `{"reference":"crash-1","customer_id":"cus_1","amount":1999,"currency":"EUR"}`

	crashing := startServer(t, url, "FAILPOINTS=idem-after-commit=kill")
	if _, err := postOrder(crashing.base, apiKey, "crash-key", body); err == nil {
		t.Fatal("the request succeeded; the failpoint should have killed the server before it answered")
	}
	if !crashing.killedBySIGKILL(t) {
		t.Fatalf("server exit: %v, want death by SIGKILL", crashing.cmd.ProcessState)
	}

	// The commit happened before the crash: one order, one completed key.
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE reference = 'crash-1'`); n != 1 {
		t.Fatalf("orders after the crash = %d, want 1", n)
	}
	var stored struct {
		status  int
		headers []byte
		body    []byte
	}
	err := pool.QueryRow(context.Background(),
		`SELECT response_status, response_headers, response_body FROM idempotency_keys
		 WHERE idem_key = 'crash-key' AND endpoint = 'POST /v1/orders' AND state = 'completed'`).
		Scan(&stored.status, &stored.headers, &stored.body)
	if err != nil {
		t.Fatalf("recorded response: %v", err)
	}

	restarted := startServer(t, url)
	res, err := postOrder(restarted.base, apiKey, "crash-key", body)
	if err != nil {
		t.Fatal(err)
	}
	if res.status != http.StatusCreated || stored.status != http.StatusCreated {
		t.Fatalf("retry status %d, stored %d; want 201 for both", res.status, stored.status)
	}
	if !bytes.Equal(res.body, stored.body) {
		t.Errorf("replayed body differs from the recorded one:\n got %s\nwant %s", res.body, stored.body)
	}
	var storedHeaders http.Header
	if err := json.Unmarshal(stored.headers, &storedHeaders); err != nil {
		t.Fatal(err)
	}
	for name, want := range storedHeaders {
		if diff := cmp.Diff(want, res.header.Values(name)); diff != "" {
			t.Errorf("header %s (-recorded +replayed):\n%s", name, diff)
		}
	}
	if got := res.header.Get("Idempotent-Replayed"); got != "true" {
		t.Errorf("Idempotent-Replayed = %q, want true", got)
	}
	var order struct{ ID, Reference string }
	if err := json.Unmarshal(res.body, &order); err != nil || order.Reference != "crash-1" {
		t.Fatalf("replayed body %s: %v", res.body, err)
	}
	if got, want := res.header.Get("Location"), "/v1/orders/"+order.ID; got != want {
		t.Errorf("Location = %q, want %q", got, want)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders`); n != 1 {
		t.Errorf("orders after the retry = %d, want 1", n)
	}
}

// T2: many identical requests under one key, in parallel, spread over three
// server processes on one database. Exactly one executes; every other gets
// its replay or a 409 in-progress; nobody gets a 5xx.
func TestConcurrentDuplicatesAcrossProcesses(t *testing.T) {
	t.Parallel()
	const requests = 60
	pool, url := testdb.NewPool(t)
	apiKey := runTenantCreate(t, url, "t2")
	servers := []*serverProcess{startServer(t, url), startServer(t, url), startServer(t, url)}

	t.Run("OneKeyExecutesOnce", func(t *testing.T) {
		body := `{"reference":"same-key","customer_id":"cus_2","amount":500,"currency":"USD"}`
		results := testkit.Fire(t, requests, func(i int) (response, error) {
			return postOrder(servers[i%len(servers)].base, apiKey, "shared-key", body)
		})

		var fresh, replays, inProgress int
		var firstBody []byte
		for _, r := range results {
			switch {
			case r.status == http.StatusCreated && r.header.Get("Idempotent-Replayed") == "true":
				replays++
			case r.status == http.StatusCreated:
				fresh++
			case r.status == http.StatusConflict && problemCode(t, r.body) == "idempotency_key_in_use":
				inProgress++
				continue
			default:
				t.Fatalf("unexpected response %d: %s", r.status, r.body)
			}
			if firstBody == nil {
				firstBody = r.body
			} else if !bytes.Equal(firstBody, r.body) {
				t.Errorf("201 bodies differ:\n%s\n%s", firstBody, r.body)
			}
		}
		t.Logf("fresh=%d replays=%d in_progress=%d", fresh, replays, inProgress)
		if fresh != 1 {
			t.Errorf("%d requests executed, want exactly 1", fresh)
		}
		if n := count(t, pool, `SELECT count(*) FROM orders WHERE reference = 'same-key'`); n != 1 {
			t.Errorf("orders = %d, want 1", n)
		}
		if n := count(t, pool, `SELECT count(*) FROM idempotency_keys WHERE idem_key = 'shared-key'`); n != 1 {
			t.Errorf("key rows = %d, want 1", n)
		}
	})

	// The same with a new key per request and one reference: the natural-key
	// backstop (N1) leaves one order; the others are told which one.
	t.Run("ManyKeysOneReferenceBackstop", func(t *testing.T) {
		body := `{"reference":"same-ref","customer_id":"cus_3","amount":700,"currency":"USD"}`
		results := testkit.Fire(t, requests, func(i int) (response, error) {
			return postOrder(servers[i%len(servers)].base, apiKey, fmt.Sprintf("key-%d", i), body)
		})
		var created, conflicts int
		var orderID string
		for _, r := range results {
			switch {
			case r.status == http.StatusCreated:
				created++
				var o struct{ ID string }
				_ = json.Unmarshal(r.body, &o)
				orderID = o.ID
			case r.status == http.StatusConflict && problemCode(t, r.body) == "order_reference_exists":
				conflicts++
			default:
				t.Fatalf("unexpected response %d: %s", r.status, r.body)
			}
		}
		if created != 1 || conflicts != requests-1 {
			t.Errorf("created=%d conflicts=%d, want 1 and %d", created, conflicts, requests-1)
		}
		for _, r := range results {
			if r.status == http.StatusConflict {
				var p struct {
					OrderID string `json:"order_id"`
				}
				_ = json.Unmarshal(r.body, &p)
				if p.OrderID != orderID {
					t.Errorf("409 names order %q, want %q", p.OrderID, orderID)
				}
			}
		}
		if n := count(t, pool, `SELECT count(*) FROM orders WHERE reference = 'same-ref'`); n != 1 {
			t.Errorf("orders = %d, want 1", n)
		}
		// Every key recorded its outcome (201 or 409) for its own retries.
		if n := count(t, pool, `SELECT count(*) FROM idempotency_keys WHERE idem_key LIKE 'key-%' AND state = 'completed'`); n != requests {
			t.Errorf("completed key rows = %d, want %d", n, requests)
		}
	})
}

func problemCode(t *testing.T, body []byte) string {
	t.Helper()
	var p struct{ Code string }
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("not a problem: %s", body)
	}
	return p.Code
}
