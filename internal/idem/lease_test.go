package idem

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/tooling/testkit"
)

// Multi-step keys (S1, S3): Begin, Phase, Release, TakeOverExpired and
// DeriveKey, against a real database. The phases write to the bundle's
// scratch table, standing in for a payment row, so every test can check
// which writes committed.

// Leases in these tests. A short lease expires while the test waits for it
// (by polling the database until locked_until < now(), never by sleeping);
// a long one outlives any test, so "the lease is live" never depends on how
// fast the machine is.
const (
	shortLease = 200 * time.Millisecond
	longLease  = time.Hour
)

// Recovery points of the pretend multi-step endpoint.
const (
	recoveryThingCreated = "thing_created"
	recoveryThingSent    = "thing_sent"
)

// otherEndpoint is a second multi-step endpoint.
const otherEndpoint = "POST /v1/things/{id}/parts"

// leaseStores returns two stores over h.pool that differ only in the lease
// they take: short's expire during the test, long's never do.
func (h *bundle) leaseStores() (short, long *Store) {
	return NewStore(h.pool, Config{Lease: shortLease}), NewStore(h.pool, Config{Lease: longLease})
}

// claimAt is h.claim on another endpoint.
func (h *bundle) claimAt(t *testing.T, endpoint, key, body string) Claim {
	t.Helper()
	fp, err := Fingerprint(endpoint, nil, json.RawMessage(body))
	if err != nil {
		t.Fatal(err)
	}
	return Claim{TenantID: h.tenant, Endpoint: endpoint, Key: key, Fingerprint: fp}
}

// leaseRow is the multi-step part of a key row.
type leaseRow struct {
	State         string
	RecoveryPoint string    // "" for NULL
	Generation    int64     // lease_generation
	ResourceID    uuid.UUID // uuid.Nil for NULL
	// Lock is "none" (locked_until is NULL), "live" (in the future) or
	// "expired" (at or before now()).
	Lock string
}

// leaseRowOf reads c's key row through q (the pool, or a transaction that
// must see its own uncommitted writes); ok is false when there is none.
func leaseRowOf(t *testing.T, q testkit.Querier, c Claim) (row leaseRow, ok bool) {
	t.Helper()
	k, ok := testkit.ReadKeyRow(t, q, c.TenantID, c.Endpoint, c.Key)
	if !ok {
		return leaseRow{}, false
	}
	return leaseRow{State: k.State, RecoveryPoint: k.RecoveryPoint, Generation: k.Generation, ResourceID: k.ResourceID, Lock: k.Lock}, true
}

// wantLeaseRow checks c's key row.
func (h *bundle) wantLeaseRow(t *testing.T, c Claim, want leaseRow) {
	t.Helper()
	got, ok := leaseRowOf(t, h.pool, c)
	if !ok {
		t.Fatalf("no key row for %q", c.Key)
	}
	if diff := cmp.Diff(want, got, ignoreExpires); diff != "" {
		t.Errorf("key row of %q (-want +got):\n%s", c.Key, diff)
	}
}

// snapshot returns c's whole key row as JSON, timestamps included, to
// check that something changed nothing at all.
func (h *bundle) snapshot(t *testing.T, c Claim) string {
	t.Helper()
	return testkit.KeyRowJSON(t, h.pool, c.TenantID, c.Endpoint, c.Key)
}

// waitLeaseExpired waits until the lease on each claim's key has expired.
func (h *bundle) waitLeaseExpired(t *testing.T, ctx context.Context, claims ...Claim) {
	t.Helper()
	for _, c := range claims {
		waitUntil(t, ctx, h.pool, `
			SELECT coalesce(locked_until < now(), false) FROM idempotency_keys
			WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3`,
			c.TenantID, c.Endpoint, c.Key)
	}
}

func insertScratch(ctx context.Context, tx pgx.Tx, tenant uuid.UUID, v string) error {
	_, err := tx.Exec(ctx, `INSERT INTO scratch (tenant_id, v) VALUES ($1, $2)`, tenant, v)
	return err
}

// firstPhase returns a first phase for Begin that counts its calls, writes
// v to scratch and decides step.
func firstPhase(calls *atomic.Int32, tenant uuid.UUID, v string, step Step) func(context.Context, pgx.Tx, Lease) (Step, error) {
	return func(ctx context.Context, tx pgx.Tx, _ Lease) (Step, error) {
		calls.Add(1)
		return step, insertScratch(ctx, tx, tenant, v)
	}
}

// phase is firstPhase for Phase. A run counts once its statement has
// executed: a phase's Go code runs up to its first statement even for a
// lost lease, whose fence (travelling with that statement) then stops it.
func phase(calls *atomic.Int32, tenant uuid.UUID, v string, step Step) func(context.Context, pgx.Tx) (Step, error) {
	return func(ctx context.Context, tx pgx.Tx) (Step, error) {
		if err := insertScratch(ctx, tx, tenant, v); err != nil {
			return Step{}, err
		}
		calls.Add(1)
		return step, nil
	}
}

