//go:build loadtest

package httpapi_test

import (
	"bytes"
	"net/http"
	"sync"
	"testing"

	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// The load benchmark's claim-first peer is an idempotent create: it runs
// once per key, replays the record byte for byte, refuses another body
// under the key, and leaves the key row completed.
func TestClaimFirstCreate(t *testing.T) {
	t.Parallel()
	e := setup(t)
	post := func(t *testing.T, key, body string) response {
		t.Helper()
		return e.do(t, http.MethodPost, httpapi.ClaimFirstOrdersPath, e.a.Key, []byte(body), withHeader(idem.HeaderName, key))
	}

	t.Run("RunsOnceThenReplays", func(t *testing.T) {
		first := post(t, "cf-1", orderBody("cf-ref-1"))
		if first.status != http.StatusCreated || first.header.Get(httpapi.ReplayedHeader) != "" {
			t.Fatalf("first: %d replayed=%q %s", first.status, first.header.Get(httpapi.ReplayedHeader), first.body)
		}
		again := post(t, "cf-1", orderBody("cf-ref-1"))
		if again.status != http.StatusCreated || again.header.Get(httpapi.ReplayedHeader) != "true" {
			t.Fatalf("retry: %d replayed=%q %s", again.status, again.header.Get(httpapi.ReplayedHeader), again.body)
		}
		if !bytes.Equal(first.body, again.body) {
			t.Errorf("the replay differs:\nfirst:  %s\nreplay: %s", first.body, again.body)
		}
		if n := e.countOrdersWithReference(t, e.a.ID, "cf-ref-1"); n != 1 {
			t.Errorf("orders = %d, want 1", n)
		}
		k, ok := testkit.ReadKeyRow(t, e.pool, e.a.ID, "POST "+httpapi.ClaimFirstOrdersPath, "cf-1")
		if !ok || k.State != "completed" || k.ResponseStatus != http.StatusCreated {
			t.Errorf("key row = %+v (found %t), want completed with 201", k, ok)
		}
	})

	t.Run("AnotherBodyUnderTheKeyIsRefused", func(t *testing.T) {
		if res := post(t, "cf-1", orderBody("cf-ref-other")); res.status != http.StatusUnprocessableEntity {
			t.Errorf("another body: %d %s, want 422", res.status, res.body)
		}
		if n := e.countOrdersWithReference(t, e.a.ID, "cf-ref-other"); n != 0 {
			t.Errorf("orders = %d, want 0", n)
		}
	})

	t.Run("ConcurrentDuplicatesExecuteOnce", func(t *testing.T) {
		const n = 8
		var wg sync.WaitGroup
		answers := make([]response, n)
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				answers[i], errs[i] = e.send(t.Context(), http.MethodPost, httpapi.ClaimFirstOrdersPath, e.a.Key, []byte(orderBody("cf-ref-storm")),
					withHeader(idem.HeaderName, "cf-storm"))
			})
		}
		wg.Wait()
		executions := 0
		for i, res := range answers {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			switch {
			case res.status == http.StatusCreated && res.header.Get(httpapi.ReplayedHeader) != "true":
				executions++
			case res.status == http.StatusCreated, res.status == http.StatusConflict:
			default:
				t.Errorf("answer %d: %d %s", i, res.status, res.body)
			}
		}
		if executions != 1 {
			t.Errorf("%d executions, want 1", executions)
		}
		if n := e.countOrdersWithReference(t, e.a.ID, "cf-ref-storm"); n != 1 {
			t.Errorf("orders = %d, want 1", n)
		}
	})
}
