package idem

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/tooling/pgwire"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// D2: a connection lost during COMMIT is an unknown outcome. Execute sends
// COMMIT behind the statement that records the response
// (db.CommitAfterNext); the proxy cuts the connection at that COMMIT,
// after the server got it (the transaction committed) or before (it rolled
// back). Either way Execute cannot know which, so it must not answer as if
// it did: it returns ErrUnavailable (503 with Retry-After), and the
// client's retry with the same key settles it from what the database
// holds. If the COMMIT committed, the retry replays the recorded response
// without running the request again; if not, nothing was recorded and the
// retry runs it, once.
func TestExecuteCommitLostIsUnknownOutcome(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		cut       pgwire.CutMode
		committed bool
	}{
		{"CommitDelivered", pgwire.CommitDelivered, true},
		{"CommitDropped", pgwire.CommitDropped, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := setup(t)
			wire, pool := throughWire(t, h.url)
			store := NewStore(pool, Config{})
			c := h.claim(t, "key-1", `{"amount":100}`)
			want := created(`{"id":"t_1","amount":100}`)
			var calls atomic.Int32

			wire.CutAtCommit(tt.cut)
			_, _, err := store.Execute(t.Context(), c, insertExec(&calls, h.tenant, "first", want))
			if !errors.Is(err, ErrUnavailable) {
				t.Fatalf("Execute whose COMMIT lost its connection: err = %v, want ErrUnavailable", err)
			}
			t.Logf("Execute: %v", err)

			// What the lost COMMIT left behind, read on a connection of
			// our own.
			if tt.committed {
				checkCompleted(t, h.onlyKeyRow(t), c, want)
				if diff := cmp.Diff([]scratchRow{{h.tenant, "first"}}, h.scratch(t)); diff != "" {
					t.Errorf("business rows after the committed COMMIT (-want +got):\n%s", diff)
				}
			} else {
				if rows := h.keyRows(t); len(rows) != 0 {
					t.Errorf("key rows after the rolled-back COMMIT: %+v, want none", rows)
				}
				if rows := h.scratch(t); len(rows) != 0 {
					t.Errorf("business rows after the rolled-back COMMIT: %+v, want none", rows)
				}
			}

			// The client's retry, on a new connection through the proxy,
			// which no longer cuts.
			retry := insertExec(&calls, h.tenant, "retry", want)
			if tt.committed {
				retry = notCalled(t)
			}
			res, replayed, err := store.Execute(t.Context(), c, retry)
			if err != nil {
				t.Fatalf("retry: %v", err)
			}
			if replayed != tt.committed {
				t.Errorf("retry: replayed = %v, want %v", replayed, tt.committed)
			}
			row := h.onlyKeyRow(t)
			checkCompleted(t, row, c, want)
			wantRes := Response{Status: want.Status, Header: withExpiry(want.Header, row), Body: want.Body}
			if diff := cmp.Diff(wantRes, res); diff != "" {
				t.Errorf("retry's response (-want +got):\n%s", diff)
			}
			wantScratch, wantCalls := []scratchRow{{h.tenant, "first"}}, int32(1)
			if !tt.committed {
				wantScratch, wantCalls = []scratchRow{{h.tenant, "retry"}}, 2
			}
			if diff := cmp.Diff(wantScratch, h.scratch(t)); diff != "" {
				t.Errorf("business rows after the retry (-want +got):\n%s", diff)
			}
			if got := calls.Load(); got != wantCalls {
				t.Errorf("exec ran %d times in all, want %d", got, wantCalls)
			}
		})
	}
}

// throughWire returns a pool on the database at url whose connections go
// through a pgwire proxy, and the proxy, both closed when the test ends.
func throughWire(t *testing.T, url string) (*pgwire.Proxy, *pgxpool.Pool) {
	t.Helper()
	wire, cfg := testkit.WireProxy(t, url)
	// Opened as the service opens its pools.
	db.Configure(cfg)
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return wire, pool
}