// mustBegin begins c with a first phase that writes v to scratch and
// advances to point with resource, and returns the lease.
func (h *bundle) mustBegin(t *testing.T, store *Store, c Claim, v, point string, resource uuid.UUID) Lease {
	t.Helper()
	var calls atomic.Int32
	b, err := store.Begin(t.Context(), c, firstPhase(&calls, h.tenant, v, Step{RecoveryPoint: point, ResourceID: resource}))
	if err != nil {
		t.Fatalf("Begin(%q): %v", c.Key, err)
	}
	if b.Response != nil || calls.Load() != 1 {
		t.Fatalf("Begin(%q) = %+v after %d first phases; want a fresh lease", c.Key, b, calls.Load())
	}
	return b.Lease
}

func (h *bundle) wantScratch(t *testing.T, vs ...string) {
	t.Helper()
	want := []scratchRow{}
	for _, v := range vs {
		want = append(want, scratchRow{h.tenant, v})
	}
	got := append([]scratchRow{}, h.scratch(t)...)
	// Sorted here, not by the database's collation.
	byV := func(a, b scratchRow) int { return strings.Compare(a.V, b.V) }
	slices.SortFunc(want, byV)
	slices.SortFunc(got, byV)
	if diff := cmp.Diff(want, got, ignoreExpires); diff != "" {
		t.Errorf("scratch rows (-want +got):\n%s", diff)
	}
}

func TestBeginRunsFirstPhaseInClaimTransaction(t *testing.T) {
	t.Parallel()
	h := setup(t)
	_, store := h.leaseStores()
	c := h.claim(t, "key-1", `{"amount":100}`)
	resource := uuid.New()
	var calls atomic.Int32

	var inside leaseRow
	var insideOK, visibleOutside bool
	b, err := store.Begin(t.Context(), c, func(ctx context.Context, tx pgx.Tx, l Lease) (Step, error) {
		calls.Add(1)
		if diff := cmp.Diff(Lease{Claim: c, Generation: 1, RecoveryPoint: RecoveryStarted}, l, ignoreExpires); diff != "" {
			t.Errorf("lease given to the first phase (-want +got):\n%s", diff)
		}
		inside, insideOK = leaseRowOf(t, tx, c)
		_, visibleOutside = leaseRowOf(t, h.pool, c)
		return Step{RecoveryPoint: recoveryThingCreated, ResourceID: resource}, insertScratch(ctx, tx, h.tenant, "created")
	})
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	if got := calls.Load(); got != 1 {
		t.Errorf("first phase ran %d times, want 1", got)
	}

	t.Run("FirstPhaseSeesItsOwnUncommittedClaim", func(t *testing.T) {
		if !insideOK {
			t.Fatal("the first phase's transaction has no key row: it does not run in the claim's transaction")
		}
		want := leaseRow{State: "in_progress", RecoveryPoint: RecoveryStarted, Generation: 1, Lock: "live"}
		if diff := cmp.Diff(want, inside, ignoreExpires); diff != "" {
			t.Errorf("key row inside the first phase (-want +got):\n%s", diff)
		}
		if visibleOutside {
			t.Error("the claim was visible to another connection before the first phase returned")
		}
	})

	t.Run("ClaimAndFirstPhaseCommitTogether", func(t *testing.T) {
		want := Begun{Lease: Lease{Claim: c, Generation: 1, RecoveryPoint: recoveryThingCreated, ResourceID: resource}}
		if diff := cmp.Diff(want, b, ignoreExpires); diff != "" {
			t.Errorf("Begin (-want +got):\n%s", diff)
		}
		h.wantLeaseRow(t, c, leaseRow{State: "in_progress", RecoveryPoint: recoveryThingCreated, Generation: 1, ResourceID: resource, Lock: "live"})
		h.wantScratch(t, "created")
	})
}

func TestBeginFirstPhaseDeterministicFailure(t *testing.T) {
	t.Parallel()
	h := setup(t)
	_, store := h.leaseStores()
	c := h.claim(t, "key-1", `{"amount":100}`)
	want := problem(http.StatusUnprocessableEntity, "insufficient_funds")
	var calls atomic.Int32

	b, err := store.Begin(t.Context(), c, firstPhase(&calls, h.tenant, "rolled back", Step{Response: &want}))
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	if diff := cmp.Diff(&want, b.Response, ignoreExpires); diff != "" {
		t.Errorf("Begin response (-want +got):\n%s", diff)
	}
	if b.Replayed {
		t.Error("Replayed = true on the request that ran")
	}
	t.Run("WritesRolledBackToTheSavepoint", func(t *testing.T) {
		h.wantScratch(t)
	})
	t.Run("KeyCompletedWithTheFailure", func(t *testing.T) {
		h.wantLeaseRow(t, c, leaseRow{State: "completed", RecoveryPoint: RecoveryFinished, Generation: 1, Lock: "none"})
		checkCompleted(t, h.onlyKeyRow(t), c, want)
	})
	t.Run("LaterBeginReplays", func(t *testing.T) {
		b, err := store.Begin(t.Context(), c, firstPhase(&calls, h.tenant, "retry", Step{RecoveryPoint: recoveryThingCreated}))
		if err != nil {
			t.Fatalf("Begin: %v", err)
		}
		if diff := cmp.Diff(Begun{Response: &want, Replayed: true}, b, ignoreExpires); diff != "" {
			t.Errorf("replay (-want +got):\n%s", diff)
		}
		if got := calls.Load(); got != 1 {
			t.Errorf("first phase ran %d times in all, want 1", got)
		}
		h.wantScratch(t)
		checkCompleted(t, h.onlyKeyRow(t), c, want)
	})
}

