package clienttest

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idemref/payments/client"
)

// TestResolveWhileTheRequestRuns: a key whose request is still executing
// has no record yet (the server writes the key's row as its transaction's
// last statement), so the key-status endpoint answers 404 for it. The
// client must not take that for "never ran": KeyStatus and Resolve say the
// key is not recorded yet, with the window after which that would be
// final, and never ErrKeyUnknown. Sending the same request again with the
// same key meanwhile is safe. Once the request finishes, Resolve finds it,
// and there is exactly one order.
func TestResolveWhileTheRequestRuns(t *testing.T) {
	t.Parallel()
	// The request waits on a lock the test holds, for as long as the test
	// holds it: a lock timeout longer than the test.
	to := timeouts{request: requestTimeout, lock: time.Minute}
	e := setup(t, to)
	ctx := t.Context()

	// The order's natural key, held by a transaction of the test: the
	// request's insert waits on it, inside the request's transaction.
	holder, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Rollback(context.Background()) })
	if _, err := holder.Exec(ctx, `
		INSERT INTO orders (tenant_id, id, reference, customer_id, amount, currency)
		VALUES ($1, gen_random_uuid(), 'inv-in-flight', 'cus_1', 2500, 'EUR')`, e.tenantID); err != nil {
		t.Fatal(err)
	}

	done := make(chan int, 1)
	e.faults.play(detached(done))
	c := e.client(t, client.Policy{MaxAttempts: 1})
	key := client.NewKey()
	_, err = c.CreateOrder(ctx, key, orderRequest("inv-in-flight"))
	var unknown *client.OutcomeUnknownError
	if !errors.As(err, &unknown) {
		t.Fatalf("error = %v, want an OutcomeUnknownError", err)
	}
	if unknown.LastSent.IsZero() {
		t.Error("the OutcomeUnknownError does not say when its last attempt was sent")
	}
	e.waitForLockWaiters(t, 1)

	// KeyStatus cannot know when the key's last attempt was sent: no
	// record is not yet an answer.
	var notYet *client.NotRecordedError
	_, err = c.KeyStatus(ctx, key, client.EndpointCreateOrder)
	if errors.Is(err, client.ErrKeyUnknown) {
		t.Fatalf("KeyStatus while the request runs = %v: concluded that no attempt committed", err)
	}
	if !errors.As(err, &notYet) || !errors.Is(err, client.ErrKeyNotYetRecorded) {
		t.Fatalf("KeyStatus while the request runs = %v, want a NotRecordedError", err)
	}
	if most := to.request + to.lock; notYet.Window < most {
		t.Errorf("the server's commit window = %v, want at least the request timeout plus a lock wait (%v)", notYet.Window, most)
	}

	// Resolve with less time than the window: not recorded yet, and when
	// the absence becomes final.
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = c.Resolve(short, unknown)
	cancel()
	if errors.Is(err, client.ErrKeyUnknown) {
		t.Fatalf("Resolve while the request runs = %v: concluded that no attempt committed", err)
	}
	if !errors.As(err, &notYet) || !errors.Is(err, client.ErrKeyNotYetRecorded) {
		t.Fatalf("Resolve while the request runs = %v, want a NotRecordedError", err)
	}
	if notYet.FinalAt.Before(unknown.LastSent.Add(to.request + to.lock)) {
		t.Errorf("final at %v, earlier than the last attempt (%v) plus the request timeout and a lock wait",
			notYet.FinalAt, unknown.LastSent)
	}
	if notYet.Key != key || notYet.Endpoint != client.EndpointCreateOrder {
		t.Errorf("the error names key %q on %q, want %q on %q", notYet.Key, notYet.Endpoint, key, client.EndpointCreateOrder)
	}

	// What the error advises: the same request with the same key, while
	// the first still runs. It waits behind the same lock.
	resent := make(chan error, 1)
	go func() {
		res, err := e.client(t, client.Policy{}).CreateOrder(ctx, key, orderRequest("inv-in-flight"))
		if err == nil && res.Status != http.StatusCreated {
			err = errors.New("not a 201")
		}
		resent <- err
	}()
	e.waitForLockWaiters(t, 2)

	// The lock is released: both attempts go on, one commits.
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if status := <-done; status != http.StatusCreated {
		t.Errorf("the first attempt ended with %d, want 201 (or its replay)", status)
	}
	if err := <-resent; err != nil {
		t.Errorf("the resent request: %v", err)
	}
	st, err := c.Resolve(ctx, unknown)
	if err != nil {
		t.Fatalf("Resolve after the request finished: %v", err)
	}
	if st.State != "completed" || st.ResponseStatus == nil || *st.ResponseStatus != http.StatusCreated || st.Resource == nil {
		t.Errorf("key status = %+v, want completed with 201 and the order", st)
	}
	e.wantRows(t, "inv-in-flight", 1, 1)
}
