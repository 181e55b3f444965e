package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"testing"

	"github.com/idemref/payments/internal/db"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
)

// sampleLine is one sample of the text exposition: name, labels, value.
var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$`)

// metricsText is what the admin listener's /metrics answers (the public
// handler does not serve it: TestAdminOnlyOnTheAdminHandler).
func metricsText(t *testing.T) []byte {
	t.Helper()
	rec := httptest.NewRecorder()
	httpapi.NewAdminHandler().ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("admin /metrics: %d, want 200", rec.Code)
	}
	return rec.Body.Bytes()
}

// scrape reads /metrics and returns every sample by its name and labels as
// exposed, e.g. `idempotency_requests_total{endpoint="POST /v1/orders",outcome="executed"}`.
func (e *bundle) scrape(t *testing.T) map[string]float64 {
	t.Helper()
	samples := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(metricsText(t)))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		m := sampleLine.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("unparsable metrics line %q", line)
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		samples[m[1]+m[2]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return samples
}

// X1: every idempotency outcome is counted once, under its endpoint.
//
// The counters are process-wide, so this test does not call t.Parallel():
// it runs before the package's parallel tests are released, alone, and the
// deltas it measures are its own.
func TestMetricsCountIdempotencyOutcomes(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	before := e.scrape(t)

	// executed, then replayed, then mismatch under one key.
	first := e.post(t, e.a.Key, "metrics-key", orderBody("inv-1"))
	wantStatus(t, first, http.StatusCreated)
	wantReplay(t, first, e.post(t, e.a.Key, "metrics-key", orderBody("inv-1")))
	wantProblem(t, e.post(t, e.a.Key, "metrics-key", orderBody("inv-2")), http.StatusUnprocessableEntity, httpapi.CodeKeyReused)

	// in_progress: the key is held by another transaction's uncommitted claim.
	blocker, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = blocker.Rollback(context.Background()) })
	fingerprint := sha256.Sum256([]byte("another attempt's request"))
	if _, err := blocker.Exec(ctx,
		`INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, expires_at, retain_until)
		 VALUES ($1, $2, $3, $4, $5, now() + interval '1 day', now() + interval '3 days')`,
		e.a.ID, endpointOrders, "held-key", fingerprint[:], idem.FingerprintVersion); err != nil {
		t.Fatal(err)
	}
	wantProblem(t, e.post(t, e.a.Key, "held-key", orderBody("inv-3")), http.StatusConflict, httpapi.CodeKeyInUse)
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// released_transient: the first insert into orders fails with 40001;
	// the retry executes.
	for _, sql := range []string{
		`CREATE SEQUENCE fail_once`,
		`CREATE FUNCTION fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN
		     IF nextval('fail_once') = 1 THEN
		         RAISE EXCEPTION 'injected serialization failure' USING ERRCODE = '40001';
		     END IF;
		     RETURN NEW;
		 END $$`,
		`CREATE TRIGGER orders_fail_once BEFORE INSERT ON orders FOR EACH ROW EXECUTE FUNCTION fail_once()`,
	} {
		if _, err := e.pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	wantProblem(t, e.post(t, e.a.Key, "transient-key", orderBody("inv-4")), http.StatusServiceUnavailable, httpapi.CodeUnavailable)
	wantStatus(t, e.post(t, e.a.Key, "transient-key", orderBody("inv-4")), http.StatusCreated)

	// rejected_before_claim: no key, and a body that is not JSON.
	wantProblem(t, e.post(t, e.a.Key, "", orderBody("inv-5")), http.StatusBadRequest, httpapi.CodeKeyMissing)
	wantProblem(t, e.post(t, e.a.Key, "bad-body", `{"reference":`), http.StatusBadRequest, httpapi.CodeInvalidJSON)

	after := e.scrape(t)
	delta := func(sample string) float64 { return after[sample] - before[sample] }

	for outcome, want := range map[string]float64{
		"executed":              2,
		"replayed":              1,
		"mismatch":              1,
		"in_progress":           1,
		"released_transient":    1,
		"result_expired":        0,
		"takeover":              0,
		"failed":                0,
		"rejected_before_claim": 2,
	} {
		sample := `idempotency_requests_total{endpoint="` + endpointOrders + `",outcome="` + outcome + `"}`
		if got := delta(sample); got != want {
			t.Errorf("%s moved by %v, want %v", sample, got, want)
		}
	}
	if got := delta(`idempotency_replay_age_seconds_count`); got != 1 {
		t.Errorf("idempotency_replay_age_seconds observed %v replays, want 1", got)
	}
	// The claims: the two executions and the one that timed out behind the
	// held key. The replay and the mismatch are answered by the read before
	// executing, and the transient failure ended in exec, before its claim.
	if got := delta(`idempotency_lock_wait_seconds_count{endpoint="` + endpointOrders + `"}`); got != 3 {
		t.Errorf("idempotency_lock_wait_seconds observed %v claims, want 3", got)
	}
	for class, want := range map[string]float64{"2xx": 3, "4xx": 4, "5xx": 1} {
		sample := `http_request_duration_seconds_count{method="POST",route="/v1/orders",status_class="` + class + `"}`
		if got := delta(sample); got != want {
			t.Errorf("%s moved by %v, want %v", sample, got, want)
		}
	}
	// The gauges read from the database (registered by cmd/api) work on
	// the real schema.
	if err := idem.RegisterKeyStats(e.pool, nil); err != nil {
		t.Fatal(err)
	}
	if err := db.RegisterPoolMetrics(e.pool); err != nil {
		t.Fatal(err)
	}
	gauges := e.scrape(t)
	for _, name := range []string{"idempotency_in_progress_keys", "idempotency_oldest_in_progress_seconds", "idempotency_expired_leases",
		`idempotency_reaper_backlog_seconds{action="prune"}`, `idempotency_reaper_backlog_seconds{action="delete"}`, "pgxpool_max_conns"} {
		if _, ok := gauges[name]; !ok {
			t.Errorf("/metrics has no %s", name)
		}
	}
	if up := gauges["idempotency_key_stats_up"]; up != 1 {
		t.Errorf("idempotency_key_stats_up = %v, want 1", up)
	}

	// Nothing keyed by tenant or key is ever exposed.
	text := metricsText(t)
	for _, secret := range []string{e.a.ID.String(), "metrics-key", "held-key", "transient-key"} {
		if bytes.Contains(text, []byte(secret)) {
			t.Errorf("/metrics exposes %q", secret)
		}
	}
}