func TestBeginFirstPhaseErrorLeavesNothing(t *testing.T) {
	t.Parallel()
	h := setup(t)
	_, store := h.leaseStores()
	c := h.claim(t, "key-1", `{}`)
	errBoom := errors.New("boom")
	var calls atomic.Int32

	b, err := store.Begin(t.Context(), c, func(ctx context.Context, tx pgx.Tx, _ Lease) (Step, error) {
		calls.Add(1)
		if err := insertScratch(ctx, tx, h.tenant, "failed"); err != nil {
			return Step{}, err
		}
		return Step{RecoveryPoint: recoveryThingCreated}, errBoom
	})
	if !errors.Is(err, errBoom) {
		t.Fatalf("Begin = %+v, %v; want it to wrap %v", b, err, errBoom)
	}
	if rows := h.keyRows(t); len(rows) != 0 {
		t.Errorf("a failed first phase left key rows: %+v", rows)
	}
	h.wantScratch(t)

	t.Run("RetryClaimsAfresh", func(t *testing.T) {
		l := h.mustBegin(t, store, c, "retry", recoveryThingCreated, uuid.Nil)
		if l.Generation != 1 || l.Resumed {
			t.Errorf("retry lease = %+v; want generation 1, not resumed", l)
		}
		h.wantScratch(t, "retry")
	})
}

func TestBeginOnExistingKey(t *testing.T) {
	t.Parallel()

	t.Run("LiveLeaseIsKeyInUse", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		_, long := h.leaseStores()
		c := h.claim(t, "key-1", `{"amount":100}`)
		h.mustBegin(t, long, c, "first", recoveryThingCreated, uuid.Nil)
		before := h.snapshot(t, c)
		var calls atomic.Int32

		b, err := long.Begin(t.Context(), c, firstPhase(&calls, h.tenant, "second", Step{RecoveryPoint: recoveryThingCreated}))
		if !errors.Is(err, ErrKeyInUse) {
			t.Fatalf("Begin under a live lease = %+v, %v; want ErrKeyInUse", b, err)
		}
		if got := calls.Load(); got != 0 {
			t.Errorf("first phase ran %d times, want 0", got)
		}
		if diff := cmp.Diff(before, h.snapshot(t, c), ignoreExpires); diff != "" {
			t.Errorf("the key row changed (-before +after):\n%s", diff)
		}
		h.wantScratch(t, "first")
	})

	for _, tt := range []struct {
		name   string
		expire bool
	}{
		{name: "OtherFingerprintUnderLiveLeaseIsKeyReused"},
		{name: "OtherFingerprintAfterExpiryIsKeyReusedNotTakeover", expire: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := setup(t)
			short, long := h.leaseStores()
			c := h.claim(t, "key-1", `{"amount":100}`)
			holder := long
			if tt.expire {
				holder = short
			}
			h.mustBegin(t, holder, c, "first", recoveryThingCreated, uuid.Nil)
			if tt.expire {
				h.waitLeaseExpired(t, deadline(t), c)
			}
			before := h.snapshot(t, c)
			var calls atomic.Int32

			other := h.claim(t, "key-1", `{"amount":999}`)
			b, err := long.Begin(t.Context(), other, firstPhase(&calls, h.tenant, "other", Step{RecoveryPoint: recoveryThingCreated}))
			if !errors.Is(err, ErrKeyReused) {
				t.Fatalf("Begin with another fingerprint = %+v, %v; want ErrKeyReused", b, err)
			}
			if got := calls.Load(); got != 0 {
				t.Errorf("first phase ran %d times, want 0", got)
			}
			// No takeover: same generation, same lease, same everything.
			if diff := cmp.Diff(before, h.snapshot(t, c), ignoreExpires); diff != "" {
				t.Errorf("the key row changed (-before +after):\n%s", diff)
			}
			h.wantScratch(t, "first")
		})
	}

	t.Run("SameFingerprintAfterExpiryTakesOver", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		short, long := h.leaseStores()
		c := h.claim(t, "key-1", `{"amount":100}`)
		resource := uuid.New()
		h.mustBegin(t, short, c, "first", recoveryThingCreated, resource)
		h.waitLeaseExpired(t, deadline(t), c)
		var calls atomic.Int32

		b, err := long.Begin(t.Context(), c, firstPhase(&calls, h.tenant, "second", Step{RecoveryPoint: recoveryThingCreated}))
		if err != nil {
			t.Fatalf("Begin after the lease expired: %v", err)
		}
		want := Begun{Lease: Lease{Claim: c, Generation: 2, RecoveryPoint: recoveryThingCreated, ResourceID: resource, Resumed: true}}
		if diff := cmp.Diff(want, b, ignoreExpires); diff != "" {
			t.Errorf("takeover (-want +got):\n%s", diff)
		}
		if got := calls.Load(); got != 0 {
			t.Errorf("first phase ran %d times on a takeover, want 0", got)
		}
		h.wantLeaseRow(t, c, leaseRow{State: "in_progress", RecoveryPoint: recoveryThingCreated, Generation: 2, ResourceID: resource, Lock: "live"})
		h.wantScratch(t, "first")

		t.Run("TakenOverLeaseIsLive", func(t *testing.T) {
			b, err := long.Begin(t.Context(), c, firstPhase(&calls, h.tenant, "third", Step{RecoveryPoint: recoveryThingCreated}))
			if !errors.Is(err, ErrKeyInUse) {
				t.Fatalf("Begin under the new lease = %+v, %v; want ErrKeyInUse", b, err)
			}
			h.wantLeaseRow(t, c, leaseRow{State: "in_progress", RecoveryPoint: recoveryThingCreated, Generation: 2, ResourceID: resource, Lock: "live"})
		})
	})
}

