package idem

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// age moves the key's horizons: resultGone puts expires_at in the past,
// keyGone retain_until too (the CHECK wants retain_until >= expires_at).
func (h *bundle) age(t *testing.T, c Claim, resultGone, keyGone bool) {
	t.Helper()
	sql := `UPDATE idempotency_keys SET
	            expires_at = CASE WHEN $4 THEN now() - interval '1 second' ELSE expires_at END,
	            retain_until = CASE WHEN $5 THEN now() - interval '1 second' ELSE retain_until END
	        WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3`
	if _, err := h.pool.Exec(t.Context(), sql, c.TenantID, c.Endpoint, c.Key, resultGone, keyGone); err != nil {
		t.Fatal(err)
	}
}

// prune does what the reaper does to a completed key past its TTL.
func (h *bundle) prune(t *testing.T, c Claim) {
	t.Helper()
	if _, err := h.pool.Exec(t.Context(), `UPDATE idempotency_keys SET state = 'expired', response_headers = NULL, response_body = NULL
		WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3`, c.TenantID, c.Endpoint, c.Key); err != nil {
		t.Fatal(err)
	}
}

// E3: within the TTL the result is replayed; past it, whether pruned to a
// tombstone yet or not, the same request gets ErrResultExpired with what it
// created, and nothing runs; another request under the key is still 422.
// Past the key's retention the key is unknown and the request runs afresh.
func TestExecuteAcrossTheTwoHorizons(t *testing.T) {
	t.Parallel()
	for _, pruned := range []bool{false, true} {
		name := "NotPrunedYet"
		if pruned {
			name = "PrunedToATombstone"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := setup(t)
			store := NewStore(h.pool, Config{})
			c := h.claim(t, "key-1", `{"amount":100}`)
			want := created(`{"id":"t_1"}`)
			var calls atomic.Int32
			if _, _, err := store.Execute(t.Context(), c, insertExec(&calls, h.tenant, "first", want)); err != nil {
				t.Fatal(err)
			}

			if _, replayed, err := store.Execute(t.Context(), c, notCalled(t)); err != nil || !replayed {
				t.Fatalf("within the TTL: replayed %v, err %v; want the replay", replayed, err)
			}

			h.age(t, c, true, false)
			if pruned {
				h.prune(t, c)
			}
			_, _, err := store.Execute(t.Context(), c, notCalled(t))
			var expired *ResultExpiredError
			if !errors.As(err, &expired) || !errors.Is(err, ErrResultExpired) {
				t.Fatalf("past the TTL: err = %v, want *ResultExpiredError", err)
			}
			if expired.Status != want.Status || expired.Location != "/v1/things/t_1" {
				t.Errorf("expired = %+v, want status %d and the Location of the original", expired, want.Status)
			}
			other := h.claim(t, "key-1", `{"amount":999}`)
			if _, _, err := store.Execute(t.Context(), other, notCalled(t)); !errors.Is(err, ErrKeyReused) {
				t.Errorf("another request past the TTL: err = %v, want ErrKeyReused", err)
			}

			h.age(t, c, true, true)
			again := created(`{"id":"t_2"}`)
			res, replayed, err := store.Execute(t.Context(), c, insertExec(&calls, h.tenant, "second", again))
			if err != nil || replayed {
				t.Fatalf("past the key's retention: replayed %v, err %v; want a fresh execution", replayed, err)
			}
			if diff := cmp.Diff(again, res, ignoreExpires); diff != "" {
				t.Errorf("response (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]scratchRow{{h.tenant, "first"}, {h.tenant, "second"}}, h.scratch(t), ignoreExpires); diff != "" {
				t.Errorf("business rows (-want +got):\n%s", diff)
			}
			checkCompleted(t, h.onlyKeyRow(t), c, again)
			if got := calls.Load(); got != 2 {
				t.Errorf("exec ran %d times, want 2", got)
			}
		})
	}
}

// E3: a key past its retention is unknown to a request that fails before
// its first statement too (a validation failure): its lookup then goes out
// with the failure's record, and the forgotten row gives way to the new
// record instead of answering 409 to every retry.
func TestExecuteRecordsAFailureOverAForgottenKey(t *testing.T) {
	t.Parallel()
	h := setup(t)
	store := NewStore(h.pool, Config{})
	c := h.claim(t, "key-1", `{"amount":100}`)
	var calls atomic.Int32
	if _, _, err := store.Execute(t.Context(), c, insertExec(&calls, h.tenant, "first", created(`{"id":"t_1"}`))); err != nil {
		t.Fatal(err)
	}
	h.age(t, c, true, true)
	want := problem(422, "validation_failed")
	rejected := func(context.Context, UndoableTx) (Response, error) { return want, nil }
	for _, wantReplayed := range []bool{false, true} {
		res, replayed, err := store.Execute(t.Context(), c, rejected)
		if err != nil || replayed != wantReplayed {
			t.Fatalf("replayed %v, err %v; want replayed %v and the recorded failure", replayed, err, wantReplayed)
		}
		if diff := cmp.Diff(want, res, ignoreExpires); diff != "" {
			t.Errorf("response (-want +got):\n%s", diff)
		}
	}
	checkCompleted(t, h.onlyKeyRow(t), c, want)
}

// E3: a key still in progress is never claimed over, however old.
func TestExecuteNeverClaimsOverAnInProgressKey(t *testing.T) {
	t.Parallel()
	h := setup(t)
	store := NewStore(h.pool, Config{LockTimeout: 200e6})
	c := h.claim(t, "stuck", `{"amount":100}`)
	if _, err := h.pool.Exec(t.Context(), `INSERT INTO idempotency_keys
		(tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, expires_at, retain_until)
		VALUES ($1, $2, $3, $4, $5, now() - interval '2 days', now() - interval '1 day')`,
		c.TenantID, c.Endpoint, c.Key, c.Fingerprint, FingerprintVersion); err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.Execute(t.Context(), c, notCalled(t)); !errors.Is(err, ErrKeyInUse) {
		t.Errorf("err = %v, want ErrKeyInUse", err)
	}
	if row := h.onlyKeyRow(t); row.State != "in_progress" {
		t.Errorf("state = %s, want in_progress", row.State)
	}
}
