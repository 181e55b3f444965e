package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

const testEndpoint = "POST /v1/things"

// bundle is one fresh database with a tenant and two scratch tables that
// stand in for business tables: scratch receives the side effects, and
// scratch_unique holds the row 'taken' so that inserting it again fails.
type bundle struct {
	pool   *pgxpool.Pool
	url    string
	tenant uuid.UUID
}

func setup(t *testing.T) *bundle {
	t.Helper()
	pool, url := testdb.NewPool(t)
	ctx := t.Context()
	for _, sql := range []string{
		`CREATE TABLE scratch (tenant_id uuid NOT NULL, v text NOT NULL)`,
		`CREATE TABLE scratch_unique (v text PRIMARY KEY)`,
		`INSERT INTO scratch_unique (v) VALUES ('taken')`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	h := &bundle{pool: pool, url: url}
	h.tenant = h.newTenant(t)
	return h
}

func (h *bundle) newTenant(t *testing.T) uuid.UUID {
	t.Helper()
	id, _, err := tenants.Create(t.Context(), h.pool, "tenant "+uuid.NewString())
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// claim returns the claim for key with the fingerprint of body on
// testEndpoint under the bundle's tenant.
func (h *bundle) claim(t *testing.T, key, body string) Claim {
	t.Helper()
	fp, err := Fingerprint(testEndpoint, nil, json.RawMessage(body))
	if err != nil {
		t.Fatal(err)
	}
	return Claim{TenantID: h.tenant, Endpoint: testEndpoint, Key: key, Fingerprint: fp}
}

type scratchRow struct {
	TenantID uuid.UUID
	V        string
}

func (h *bundle) scratch(t *testing.T) []scratchRow {
	t.Helper()
	return testkit.Rows[scratchRow](t, h.pool, `SELECT tenant_id, v FROM scratch ORDER BY v, tenant_id`)
}

// keyRow is the part of an idempotency_keys row that Execute owns.
type keyRow struct {
	TenantID           uuid.UUID
	Endpoint           string
	IdemKey            string
	Fingerprint        []byte
	FingerprintVersion int16
	State              string
	ResponseStatus     *int32
	ResponseHeaders    json.RawMessage
	ResponseBody       []byte
	CompletedAt        *time.Time
	ExpiresAt          time.Time
	ResourceLocation   *string
}

func (h *bundle) keyRows(t *testing.T) []keyRow {
	t.Helper()
	return testkit.Rows[keyRow](t, h.pool, `
		SELECT tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, state,
		       response_status, response_headers, response_body, completed_at, expires_at, resource_location
		FROM idempotency_keys ORDER BY tenant_id, endpoint, idem_key`)
}

// onlyKeyRow returns the one row of idempotency_keys and fails the test
// when there is not exactly one.
func (h *bundle) onlyKeyRow(t *testing.T) keyRow {
	t.Helper()
	rows := h.keyRows(t)
	if len(rows) != 1 {
		t.Fatalf("idempotency_keys has %d rows, want 1: %+v", len(rows), rows)
	}
	return rows[0]
}

// checkCompleted checks that row is c's completed record of want.
func checkCompleted(t *testing.T, row keyRow, c Claim, want Response) {
	t.Helper()
	type identity struct {
		TenantID           uuid.UUID
		Endpoint, Key      string
		Fingerprint        []byte
		FingerprintVersion int16
		State              string
	}
	wantID := identity{c.TenantID, c.Endpoint, c.Key, c.Fingerprint, FingerprintVersion, "completed"}
	gotID := identity{row.TenantID, row.Endpoint, row.IdemKey, row.Fingerprint, row.FingerprintVersion, row.State}
	if diff := cmp.Diff(wantID, gotID, ignoreExpires); diff != "" {
		t.Errorf("key row identity mismatch (-want +got):\n%s", diff)
	}
	if row.CompletedAt == nil {
		t.Errorf("completed key row has no completed_at")
	}
	if diff := cmp.Diff(want, recorded(t, row), ignoreExpires); diff != "" {
		t.Errorf("recorded response mismatch (-want +got):\n%s", diff)
	}
}

// ignoreExpires compares responses apart from Idempotency-Expires, which
// the store stamps on a copy of the header from the row's expires_at;
// TestExecuteRunsOnceThenReplays checks that header exactly.
var ignoreExpires = cmp.Transformer("withoutExpires", func(h http.Header) http.Header {
	h = h.Clone()
	h.Del(ExpiresHeader)
	return h
})

// withExpiry is h plus the Idempotency-Expires the recording stamps from
// row's expires_at.
func withExpiry(h http.Header, row keyRow) http.Header {
	h = h.Clone()
	h.Set(ExpiresHeader, HTTPDate(row.ExpiresAt))
	return h
}

func recorded(t *testing.T, row keyRow) Response {
	t.Helper()
	var res Response
	if row.ResponseStatus != nil {
		res.Status = int(*row.ResponseStatus)
	}
	if row.ResponseHeaders != nil {
		if err := json.Unmarshal(row.ResponseHeaders, &res.Header); err != nil {
			t.Fatalf("decode response_headers %s: %v", row.ResponseHeaders, err)
		}
	}
	// Location is stored once, in resource_location, not among the headers.
	if row.ResourceLocation != nil {
		if res.Header == nil {
			res.Header = http.Header{}
		}
		res.Header.Set("Location", *row.ResourceLocation)
	}
	res.Body = row.ResponseBody
	return res
}

// insertExec returns an exec that inserts v into scratch for tenant,
// counts its runs and returns res. A run counts once its statement has
// executed: for a key that has a row, exec's Go code runs up to its first
// statement, which the server skips (Execute's lookup ahead of BEGIN), and
// that run executed nothing.
func insertExec(calls *atomic.Int32, tenant uuid.UUID, v string, res Response) UndoableWork {
	return func(ctx context.Context, tx UndoableTx) (Response, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO scratch (tenant_id, v) VALUES ($1, $2)`, tenant, v); err != nil {
			return Response{}, err
		}
		calls.Add(1)
		return res, nil
	}
}

// notCalled is an exec that must never execute: its statement fails the
// test if the server runs it. (Its Go code does run, up to that statement:
// Execute learns that the key has a row in the round trip that carries it.)
func notCalled(t *testing.T) UndoableWork {
	return func(ctx context.Context, tx UndoableTx) (Response, error) {
		_, err := tx.Exec(ctx, `SELECT 1 / $1::int`, 0)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "22012" {
			t.Errorf("exec's statement executed, but the request must not execute")
		}
		if err == nil {
			err = errors.New("exec must not execute")
		}
		return Response{}, err
	}
}

func created(body string) Response {
	return Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/things/t_1"}},
		Body:   []byte(body),
	}
}

func problem(status int, code string) Response {
	return Response{
		Status: status,
		Header: http.Header{"Content-Type": {"application/problem+json"}, "Cache-Control": {"no-store"}},
		Body:   fmt.Appendf(nil, `{"type":"about:blank","status":%d,"code":%q}`, status, code),
	}
}

type outcome struct {
	res      Response
	replayed bool
	err      error
}

// waitUntil polls query (which returns one boolean) until it is true or
// ctx ends. It synchronises with the server's state, not with the clock.
func waitUntil(t *testing.T, ctx context.Context, pool *pgxpool.Pool, query string, args ...any) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var ok bool
		if err := pool.QueryRow(ctx, query, args...).Scan(&ok); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("gave up waiting for %s: %v", query, ctx.Err())
		case <-tick.C:
		}
	}
}

// Queries for waitUntil. Every test has a database of its own, so
// current_database() scopes them to the test.
const (
	lockWaitersAtLeast = `SELECT count(*) >= $1 FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'`
	noOtherOpenTransaction = `SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL)`
)

// deadline bounds a test that waits on other transactions, so a bug that
// makes a wait unbounded fails the test instead of hanging it. It is never
// compared with how long anything took.
func deadline(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestExecuteRunsOnceThenReplays(t *testing.T) {
	t.Parallel()
	h := setup(t)
	store := NewStore(h.pool, Config{})
	c := h.claim(t, "key-1", `{"amount":100}`)
	// Not canonical JSON on purpose: the body must come back byte for byte.
	want := created("{\"id\": \"t_1\",  \"amount\":100}\n")
	var calls atomic.Int32

	res, replayed, err := store.Execute(t.Context(), c, insertExec(&calls, h.tenant, "first", want))
	if err != nil {
		t.Fatalf("first Execute: %v", err)
	}
	if replayed {
		t.Errorf("first Execute: replayed = true, want false")
	}
	if diff := cmp.Diff(want, res, ignoreExpires); diff != "" {
		t.Errorf("first Execute response mismatch (-want +got):\n%s", diff)
	}
	if got := calls.Load(); got != 1 {
		t.Errorf("exec ran %d times, want 1", got)
	}
	wantScratch := []scratchRow{{h.tenant, "first"}}
	if diff := cmp.Diff(wantScratch, h.scratch(t), ignoreExpires); diff != "" {
		t.Errorf("business rows after the first call (-want +got):\n%s", diff)
	}
	checkCompleted(t, h.onlyKeyRow(t), c, want)
	stamped := HTTPDate(h.onlyKeyRow(t).ExpiresAt)
	if got := res.Header.Get(ExpiresHeader); got != stamped {
		t.Errorf("%s = %q, want the row's expires_at %q", ExpiresHeader, got, stamped)
	}
	if want.Header.Get(ExpiresHeader) != "" {
		t.Errorf("the store wrote %s into the header map exec returned; it must stamp a copy", ExpiresHeader)
	}

	t.Run("SecondCallReplaysStoredResponse", func(t *testing.T) {
		res, replayed, err := store.Execute(t.Context(), c, insertExec(&calls, h.tenant, "second", created(`{"other":true}`)))
		if err != nil {
			t.Fatalf("second Execute: %v", err)
		}
		if !replayed {
			t.Errorf("second Execute: replayed = false, want true")
		}
		if diff := cmp.Diff(want, res, ignoreExpires); diff != "" {
			t.Errorf("replayed response mismatch (-want +got):\n%s", diff)
		}
		if got := calls.Load(); got != 1 {
			t.Errorf("exec ran %d times in all, want 1", got)
		}
		if diff := cmp.Diff(wantScratch, h.scratch(t), ignoreExpires); diff != "" {
			t.Errorf("business rows after the replay (-want +got):\n%s", diff)
		}
		checkCompleted(t, h.onlyKeyRow(t), c, want)
	})
}

func TestExecuteRecordsOnlyRecordedHeaders(t *testing.T) {
	t.Parallel()
	h := setup(t)
	store := NewStore(h.pool, Config{})
	c := h.claim(t, "key-1", `{}`)
	kept := http.Header{
		"Content-Type":  {"application/json"},
		"Location":      {"/v1/things/t_1"},
		"Cache-Control": {"private", "max-age=0"},
	}
	full := kept.Clone()
	full.Set("X-Request-Id", "req-1")
	full.Set("Date", "Mon, 02 Jan 2006 15:04:05 GMT")
	var calls atomic.Int32

	res, _, err := store.Execute(t.Context(), c, insertExec(&calls, h.tenant, "v", Response{Status: 201, Header: full, Body: []byte(`{}`)}))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(full, res.Header, ignoreExpires); diff != "" {
		t.Errorf("first call's headers are not exec's (-want +got):\n%s", diff)
	}
	want := Response{Status: 201, Header: withExpiry(kept, h.onlyKeyRow(t)), Body: []byte(`{}`)}
	checkCompleted(t, h.onlyKeyRow(t), c, want)

	res, replayed, err := store.Execute(t.Context(), c, notCalled(t))
	if err != nil || !replayed {
		t.Fatalf("replay: replayed = %v, err = %v", replayed, err)
	}
	if diff := cmp.Diff(want, res, ignoreExpires); diff != "" {
		t.Errorf("replayed response mismatch (-want +got):\n%s", diff)
	}
}

func TestExecuteRecordsEmptyBody(t *testing.T) {
	t.Parallel()
	h := setup(t)
	store := NewStore(h.pool, Config{})
	c := h.claim(t, "key-1", `{}`)
	var calls atomic.Int32

	// A 204 has no body; exec may well leave Body and Header nil.
	_, replayed, err := store.Execute(t.Context(), c, insertExec(&calls, h.tenant, "v", Response{Status: http.StatusNoContent}))
	if err != nil {
		t.Fatalf("Execute of a response without a body: %v", err)
	}
	if replayed {
		t.Errorf("replayed = true on the first call")
	}
	want := Response{Status: http.StatusNoContent, Header: withExpiry(http.Header{}, h.onlyKeyRow(t)), Body: []byte{}}
	checkCompleted(t, h.onlyKeyRow(t), c, want)
	if diff := cmp.Diff([]scratchRow{{h.tenant, "v"}}, h.scratch(t), ignoreExpires); diff != "" {
		t.Errorf("business rows (-want +got):\n%s", diff)
	}

	res, replayed, err := store.Execute(t.Context(), c, notCalled(t))
	if err != nil || !replayed {
		t.Fatalf("replay: replayed = %v, err = %v", replayed, err)
	}
	if diff := cmp.Diff(want, res, ignoreExpires); diff != "" {
		t.Errorf("replayed response mismatch (-want +got):\n%s", diff)
	}
}

func TestExecuteDifferentFingerprintIsKeyReused(t *testing.T) {
	t.Parallel()
	h := setup(t)
	store := NewStore(h.pool, Config{})
	first := h.claim(t, "key-1", `{"amount":100}`)
	want := created(`{"amount":100}`)
	var calls atomic.Int32
	if _, _, err := store.Execute(t.Context(), first, insertExec(&calls, h.tenant, "first", want)); err != nil {
		t.Fatal(err)
	}

	other := h.claim(t, "key-1", `{"amount":999}`)
	res, replayed, err := store.Execute(t.Context(), other, insertExec(&calls, h.tenant, "other", created(`{"amount":999}`)))
	if !errors.Is(err, ErrKeyReused) {
		t.Fatalf("Execute with another fingerprint = %+v, %v, %v; want ErrKeyReused", res, replayed, err)
	}
	if got := calls.Load(); got != 1 {
		t.Errorf("exec ran %d times in all, want 1", got)
	}
	if diff := cmp.Diff([]scratchRow{{h.tenant, "first"}}, h.scratch(t), ignoreExpires); diff != "" {
		t.Errorf("business rows (-want +got):\n%s", diff)
	}
	checkCompleted(t, h.onlyKeyRow(t), first, want)

	t.Run("OriginalRequestStillReplays", func(t *testing.T) {
		res, replayed, err := store.Execute(t.Context(), first, notCalled(t))
		if err != nil || !replayed {
			t.Fatalf("replay: replayed = %v, err = %v", replayed, err)
		}
		if diff := cmp.Diff(want, res, ignoreExpires); diff != "" {
			t.Errorf("replayed response mismatch (-want +got):\n%s", diff)
		}
	})
}

func TestExecuteScopesKeysByTenantAndEndpoint(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		scope func(h *bundle, t *testing.T, c Claim) Claim
	}{
		{name: "OtherTenant", scope: func(h *bundle, t *testing.T, c Claim) Claim {
			c.TenantID = h.newTenant(t)
			return c
		}},
		{name: "OtherEndpoint", scope: func(h *bundle, t *testing.T, c Claim) Claim {
			c.Endpoint = "POST /v1/other-things"
			return c
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := setup(t)
			store := NewStore(h.pool, Config{})
			// The same key and even the same fingerprint bytes: only the
			// scope differs.
			a := h.claim(t, "shared-key", `{}`)
			b := tt.scope(h, t, a)
			resA, resB := created(`{"id":"a"}`), created(`{"id":"b"}`)
			var calls atomic.Int32

			for _, run := range []struct {
				c    Claim
				v    string
				want Response
			}{{a, "a", resA}, {b, "b", resB}} {
				res, replayed, err := store.Execute(t.Context(), run.c, insertExec(&calls, run.c.TenantID, run.v, run.want))
				if err != nil || replayed {
					t.Fatalf("Execute(%+v): replayed = %v, err = %v; want a fresh execution", run.c, replayed, err)
				}
				if diff := cmp.Diff(run.want, res, ignoreExpires); diff != "" {
					t.Errorf("response mismatch (-want +got):\n%s", diff)
				}
			}
			if got := calls.Load(); got != 2 {
				t.Errorf("exec ran %d times, want 2", got)
			}
			wantScratch := []scratchRow{{a.TenantID, "a"}, {b.TenantID, "b"}}
			if diff := cmp.Diff(wantScratch, h.scratch(t), ignoreExpires); diff != "" {
				t.Errorf("business rows (-want +got):\n%s", diff)
			}
			rows := h.keyRows(t)
			if len(rows) != 2 {
				t.Fatalf("idempotency_keys has %d rows, want 2", len(rows))
			}
			byScope := map[[2]string]keyRow{}
			for _, r := range rows {
				byScope[[2]string{r.TenantID.String(), r.Endpoint}] = r
			}
			checkCompleted(t, byScope[[2]string{a.TenantID.String(), a.Endpoint}], a, resA)
			checkCompleted(t, byScope[[2]string{b.TenantID.String(), b.Endpoint}], b, resB)

			// Each scope replays its own response.
			for _, run := range []struct {
				c    Claim
				want Response
			}{{a, resA}, {b, resB}} {
				res, replayed, err := store.Execute(t.Context(), run.c, notCalled(t))
				if err != nil || !replayed {
					t.Fatalf("replay of %+v: replayed = %v, err = %v", run.c, replayed, err)
				}
				if diff := cmp.Diff(run.want, res, ignoreExpires); diff != "" {
					t.Errorf("replayed response mismatch (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func TestExecuteRecordsDeterministicFailure(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// fail runs after exec's first business write and returns the
		// deterministic failure to record.
		fail func(ctx context.Context, tx UndoableTx) (Response, error)
	}{
		{
			name: "StatementAbortedTheTransaction",
			fail: func(ctx context.Context, tx UndoableTx) (Response, error) {
				_, err := tx.Exec(ctx, `INSERT INTO scratch_unique (v) VALUES ('taken')`)
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
					return Response{}, fmt.Errorf("want a unique violation, got %w", err)
				}
				return problem(http.StatusConflict, "duplicate_reference"), nil
			},
		},
		{
			name: "BusinessRuleRejected",
			fail: func(context.Context, UndoableTx) (Response, error) {
				return problem(http.StatusUnprocessableEntity, "insufficient_funds"), nil
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := setup(t)
			store := NewStore(h.pool, Config{})
			c := h.claim(t, "key-1", `{}`)
			var calls atomic.Int32
			var want Response
			exec := func(ctx context.Context, tx UndoableTx) (Response, error) {
				if _, err := tx.Exec(ctx, `INSERT INTO scratch (tenant_id, v) VALUES ($1, 'before the failure')`, h.tenant); err != nil {
					return Response{}, err
				}
				calls.Add(1) // a run that executed (insertExec)
				res, err := tt.fail(ctx, tx)
				want = res
				return res, err
			}

			res, replayed, err := store.Execute(t.Context(), c, exec)
			if err != nil || replayed {
				t.Fatalf("Execute: replayed = %v, err = %v; want the recorded failure", replayed, err)
			}
			if diff := cmp.Diff(want, res, ignoreExpires); diff != "" {
				t.Errorf("response mismatch (-want +got):\n%s", diff)
			}
			if got := h.scratch(t); len(got) != 0 {
				t.Errorf("the write before the failure survived: %+v", got)
			}
			checkCompleted(t, h.onlyKeyRow(t), c, want)

			res, replayed, err = store.Execute(t.Context(), c, exec)
			if err != nil || !replayed {
				t.Fatalf("retry: replayed = %v, err = %v; want the replayed failure", replayed, err)
			}
			if diff := cmp.Diff(want, res, ignoreExpires); diff != "" {
				t.Errorf("replayed response mismatch (-want +got):\n%s", diff)
			}
			if got := calls.Load(); got != 1 {
				t.Errorf("exec ran %d times, want 1", got)
			}
			if got := h.scratch(t); len(got) != 0 {
				t.Errorf("business rows after the replay: %+v", got)
			}
		})
	}
}

func TestExecuteErrorRecordsNothing(t *testing.T) {
	t.Parallel()
	errBoom := errors.New("boom")
	tests := []struct {
		name          string
		err           error
		wantTransient bool
	}{
		{name: "PlainError", err: errBoom},
		{name: "SerializationFailure", err: &pgconn.PgError{Code: "40001", Message: "could not serialize access"}, wantTransient: true},
		{name: "DeadlockDetected", err: &pgconn.PgError{Code: "40P01", Message: "deadlock detected"}, wantTransient: true},
		{name: "DeadlineExceeded", err: fmt.Errorf("charge: %w", context.DeadlineExceeded), wantTransient: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := setup(t)
			store := NewStore(h.pool, Config{})
			c := h.claim(t, "key-1", `{}`)
			var calls atomic.Int32

			_, replayed, err := store.Execute(t.Context(), c, func(ctx context.Context, tx UndoableTx) (Response, error) {
				if _, err := tx.Exec(ctx, `INSERT INTO scratch (tenant_id, v) VALUES ($1, 'failed')`, h.tenant); err != nil {
					return Response{}, err
				}
				calls.Add(1) // a run that executed (insertExec)
				return created(`{}`), tt.err
			})
			if !errors.Is(err, tt.err) {
				t.Errorf("Execute error = %v; want it to wrap %v", err, tt.err)
			}
			if got := errors.Is(err, ErrUnavailable); got != tt.wantTransient {
				t.Errorf("errors.Is(%v, ErrUnavailable) = %v, want %v", err, got, tt.wantTransient)
			}
			if replayed {
				t.Errorf("replayed = true with an error")
			}
			if rows := h.keyRows(t); len(rows) != 0 {
				t.Errorf("a failed execution left key rows: %+v", rows)
			}
			if rows := h.scratch(t); len(rows) != 0 {
				t.Errorf("a failed execution left business rows: %+v", rows)
			}

			t.Run("RetryExecutes", func(t *testing.T) {
				want := created(`{"ok":true}`)
				res, replayed, err := store.Execute(t.Context(), c, insertExec(&calls, h.tenant, "retry", want))
				if err != nil || replayed {
					t.Fatalf("retry: replayed = %v, err = %v; want a fresh execution", replayed, err)
				}
				if diff := cmp.Diff(want, res, ignoreExpires); diff != "" {
					t.Errorf("response mismatch (-want +got):\n%s", diff)
				}
				if got := calls.Load(); got != 2 {
					t.Errorf("exec ran %d times, want 2", got)
				}
				if diff := cmp.Diff([]scratchRow{{h.tenant, "retry"}}, h.scratch(t), ignoreExpires); diff != "" {
					t.Errorf("business rows (-want +got):\n%s", diff)
				}
				checkCompleted(t, h.onlyKeyRow(t), c, want)
			})
		})
	}
}

func TestExecuteCancelledMidStatementIsUnavailable(t *testing.T) {
	t.Parallel()
	h := setup(t)
	store := NewStore(h.pool, Config{})
	c := h.claim(t, "key-1", `{}`)
	var calls atomic.Int32
	bound := deadline(t)

	ctx, cancel := context.WithCancel(bound)
	defer cancel()
	sleeping := make(chan struct{})
	done := make(chan outcome, 1)
	go func() {
		res, replayed, err := store.Execute(ctx, c, func(ctx context.Context, tx UndoableTx) (Response, error) {
			if _, err := tx.Exec(ctx, `INSERT INTO scratch (tenant_id, v) VALUES ($1, 'cancelled')`, h.tenant); err != nil {
				return Response{}, err
			}
			calls.Add(1) // a run that executed (insertExec)
			close(sleeping)
			if _, err := tx.Exec(ctx, `SELECT pg_sleep(300)`); err != nil {
				return Response{}, err
			}
			return created(`{}`), nil
		})
		done <- outcome{res, replayed, err}
	}()

	select {
	case <-sleeping:
	case <-bound.Done():
		t.Fatal("exec never started")
	}
	waitUntil(t, bound, h.pool, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event = 'PgSleep')`)
	cancel()
	got := <-done
	if !errors.Is(got.err, ErrUnavailable) {
		t.Fatalf("Execute cancelled mid-statement = %+v, %v, %v; want ErrUnavailable", got.res, got.replayed, got.err)
	}

	// The cancelled backend rolls back asynchronously; its uncommitted
	// claim must be gone before the retry, or the retry would wait on it.
	waitUntil(t, bound, h.pool, noOtherOpenTransaction)
	if rows := h.keyRows(t); len(rows) != 0 {
		t.Errorf("a cancelled execution left key rows: %+v", rows)
	}
	if rows := h.scratch(t); len(rows) != 0 {
		t.Errorf("a cancelled execution left business rows: %+v", rows)
	}

	t.Run("RetryExecutes", func(t *testing.T) {
		want := created(`{"ok":true}`)
		res, replayed, err := store.Execute(bound, c, insertExec(&calls, h.tenant, "retry", want))
		if err != nil || replayed {
			t.Fatalf("retry: replayed = %v, err = %v; want a fresh execution", replayed, err)
		}
		if diff := cmp.Diff(want, res, ignoreExpires); diff != "" {
			t.Errorf("response mismatch (-want +got):\n%s", diff)
		}
		if got := calls.Load(); got != 2 {
			t.Errorf("exec ran %d times, want 2", got)
		}
		if diff := cmp.Diff([]scratchRow{{h.tenant, "retry"}}, h.scratch(t), ignoreExpires); diff != "" {
			t.Errorf("business rows (-want +got):\n%s", diff)
		}
		checkCompleted(t, h.onlyKeyRow(t), c, want)
	})
}

func TestExecuteKeyStoreUnreachableIsUnavailable(t *testing.T) {
	t.Parallel()
	// A port nobody listens on: connecting is refused.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@"+addr+"/nothing?sslmode=disable&connect_timeout=10")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	fp, err := Fingerprint(testEndpoint, nil, json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	c := Claim{TenantID: uuid.New(), Endpoint: testEndpoint, Key: "key-1", Fingerprint: fp}
	res, replayed, err := NewStore(pool, Config{}).Execute(deadline(t), c, notCalled(t))
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("Execute without a database = %+v, %v, %v; want ErrUnavailable", res, replayed, err)
	}
}

// holdKey inserts the key row in a transaction left open: the moment a
// concurrent first attempt has recorded its response (claimed the key) and
// not yet committed: the completed record of want, or with want nil an
// unfinished key, as a multi-step attempt holds it.
func holdKey(t *testing.T, ctx context.Context, h *bundle, c Claim, want *Response) pgx.Tx {
	t.Helper()
	blocker, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = blocker.Rollback(context.WithoutCancel(ctx)) })
	if want == nil {
		if _, err := blocker.Exec(ctx, `
			INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, expires_at, retain_until)
			VALUES ($1, $2, $3, $4, $5, now() + interval '1 day', now() + interval '3 days')`,
			c.TenantID, c.Endpoint, c.Key, c.Fingerprint, FingerprintVersion); err != nil {
			t.Fatal(err)
		}
		return blocker
	}
	headers, err := json.Marshal(pickHeaders(want.Header))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.Exec(ctx, `
		INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, state,
		                              response_status, response_headers, response_body, resource_location,
		                              completed_at, expires_at, retain_until)
		VALUES ($1, $2, $3, $4, $5, 'completed', $6, $7, $8, $9, now(), now() + interval '1 day', now() + interval '3 days')`,
		c.TenantID, c.Endpoint, c.Key, c.Fingerprint, FingerprintVersion,
		want.Status, headers, want.Body, want.Header.Get("Location")); err != nil {
		t.Fatal(err)
	}
	return blocker
}

// TestExecuteDuplicateBehindUncommittedClaim: another transaction holds
// the key's row uncommitted, and does not end within the lock timeout. The
// duplicate executes, its claim waits on that row, gives up after the
// timeout with ErrKeyInUse, and leaves nothing behind; once the blocker
// ends, the next attempt replays what it committed, or runs if it rolled
// back.
func TestExecuteDuplicateBehindUncommittedClaim(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		commit bool
	}{
		{name: "ReplaysAfterBlockerCommits", commit: true},
		{name: "ExecutesAfterBlockerRollsBack", commit: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := setup(t)
			ctx := deadline(t)
			store := NewStore(h.pool, Config{LockTimeout: 200 * time.Millisecond})
			c := h.claim(t, "key-1", `{}`)
			var calls atomic.Int32
			first := created(`{"id":"from the first attempt"}`)
			blocker := holdKey(t, ctx, h, c, &first)

			res, replayed, err := store.Execute(ctx, c, insertExec(&calls, h.tenant, "duplicate", created(`{}`)))
			if !errors.Is(err, ErrKeyInUse) {
				t.Fatalf("Execute behind an uncommitted claim = %+v, %v, %v; want ErrKeyInUse", res, replayed, err)
			}
			if diff := cmp.Diff([]scratchRow{}, h.scratch(t)); diff != "" {
				t.Errorf("business rows after the timed-out claim (-want +got):\n%s", diff)
			}

			want := first
			if tt.commit {
				if err := blocker.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			} else {
				want = created(`{"id":"from the duplicate"}`)
				if err := blocker.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
			}
			calls.Store(0)
			res, replayed, err = store.Execute(ctx, c, insertExec(&calls, h.tenant, "duplicate", want))
			if err != nil {
				t.Fatalf("Execute after the blocker ended: %v", err)
			}
			if replayed != tt.commit {
				t.Errorf("replayed = %v, want %v", replayed, tt.commit)
			}
			if diff := cmp.Diff(want, res, ignoreExpires); diff != "" {
				t.Errorf("response mismatch (-want +got):\n%s", diff)
			}
			var wantCalls int32
			wantScratch := []scratchRow{}
			if !tt.commit {
				wantCalls, wantScratch = 1, []scratchRow{{h.tenant, "duplicate"}}
			}
			if got := calls.Load(); got != wantCalls {
				t.Errorf("exec ran %d times, want %d", got, wantCalls)
			}
			if diff := cmp.Diff(wantScratch, h.scratch(t), ignoreExpires); diff != "" {
				t.Errorf("business rows (-want +got):\n%s", diff)
			}
			checkCompleted(t, h.onlyKeyRow(t), c, want)
		})
	}
}

// TestExecuteDuplicateWaitsForTheClaim: the duplicate's claim waits on the
// first attempt's uncommitted key row (a lock timeout long enough not to
// expire). When that commits, the duplicate's insert fails on the primary
// key, its own work rolls back, and it replays the first attempt's record;
// when it rolls back, the duplicate's insert goes through and its work
// commits.
func TestExecuteDuplicateWaitsForTheClaim(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		firstFails bool
	}{
		{name: "ReplaysWhenFirstCommits"},
		{name: "CommitsWhenFirstRollsBack", firstFails: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := setup(t)
			ctx := deadline(t)
			store := NewStore(h.pool, Config{LockTimeout: 10 * time.Minute})
			c := h.claim(t, "key-1", `{}`)
			resFirst, resSecond := created(`{"attempt":1}`), created(`{"attempt":2}`)
			var calls atomic.Int32
			blocker := holdKey(t, ctx, h, c, &resFirst)

			second := make(chan outcome, 1)
			go func() {
				res, replayed, err := store.Execute(ctx, c, insertExec(&calls, h.tenant, "second", resSecond))
				second <- outcome{res, replayed, err}
			}()
			waitUntil(t, ctx, h.pool, lockWaitersAtLeast, 1)
			if tt.firstFails {
				if err := blocker.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
			} else if err := blocker.Commit(ctx); err != nil {
				t.Fatal(err)
			}

			b := <-second
			if b.err != nil || b.replayed == tt.firstFails {
				t.Fatalf("duplicate: replayed = %v, err = %v; want replayed = %v", b.replayed, b.err, !tt.firstFails)
			}
			if got := calls.Load(); got != 1 {
				t.Errorf("duplicate's exec ran %d times, want 1", got)
			}
			want, wantScratch := resFirst, []scratchRow{}
			if tt.firstFails {
				want, wantScratch = resSecond, []scratchRow{{h.tenant, "second"}}
			}
			if diff := cmp.Diff(want, b.res, ignoreExpires); diff != "" {
				t.Errorf("duplicate's response mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantScratch, h.scratch(t), ignoreExpires); diff != "" {
				t.Errorf("business rows (-want +got):\n%s", diff)
			}
			checkCompleted(t, h.onlyKeyRow(t), c, want)
		})
	}
}

// TestExecuteTheFirstRecordWins: the claim comes after exec, so a duplicate
// that arrives while the first attempt executes runs too. Whichever records
// first wins; here the duplicate does, while the first attempt is still in
// exec. The first attempt's claim then fails, its business row rolls back,
// and it answers with the duplicate's record: one outcome, committed once,
// the same answer to both.
func TestExecuteTheFirstRecordWins(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := deadline(t)
	store := NewStore(h.pool, Config{LockTimeout: 10 * time.Minute})
	c := h.claim(t, "key-1", `{}`)
	resFirst, resSecond := created(`{"attempt":1}`), created(`{"attempt":2}`)
	var callsFirst, callsSecond atomic.Int32

	entered, release := make(chan struct{}), make(chan struct{})
	first := make(chan outcome, 1)
	go func() {
		exec := insertExec(&callsFirst, h.tenant, "first", resFirst)
		res, replayed, err := store.Execute(ctx, c, func(ctx context.Context, tx UndoableTx) (Response, error) {
			res, err := exec(ctx, tx)
			close(entered)
			select {
			case <-release:
			case <-ctx.Done():
				return Response{}, ctx.Err()
			}
			return res, err
		})
		first <- outcome{res, replayed, err}
	}()
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("the first attempt never ran exec")
	}

	res, replayed, err := store.Execute(ctx, c, insertExec(&callsSecond, h.tenant, "second", resSecond))
	if err != nil || replayed {
		t.Fatalf("the duplicate, while the first attempt executes: replayed = %v, err = %v; want a fresh execution", replayed, err)
	}
	if diff := cmp.Diff(resSecond, res, ignoreExpires); diff != "" {
		t.Errorf("duplicate's response mismatch (-want +got):\n%s", diff)
	}
	close(release)
	a := <-first
	if a.err != nil || !a.replayed {
		t.Fatalf("the first attempt, after the duplicate recorded: replayed = %v, err = %v; want the replay", a.replayed, a.err)
	}
	if diff := cmp.Diff(resSecond, a.res, ignoreExpires); diff != "" {
		t.Errorf("first attempt's response mismatch (-want +got):\n%s", diff)
	}
	if callsFirst.Load() != 1 || callsSecond.Load() != 1 {
		t.Errorf("exec ran %d and %d times, want once each", callsFirst.Load(), callsSecond.Load())
	}
	if diff := cmp.Diff([]scratchRow{{h.tenant, "second"}}, h.scratch(t), ignoreExpires); diff != "" {
		t.Errorf("business rows (-want +got):\n%s", diff)
	}
	checkCompleted(t, h.onlyKeyRow(t), c, resSecond)
}

// TestExecuteConcurrentDuplicatesCommitOnce: n identical requests at once.
// Every one executes (none can see a key that nobody has recorded yet), and
// all are held inside exec until every one is there; then they race to
// record. Exactly one commits, its business row is the only one, and every
// other replays its response.
func TestExecuteConcurrentDuplicatesCommitOnce(t *testing.T) {
	t.Parallel()
	const n = 8
	h := setup(t)
	ctx := deadline(t)
	cfg, err := pgxpool.ParseConfig(h.url)
	if err != nil {
		t.Fatal(err)
	}
	db.Configure(cfg)
	cfg.MaxConns = n + 2 // every duplicate on its own connection, plus the checks
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store := NewStore(pool, Config{LockTimeout: 10 * time.Minute})
	c := h.claim(t, "key-1", `{}`)
	var calls atomic.Int32
	release := make(chan struct{})
	var inside sync.WaitGroup
	inside.Add(n)
	exec := func(ctx context.Context, tx UndoableTx) (Response, error) {
		i := calls.Add(1)
		if _, err := tx.Exec(ctx, `INSERT INTO scratch (tenant_id, v) VALUES ($1, 'v')`, h.tenant); err != nil {
			return Response{}, err
		}
		inside.Done()
		select {
		case <-release:
		case <-ctx.Done():
			return Response{}, ctx.Err()
		}
		return created(fmt.Sprintf(`{"id":"t_%d"}`, i)), nil
	}
	start := make(chan struct{})
	results := make(chan outcome, n)
	for range n {
		go func() {
			<-start
			res, replayed, err := store.Execute(ctx, c, exec)
			results <- outcome{res, replayed, err}
		}()
	}
	close(start)
	inside.Wait()
	close(release)

	var fresh, replays int
	outcomes := make([]outcome, 0, n)
	for range n {
		outcomes = append(outcomes, <-results)
	}
	row := h.onlyKeyRow(t)
	want := Response{Status: int(*row.ResponseStatus), Body: row.ResponseBody}
	for _, o := range outcomes {
		if o.err != nil {
			t.Errorf("Execute: %v", o.err)
			continue
		}
		if o.replayed {
			replays++
		} else {
			fresh++
		}
		if o.res.Status != want.Status || string(o.res.Body) != string(want.Body) {
			t.Errorf("answered %d %s, want the recorded %d %s", o.res.Status, o.res.Body, want.Status, want.Body)
		}
	}
	if fresh != 1 || replays != n-1 {
		t.Errorf("%d fresh executions and %d replays, want 1 and %d", fresh, replays, n-1)
	}
	if got := calls.Load(); got != n {
		t.Errorf("exec ran %d times, want %d (each request executes; n-1 roll back)", got, n)
	}
	if diff := cmp.Diff([]scratchRow{{h.tenant, "v"}}, h.scratch(t), ignoreExpires); diff != "" {
		t.Errorf("business rows (-want +got):\n%s", diff)
	}
}

func TestExecuteCommittedInProgressIsKeyInUse(t *testing.T) {
	t.Parallel()
	h := setup(t)
	store := NewStore(h.pool, Config{LockTimeout: 200 * time.Millisecond})
	c := h.claim(t, "key-1", `{}`)
	if _, err := h.pool.Exec(t.Context(), `
		INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, expires_at, retain_until)
		VALUES ($1, $2, $3, $4, $5, now() + interval '1 day', now() + interval '3 days')`,
		c.TenantID, c.Endpoint, c.Key, c.Fingerprint, FingerprintVersion); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32

	res, replayed, err := store.Execute(deadline(t), c, insertExec(&calls, h.tenant, "v", created(`{}`)))
	if !errors.Is(err, ErrKeyInUse) {
		t.Fatalf("Execute on an in-progress record = %+v, %v, %v; want ErrKeyInUse", res, replayed, err)
	}
	if got := calls.Load(); got != 0 {
		t.Errorf("exec ran %d times, want 0", got)
	}
	if rows := h.scratch(t); len(rows) != 0 {
		t.Errorf("business rows: %+v", rows)
	}
	row := h.onlyKeyRow(t)
	if row.State != "in_progress" || row.ResponseStatus != nil {
		t.Errorf("the in-progress record changed: state %q, status %v", row.State, row.ResponseStatus)
	}
}

func TestExecuteTrustsRecordOfOtherFingerprintVersion(t *testing.T) {
	t.Parallel()
	h := setup(t)
	store := NewStore(h.pool, Config{})
	c := h.claim(t, "key-1", `{}`)
	want := created(`{"id":"made under the old algorithm"}`)
	headers, err := json.Marshal(want.Header)
	if err != nil {
		t.Fatal(err)
	}
	// The old algorithm's hash cannot be compared with today's (F3).
	oldFingerprint := make([]byte, 32)
	if _, err := h.pool.Exec(t.Context(), `
		INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version,
		                              state, response_status, response_headers, response_body, completed_at, expires_at, retain_until)
		VALUES ($1, $2, $3, $4, $5, 'completed', $6, $7, $8, now(), now() + interval '1 day', now() + interval '3 days')`,
		c.TenantID, c.Endpoint, c.Key, oldFingerprint, FingerprintVersion-1, want.Status, headers, want.Body); err != nil {
		t.Fatal(err)
	}

	res, replayed, err := store.Execute(t.Context(), c, notCalled(t))
	if err != nil || !replayed {
		t.Fatalf("Execute: replayed = %v, err = %v; want the replay", replayed, err)
	}
	if diff := cmp.Diff(want, res, ignoreExpires); diff != "" {
		t.Errorf("replayed response mismatch (-want +got):\n%s", diff)
	}
	if rows := h.scratch(t); len(rows) != 0 {
		t.Errorf("business rows: %+v", rows)
	}
}

func TestExecuteSetsExpiresAt(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ttl  time.Duration
		want time.Duration
	}{
		{name: "ConfiguredTTL", ttl: 3 * time.Hour, want: 3 * time.Hour},
		{name: "DefaultTTL", ttl: 0, want: DefaultTTL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := setup(t)
			store := NewStore(h.pool, Config{TTL: tt.ttl})
			c := h.claim(t, "key-1", `{}`)
			var calls atomic.Int32
			if _, _, err := store.Execute(t.Context(), c, insertExec(&calls, h.tenant, "v", created(`{}`))); err != nil {
				t.Fatal(err)
			}
			got := time.Until(h.onlyKeyRow(t).ExpiresAt)
			if got < tt.want-time.Minute || got > tt.want+time.Minute {
				t.Errorf("expires_at is %v from now, want %v ± 1m", got, tt.want)
			}
		})
	}
}

// TestExecuteBoundsLockWait checks the setting that keeps a duplicate from
// waiting unbounded on another transaction's claim (L5).
func TestExecuteBoundsLockWait(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		lockTimeout time.Duration
		want        string
	}{
		{name: "Configured", lockTimeout: 250 * time.Millisecond, want: "250ms"},
		{name: "Default", lockTimeout: 0, want: "2s"},
	}
	h := setup(t)
	// One connection, so a setting that outlived its transaction would be
	// seen by the next statement.
	cfg, err := pgxpool.ParseConfig(h.url)
	if err != nil {
		t.Fatal(err)
	}
	db.Configure(cfg)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := NewStore(pool, Config{LockTimeout: tt.lockTimeout})
			var got string
			_, _, err := store.Execute(t.Context(), h.claim(t, tt.name, `{}`), func(ctx context.Context, tx UndoableTx) (Response, error) {
				return created(`{}`), tx.QueryRow(ctx, `SELECT current_setting('lock_timeout')`).Scan(&got)
			})
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("lock_timeout inside Execute = %q, want %q", got, tt.want)
			}
		})
	}

	t.Run("SettingEndsWithTheTransaction", func(t *testing.T) {
		var got string
		if err := pool.QueryRow(t.Context(), `SELECT current_setting('lock_timeout')`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != "0" {
			t.Errorf("lock_timeout leaked onto a pooled connection: %q", got)
		}
	})
}

// H: a panic inside the transaction rolls it back and gives its connection
// back to the pool, releasing the key's claim: the same key then runs, and
// nothing of the panicking attempt is left.
func TestExecutePanicRollsBackAndReleasesTheKey(t *testing.T) {
	t.Parallel()
	h := setup(t)
	store := NewStore(h.pool, Config{LockTimeout: 300 * time.Millisecond})
	c := h.claim(t, "key-panic", `{"amount":100}`)
	var calls atomic.Int32

	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Errorf("recovered %v, want the handler's panic to go on", v)
			}
		}()
		_, _, _ = store.Execute(t.Context(), c, func(ctx context.Context, tx UndoableTx) (Response, error) {
			if _, err := insertExec(&calls, h.tenant, "panicked", created(`{}`))(ctx, tx); err != nil {
				t.Fatal(err)
			}
			panic("boom")
		})
	}()

	if n := h.pool.Stat().AcquiredConns(); n != 0 {
		// The connection stays idle in transaction, holding the key's row
		// lock; the pool's cleanup would wait for it forever.
		t.Fatalf("connections still acquired after the panic = %d, want 0", n)
	}
	if rows := h.keyRows(t); len(rows) != 0 {
		t.Errorf("key rows after the panic = %+v, want none", rows)
	}
	if rows := h.scratch(t); len(rows) != 0 {
		t.Errorf("business rows after the panic = %+v, want none", rows)
	}
	want := created(`{"id":"t_1"}`)
	res, replayed, err := store.Execute(t.Context(), c, insertExec(&calls, h.tenant, "retried", want))
	if err != nil || replayed {
		t.Fatalf("retry after the panic: replayed %v, err %v; want a fresh execution", replayed, err)
	}
	if diff := cmp.Diff(want, res, ignoreExpires); diff != "" {
		t.Errorf("retry response (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]scratchRow{{h.tenant, "retried"}}, h.scratch(t), ignoreExpires); diff != "" {
		t.Errorf("business rows (-want +got):\n%s", diff)
	}
}