func TestPhaseFencesOffTakenOverAttempt(t *testing.T) {
	t.Parallel()
	h := setup(t)
	short, long := h.leaseStores()
	c := h.claim(t, "key-1", `{"amount":100}`)
	resource := uuid.New()

	// Attempt A holds generation 1 and stalls until its lease expires.
	a := h.mustBegin(t, short, c, "a: created", recoveryThingCreated, resource)
	h.waitLeaseExpired(t, deadline(t), c)

	// Attempt B (a retry with the same request) takes over.
	bBegun, err := long.Begin(t.Context(), c, func(context.Context, pgx.Tx, Lease) (Step, error) {
		t.Error("first phase ran on a takeover")
		return Step{}, errors.New("must not run")
	})
	if err != nil {
		t.Fatalf("takeover: %v", err)
	}
	b := bBegun.Lease
	if b.Generation != 2 || !b.Resumed {
		t.Fatalf("takeover lease = %+v; want generation 2, resumed", b)
	}

	var aCalls, bCalls atomic.Int32
	t.Run("StaleAttemptGetsLeaseLost", func(t *testing.T) {
		res, err := short.Phase(t.Context(), &a, phase(&aCalls, h.tenant, "a: sent", Step{RecoveryPoint: recoveryThingSent}))
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("stale Phase = %+v, %v; want ErrLeaseLost", res, err)
		}
		if got := aCalls.Load(); got != 0 {
			t.Errorf("the stale attempt's phase ran %d times, want 0", got)
		}
		if a.RecoveryPoint != recoveryThingCreated {
			t.Errorf("stale lease's recovery point = %q, want %q", a.RecoveryPoint, recoveryThingCreated)
		}
		h.wantScratch(t, "a: created")
		h.wantLeaseRow(t, c, leaseRow{State: "in_progress", RecoveryPoint: recoveryThingCreated, Generation: 2, ResourceID: resource, Lock: "live"})
	})

	t.Run("AttemptThatTookOverAdvances", func(t *testing.T) {
		res, err := long.Phase(t.Context(), &b, phase(&bCalls, h.tenant, "b: sent", Step{RecoveryPoint: recoveryThingSent}))
		if err != nil || res != nil {
			t.Fatalf("Phase = %+v, %v; want an advance", res, err)
		}
		if b.RecoveryPoint != recoveryThingSent {
			t.Errorf("lease recovery point = %q, want %q", b.RecoveryPoint, recoveryThingSent)
		}
		h.wantScratch(t, "a: created", "b: sent")
		h.wantLeaseRow(t, c, leaseRow{State: "in_progress", RecoveryPoint: recoveryThingSent, Generation: 2, ResourceID: resource, Lock: "live"})
	})

	want := created(`{"id":"t_1"}`)
	t.Run("LastPhaseCompletesTheKey", func(t *testing.T) {
		res, err := long.Phase(t.Context(), &b, phase(&bCalls, h.tenant, "b: done", Step{Response: &want}))
		if err != nil {
			t.Fatalf("Phase: %v", err)
		}
		if diff := cmp.Diff(&want, res, ignoreExpires); diff != "" {
			t.Errorf("Phase response (-want +got):\n%s", diff)
		}
		if got := bCalls.Load(); got != 2 {
			t.Errorf("the live attempt's phases ran %d times, want 2", got)
		}
		h.wantScratch(t, "a: created", "b: sent", "b: done")
		h.wantLeaseRow(t, c, leaseRow{State: "completed", RecoveryPoint: RecoveryFinished, Generation: 2, ResourceID: resource, Lock: "none"})
		checkCompleted(t, h.onlyKeyRow(t), c, want)
	})

	t.Run("StaleAttemptCannotTouchCompletedKey", func(t *testing.T) {
		before := h.snapshot(t, c)
		res, err := short.Phase(t.Context(), &a, phase(&aCalls, h.tenant, "a: late", Step{Response: &want}))
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("stale Phase on a completed key = %+v, %v; want ErrLeaseLost", res, err)
		}
		if got := aCalls.Load(); got != 0 {
			t.Errorf("the stale attempt's phase ran %d times, want 0", got)
		}
		if diff := cmp.Diff(before, h.snapshot(t, c), ignoreExpires); diff != "" {
			t.Errorf("the key row changed (-before +after):\n%s", diff)
		}
		h.wantScratch(t, "a: created", "b: sent", "b: done")
	})

	t.Run("LaterBeginReplays", func(t *testing.T) {
		var calls atomic.Int32
		got, err := long.Begin(t.Context(), c, firstPhase(&calls, h.tenant, "retry", Step{RecoveryPoint: recoveryThingCreated}))
		if err != nil {
			t.Fatalf("Begin: %v", err)
		}
		if diff := cmp.Diff(Begun{Response: &want, Replayed: true}, got, ignoreExpires); diff != "" {
			t.Errorf("replay (-want +got):\n%s", diff)
		}
		if calls.Load() != 0 {
			t.Error("first phase ran on a completed key")
		}
		h.wantScratch(t, "a: created", "b: sent", "b: done")
	})
}

