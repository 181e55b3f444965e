package httpapi_test

import (
	"context"
	"crypto/sha256"
	"net/http"
	"testing"

	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
)

// Two different keys create orders with one reference. The second waits
// on the first's uncommitted order row (the natural key, N1) and, past the
// lock timeout, gets a retryable 409 conflicting_write_in_progress with
// Retry-After: its key is not in use, another request's write is. Nothing
// of it is written. A wait on its own key's claim is still
// idempotency_key_in_use.
func TestCreateOrderBehindAnotherKeysWrite(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()

	// The first request, under key-1, inside its transaction: its order
	// row is written and not committed.
	first, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Rollback(context.Background()) })
	if _, err := first.Exec(ctx, `
		INSERT INTO orders (tenant_id, id, reference, customer_id, amount, currency)
		VALUES ($1, gen_random_uuid(), 'inv-contended', 'cus_1', 2500, 'EUR')`, e.a.ID); err != nil {
		t.Fatal(err)
	}

	res := e.post(t, e.a.Key, "key-2", orderBody("inv-contended"))
	p := wantProblem(t, res, http.StatusConflict, httpapi.CodeConflictingWrite)
	wantRetryAfter(t, res)
	if p.Detail == nil || *p.Detail == "" {
		t.Error("the problem has no detail")
	}
	if res.header.Get(httpapi.ReplayedHeader) != "" {
		t.Errorf("%s on a fresh 409", httpapi.ReplayedHeader)
	}
	// The first request's row is not committed, so it is invisible here;
	// the second wrote no order and no key.
	e.wantRows(t, 0, 0)

	t.Run("OwnKeyClaimedIsKeyInUse", func(t *testing.T) {
		held, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = held.Rollback(context.Background()) }()
		fp := sha256.Sum256([]byte("another attempt's request"))
		if _, err := held.Exec(ctx,
			`INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, expires_at, retain_until)
			 VALUES ($1, $2, 'key-3', $3, $4, now() + interval '1 day', now() + interval '3 days')`,
			e.a.ID, endpointOrders, fp[:], idem.FingerprintVersion); err != nil {
			t.Fatal(err)
		}
		res := e.post(t, e.a.Key, "key-3", orderBody("inv-free"))
		wantProblem(t, res, http.StatusConflict, httpapi.CodeKeyInUse)
		wantRetryAfter(t, res)
		e.wantRows(t, 0, 0)
	})

	// The first request rolls back: the retry under key-2 runs, once.
	if err := first.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	retry := e.post(t, e.a.Key, "key-2", orderBody("inv-contended"))
	wantStatus(t, retry, http.StatusCreated)
	if retry.header.Get(httpapi.ReplayedHeader) != "" {
		t.Errorf("the retry after a conflicting write is a replay: nothing was recorded for it")
	}
	e.wantRows(t, 1, 1)
	e.wantKeyRecord(t, e.a.ID, "key-2", http.StatusCreated)
}
