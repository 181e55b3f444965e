package main

import (
	"bytes"
	"net/http"
	"testing"
	"time"
)

// L7: a payment held at the processor by one API process, and its
// duplicate sent with Prefer: wait=10 to a second process on the same
// database: the duplicate waits, polling the key's row (no LISTEN, no
// message between the processes), and is answered with the first
// attempt's 201, replayed byte for byte, with Preference-Applied. One
// charge at the processor, one payment row.
func TestPreferWaitReplaysTheFirstAttemptFromAnotherProcess(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// The charge is held longer than the lock wait and a poll or two, well
	// within the processor timeout and the lease.
	env := []string{"PROCESSOR_TIMEOUT=8s", "PAYMENT_LEASE=15s", "PROCESSOR_SETTLE_WINDOW=10s", "PREFER_WAIT_MAX=10s"}
	first, second := e.start(t, env...), e.start(t, env...)

	e.chargeArmed.Store(true)
	firstDone := make(chan response, 1)
	go func() {
		res, err := e.pay(first.base, "held-key")
		if err != nil {
			t.Error(err)
		}
		firstDone <- res
	}()
	<-e.chargeArrived // the first attempt is at the processor, its key in flight

	waited := make(chan response, 1)
	sent := time.Now()
	go func() {
		res, err := postWith(second.base, e.apiKey, "/v1/payments", "held-key", e.payBody(), "Prefer", "wait=10")
		if err != nil {
			t.Error(err)
		}
		waited <- res
	}()
	select {
	case res := <-waited:
		t.Fatalf("the duplicate was answered while the first attempt was held: %d %s", res.status, res.body)
	case <-time.After(1500 * time.Millisecond):
	}
	close(e.chargeRelease)

	firstRes := <-firstDone
	if firstRes.status != http.StatusCreated {
		t.Fatalf("first attempt: %d %s", firstRes.status, firstRes.body)
	}
	dup := <-waited
	if dup.status != http.StatusCreated || dup.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("duplicate: %d (Idempotent-Replayed %q) %s, want the 201 replayed", dup.status, dup.header.Get("Idempotent-Replayed"), dup.body)
	}
	if got := dup.header.Get("Preference-Applied"); got != "wait=10" {
		t.Errorf("Preference-Applied = %q, want wait=10", got)
	}
	if !bytes.Equal(dup.body, firstRes.body) {
		t.Errorf("replayed body differs:\nfirst %s\nreplay %s", firstRes.body, dup.body)
	}
	if took := time.Since(sent); took > 9*time.Second {
		t.Errorf("the duplicate took %s: it should be answered about a second after the charge", took)
	}
	e.assertPaidOnce(t)
}