// A phase holds the key row locked until it commits, so a takeover waits
// for it and then finds the lease the phase renewed: the phase's work is
// never overtaken halfway.
func TestPhaseInFlightHoldsOffTakeover(t *testing.T) {
	t.Parallel()
	h := setup(t)
	short, long := h.leaseStores()
	// The retry waits on the phase's row lock for as long as the test
	// lets it, so it reaches the lease check instead of timing out.
	patient := NewStore(h.pool, Config{Lease: longLease, LockTimeout: time.Minute})
	c := h.claim(t, "key-1", `{}`)
	bound := deadline(t)

	a := h.mustBegin(t, short, c, "created", recoveryThingCreated, uuid.Nil)
	h.waitLeaseExpired(t, bound, c)

	var retryCalls atomic.Int32
	retried := make(chan error, 1)
	res, err := long.Phase(bound, &a, func(ctx context.Context, tx pgx.Tx) (Step, error) {
		if err := insertScratch(ctx, tx, h.tenant, "sent"); err != nil {
			return Step{}, err
		}
		// The lease has expired, but this phase holds the row: a retry
		// arriving now must wait for it.
		go func() {
			_, err := patient.Begin(bound, c, firstPhase(&retryCalls, h.tenant, "retry", Step{RecoveryPoint: recoveryThingCreated}))
			retried <- err
		}()
		waitUntil(t, bound, h.pool, lockWaitersAtLeast, 1)
		return Step{RecoveryPoint: recoveryThingSent}, nil
	})
	if err != nil || res != nil {
		t.Fatalf("Phase = %+v, %v; want an advance", res, err)
	}
	if err := <-retried; !errors.Is(err, ErrKeyInUse) {
		t.Errorf("retry during the phase: %v; want ErrKeyInUse (the phase renewed the lease)", err)
	}
	if retryCalls.Load() != 0 {
		t.Error("the retry's first phase ran")
	}
	h.wantLeaseRow(t, c, leaseRow{State: "in_progress", RecoveryPoint: recoveryThingSent, Generation: 1, Lock: "live"})
	h.wantScratch(t, "created", "sent")
}

func TestPhaseErrorRollsBack(t *testing.T) {
	t.Parallel()
	h := setup(t)
	_, store := h.leaseStores()
	c := h.claim(t, "key-1", `{}`)
	resource := uuid.New()
	l := h.mustBegin(t, store, c, "created", recoveryThingCreated, resource)
	before := h.snapshot(t, c)
	errBoom := errors.New("boom")
	var calls atomic.Int32

	res, err := store.Phase(t.Context(), &l, func(ctx context.Context, tx pgx.Tx) (Step, error) {
		calls.Add(1)
		if err := insertScratch(ctx, tx, h.tenant, "failed"); err != nil {
			return Step{}, err
		}
		return Step{RecoveryPoint: recoveryThingSent}, errBoom
	})
	if !errors.Is(err, errBoom) || res != nil {
		t.Fatalf("Phase = %+v, %v; want it to wrap %v", res, err, errBoom)
	}
	if calls.Load() != 1 {
		t.Errorf("phase ran %d times, want 1", calls.Load())
	}
	h.wantScratch(t, "created")
	if diff := cmp.Diff(before, h.snapshot(t, c), ignoreExpires); diff != "" {
		t.Errorf("the key row changed (-before +after):\n%s", diff)
	}
	if l.RecoveryPoint != recoveryThingCreated {
		t.Errorf("lease recovery point = %q, want %q", l.RecoveryPoint, recoveryThingCreated)
	}

	t.Run("LeaseStillUsable", func(t *testing.T) {
		if _, err := store.Phase(t.Context(), &l, phase(&calls, h.tenant, "sent", Step{RecoveryPoint: recoveryThingSent})); err != nil {
			t.Fatalf("Phase after a failed one: %v", err)
		}
		h.wantScratch(t, "created", "sent")
		h.wantLeaseRow(t, c, leaseRow{State: "in_progress", RecoveryPoint: recoveryThingSent, Generation: 1, ResourceID: resource, Lock: "live"})
	})
}

func TestRelease(t *testing.T) {
	t.Parallel()
	h := setup(t)
	_, store := h.leaseStores()
	c := h.claim(t, "key-1", `{}`)
	resource := uuid.New()
	first := h.mustBegin(t, store, c, "created", recoveryThingCreated, resource)

	if err := store.Release(t.Context(), first, 0); err != nil {
		t.Fatalf("Release: %v", err)
	}
	t.Run("EndsTheLeaseKeepsThePoint", func(t *testing.T) {
		h.wantLeaseRow(t, c, leaseRow{State: "in_progress", RecoveryPoint: recoveryThingCreated, Generation: 1, ResourceID: resource, Lock: "expired"})
	})

	var second Lease
	t.Run("ImmediateRetryTakesOver", func(t *testing.T) {
		var calls atomic.Int32
		b, err := store.Begin(t.Context(), c, firstPhase(&calls, h.tenant, "retry", Step{RecoveryPoint: recoveryThingCreated}))
		if err != nil {
			t.Fatalf("Begin after Release: %v", err)
		}
		want := Begun{Lease: Lease{Claim: c, Generation: 2, RecoveryPoint: recoveryThingCreated, ResourceID: resource, Resumed: true}}
		if diff := cmp.Diff(want, b, ignoreExpires); diff != "" {
			t.Errorf("takeover (-want +got):\n%s", diff)
		}
		if calls.Load() != 0 {
			t.Error("first phase ran on a takeover")
		}
		second = b.Lease
		h.wantLeaseRow(t, c, leaseRow{State: "in_progress", RecoveryPoint: recoveryThingCreated, Generation: 2, ResourceID: resource, Lock: "live"})
	})

	t.Run("StaleGenerationChangesNothing", func(t *testing.T) {
		before := h.snapshot(t, c)
		if err := store.Release(t.Context(), first, 0); err != nil {
			t.Fatalf("stale Release: %v", err)
		}
		if diff := cmp.Diff(before, h.snapshot(t, c), ignoreExpires); diff != "" {
			t.Errorf("a stale Release changed the key row (-before +after):\n%s", diff)
		}
	})

	t.Run("CompletedKeyStaysCompleted", func(t *testing.T) {
		if second.Generation != 2 {
			t.Fatalf("the takeover holds generation %d, want 2 (see the subtests above)", second.Generation)
		}
		want := created(`{}`)
		var calls atomic.Int32
		if _, err := store.Phase(t.Context(), &second, phase(&calls, h.tenant, "done", Step{Response: &want})); err != nil {
			t.Fatalf("Phase: %v", err)
		}
		before := h.snapshot(t, c)
		if err := store.Release(t.Context(), second, 0); err != nil {
			t.Fatalf("Release of a completed key: %v", err)
		}
		if diff := cmp.Diff(before, h.snapshot(t, c), ignoreExpires); diff != "" {
			t.Errorf("Release changed a completed key row (-before +after):\n%s", diff)
		}
		h.wantScratch(t, "created", "done")
	})
}

func TestTakeOverExpired(t *testing.T) {
	t.Parallel()
	endpoints := []string{testEndpoint, otherEndpoint}

	t.Run("OnlyExpiredMultiStepKeysOfTheGivenEndpoints", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		short, long := h.leaseStores()
		bound := deadline(t)

		expiredA := h.claim(t, "expired-a", `{}`)
		expiredB := h.claimAt(t, otherEndpoint, "expired-b", `{}`)
		resourceA, resourceB := uuid.New(), uuid.New()
		h.mustBegin(t, short, expiredA, "a", recoveryThingCreated, resourceA)
		h.mustBegin(t, short, expiredB, "b", recoveryThingSent, resourceB)

		live := h.claim(t, "live", `{}`)
		h.mustBegin(t, long, live, "live", recoveryThingCreated, uuid.New())

		completed := h.claim(t, "completed", `{}`)
		res := created(`{}`)
		var calls atomic.Int32
		if _, err := short.Begin(bound, completed, firstPhase(&calls, h.tenant, "completed", Step{Response: &res})); err != nil {
			t.Fatal(err)
		}

		elsewhere := h.claimAt(t, "POST /v1/elsewhere", "elsewhere", `{}`)
		h.mustBegin(t, short, elsewhere, "elsewhere", recoveryThingCreated, uuid.New())

		// A one-transaction key left in progress, even with a stale
		// locked_until, is not the completer's: it has no recovery point.
		oneTx := h.claim(t, "one-transaction", `{}`)
		if _, err := h.pool.Exec(bound, `
			INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, expires_at, retain_until, locked_until)
			VALUES ($1, $2, $3, $4, $5, now() + interval '1 day', now() + interval '3 days', now() - interval '1 hour')`,
			oneTx.TenantID, oneTx.Endpoint, oneTx.Key, oneTx.Fingerprint, FingerprintVersion); err != nil {
			t.Fatal(err)
		}

		h.waitLeaseExpired(t, bound, expiredA, expiredB, elsewhere)
		untouched := []Claim{live, completed, elsewhere, oneTx}
		before := map[string]string{}
		for _, c := range untouched {
			before[c.Key] = h.snapshot(t, c)
		}

		leases, err := long.TakeOverExpired(bound, endpoints, 10)
		if err != nil {
			t.Fatalf("TakeOverExpired: %v", err)
		}
		slices.SortFunc(leases, func(a, b Lease) int { return strings.Compare(a.Key, b.Key) })
		scope := func(c Claim) Claim { return Claim{TenantID: c.TenantID, Endpoint: c.Endpoint, Key: c.Key} }
		want := []Lease{
			{Claim: scope(expiredA), Generation: 2, RecoveryPoint: recoveryThingCreated, ResourceID: resourceA, Resumed: true},
			{Claim: scope(expiredB), Generation: 2, RecoveryPoint: recoveryThingSent, ResourceID: resourceB, Resumed: true},
		}
		if diff := cmp.Diff(want, leases, ignoreExpires); diff != "" {
			t.Errorf("TakeOverExpired (-want +got):\n%s", diff)
		}
		h.wantLeaseRow(t, expiredA, leaseRow{State: "in_progress", RecoveryPoint: recoveryThingCreated, Generation: 2, ResourceID: resourceA, Lock: "live"})
		h.wantLeaseRow(t, expiredB, leaseRow{State: "in_progress", RecoveryPoint: recoveryThingSent, Generation: 2, ResourceID: resourceB, Lock: "live"})
		for _, c := range untouched {
			if diff := cmp.Diff(before[c.Key], h.snapshot(t, c), ignoreExpires); diff != "" {
				t.Errorf("TakeOverExpired changed key %q (-before +after):\n%s", c.Key, diff)
			}
		}

		t.Run("TakenOverKeysAreNotTakenAgain", func(t *testing.T) {
			leases, err := long.TakeOverExpired(bound, endpoints, 10)
			if err != nil || len(leases) != 0 {
				t.Errorf("second TakeOverExpired = %+v, %v; want nothing", leases, err)
			}
			h.wantLeaseRow(t, expiredA, leaseRow{State: "in_progress", RecoveryPoint: recoveryThingCreated, Generation: 2, ResourceID: resourceA, Lock: "live"})
		})

		t.Run("TakenOverLeaseFencesTheOldAttempt", func(t *testing.T) {
			l := Lease{Claim: expiredA, Generation: 1, RecoveryPoint: recoveryThingCreated, ResourceID: resourceA}
			var calls atomic.Int32
			if _, err := short.Phase(bound, &l, phase(&calls, h.tenant, "stale", Step{RecoveryPoint: recoveryThingSent})); !errors.Is(err, ErrLeaseLost) {
				t.Errorf("Phase of the old attempt: %v; want ErrLeaseLost", err)
			}
			if calls.Load() != 0 {
				t.Error("the old attempt's phase ran")
			}
		})
	})

	t.Run("RespectsMax", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		short, long := h.leaseStores()
		bound := deadline(t)
		var claims []Claim
		for i := range 5 {
			c := h.claim(t, fmt.Sprintf("key-%d", i), `{}`)
			h.mustBegin(t, short, c, c.Key, recoveryThingCreated, uuid.Nil)
			claims = append(claims, c)
		}
		h.waitLeaseExpired(t, bound, claims...)

		seen := map[string]bool{}
		for _, want := range []int{2, 2, 1, 0} {
			leases, err := long.TakeOverExpired(bound, endpoints, 2)
			if err != nil {
				t.Fatalf("TakeOverExpired: %v", err)
			}
			if len(leases) != want {
				t.Fatalf("TakeOverExpired(max 2) took %d keys, want %d", len(leases), want)
			}
			for _, l := range leases {
				if seen[l.Key] {
					t.Errorf("key %q taken over twice", l.Key)
				}
				seen[l.Key] = true
			}
		}
		for _, c := range claims {
			h.wantLeaseRow(t, c, leaseRow{State: "in_progress", RecoveryPoint: recoveryThingCreated, Generation: 2, Lock: "live"})
		}
	})

	t.Run("SkipsKeysAnotherCompleterHolds", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		short, long := h.leaseStores()
		bound := deadline(t)
		held, free := h.claim(t, "held", `{}`), h.claim(t, "free", `{}`)
		h.mustBegin(t, short, held, "held", recoveryThingCreated, uuid.Nil)
		h.mustBegin(t, short, free, "free", recoveryThingCreated, uuid.Nil)
		h.waitLeaseExpired(t, bound, held, free)

		// Another completer is in the middle of taking "held" over.
		tx, err := h.pool.Begin(bound)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		if _, err := tx.Exec(bound, `SELECT 1 FROM idempotency_keys WHERE idem_key = $1 FOR UPDATE`, held.Key); err != nil {
			t.Fatal(err)
		}

		type result struct {
			leases []Lease
			err    error
		}
		done := make(chan result, 1)
		go func() {
			leases, err := long.TakeOverExpired(bound, endpoints, 10)
			done <- result{leases, err}
		}()
		// Either the call returns, or it is seen waiting on the held row.
		var got result
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
	wait:
		for {
			select {
			case got = <-done:
				break wait
			case <-tick.C:
				var waiting bool
				if err := h.pool.QueryRow(bound, lockWaitersAtLeast, 1).Scan(&waiting); err != nil {
					t.Fatal(err)
				}
				if waiting {
					t.Error("TakeOverExpired waited for a row another completer holds instead of skipping it")
					if err := tx.Rollback(bound); err != nil {
						t.Fatal(err)
					}
					got = <-done
					break wait
				}
			case <-bound.Done():
				t.Fatal("TakeOverExpired never returned")
			}
		}
		if got.err != nil {
			t.Fatalf("TakeOverExpired: %v", got.err)
		}
		want := []Lease{{Claim: Claim{TenantID: h.tenant, Endpoint: testEndpoint, Key: free.Key}, Generation: 2, RecoveryPoint: recoveryThingCreated, Resumed: true}}
		if diff := cmp.Diff(want, got.leases, ignoreExpires); diff != "" {
			t.Errorf("TakeOverExpired (-want +got):\n%s", diff)
		}
		if err := tx.Rollback(bound); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
			t.Fatal(err)
		}
		h.wantLeaseRow(t, held, leaseRow{State: "in_progress", RecoveryPoint: recoveryThingCreated, Generation: 1, Lock: "expired"})
	})

	t.Run("ConcurrentCallsShareTheWork", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		short, _ := h.leaseStores()
		bound := deadline(t)
		const keys, perCall = 40, 25 // neither call alone can take them all
		var claims []Claim
		for i := range keys {
			c := h.claim(t, fmt.Sprintf("key-%02d", i), `{}`)
			h.mustBegin(t, short, c, c.Key, recoveryThingCreated, uuid.Nil)
			claims = append(claims, c)
		}
		h.waitLeaseExpired(t, bound, claims...)

		// Two completers, each with a store of its own.
		stores := []*Store{NewStore(h.pool, Config{Lease: longLease}), NewStore(h.pool, Config{Lease: longLease})}
		results := testkit.Fire(t, len(stores), func(i int) ([]Lease, error) {
			return stores[i].TakeOverExpired(bound, endpoints, perCall)
		})

		taken := map[string]int{}
		for i := range 2 {
			for _, l := range results[i] {
				taken[l.Key]++
				if l.Generation != 2 {
					t.Errorf("key %q taken over with generation %d, want 2", l.Key, l.Generation)
				}
			}
		}
		for key, n := range taken {
			if n != 1 {
				t.Errorf("key %q returned by %d calls, want 1", key, n)
			}
		}
		if len(taken) != keys {
			t.Errorf("the two calls took %d distinct keys (%d and %d), want all %d", len(taken), len(results[0]), len(results[1]), keys)
		}
		for _, c := range claims {
			h.wantLeaseRow(t, c, leaseRow{State: "in_progress", RecoveryPoint: recoveryThingCreated, Generation: 2, Lock: "live"})
		}
	})
}

func TestDeriveKey(t *testing.T) {
	t.Parallel()
	const clientKey = "8e03978e-40d5-43e8-bc93-6894a57f9324"
	base := Claim{TenantID: uuid.MustParse("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"), Endpoint: "POST /v1/payments", Key: clientKey}
	const step = "charge"

	t.Run("Deterministic", func(t *testing.T) {
		t.Parallel()
		again := base
		again.Fingerprint = []byte("a retry carries the same key")
		if a, b := DeriveKey(base, step), DeriveKey(again, step); a != b {
			t.Errorf("DeriveKey differs between two calls for one key: %s, %s", a, b)
		}
	})

	t.Run("DiffersByEveryPart", func(t *testing.T) {
		t.Parallel()
		variants := map[string]string{"base": DeriveKey(base, step)}
		add := func(name string, c Claim, step string) { variants[name] = DeriveKey(c, step) }
		add("step", base, "refund")
		c := base
		c.TenantID = uuid.MustParse("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5c")
		add("tenant", c, step)
		c = base
		c.Endpoint = "POST /v1/payments/{id}/refunds"
		add("endpoint", c, step)
		c = base
		c.Key = clientKey + "x"
		add("key", c, step)
		// Length-prefixed parts: moving a character from the key to the
		// step changes the derived key.
		c = base
		c.Key = clientKey + "c"
		add("key/step boundary", c, "harge")
		byValue := map[string]string{}
		for name, v := range variants {
			if other, ok := byValue[v]; ok {
				t.Errorf("%s and %s derive the same key %s", name, other, v)
			}
			byValue[v] = name
		}
	})

	t.Run("ShapeAndSecrecy", func(t *testing.T) {
		t.Parallel()
		for _, key := range []string{clientKey, "8e03978e40d543e8bc936894a57f9324", "k", "order-1001"} {
			c := base
			c.Key = key
			for _, step := range []string{"charge", "refund"} {
				d := DeriveKey(c, step)
				if b, err := hex.DecodeString(d); err != nil || len(b) != 32 || d != strings.ToLower(d) {
					t.Errorf("DeriveKey(%q, %q) = %q; want 64 lowercase hex digits", key, step, d)
				}
				if strings.Contains(d, key) {
					t.Errorf("DeriveKey(%q, %q) = %q contains the client's key", key, step, d)
				}
			}
		}
	})
}
