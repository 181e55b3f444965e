package idem

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/idemref/payments/internal/db/dbsqlc"
)

// A key's horizons are exclusive: at locked_until the lease has expired,
// for every reader of it (migration 000014, idem_passed). now() is the
// transaction's start, so inside one transaction a lease can end exactly
// now.
func TestALeaseEndingNowHasExpired(t *testing.T) {
	t.Parallel()
	h := setup(t)
	ctx := deadline(t)
	c := h.claim(t, "ends-now", `{}`)

	tx, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `
		INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, expires_at,
		                              retain_until, recovery_point, locked_until, lease_generation)
		VALUES ($1, $2, $3, $4, $5, now() + interval '1 day', now() + interval '3 days', 'started', now(), 1)`,
		c.TenantID, c.Endpoint, c.Key, c.Fingerprint, FingerprintVersion); err != nil {
		t.Fatal(err)
	}
	q := dbsqlc.New(tx)

	leases, err := q.IdemKeyListExpiredLeases(ctx, dbsqlc.IdemKeyListExpiredLeasesParams{Endpoints: []string{testEndpoint}, MaxRows: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(leases) != 1 || leases[0].IdemKey != c.Key {
		t.Errorf("the completer finds %v, want the key whose lease ends now", leases)
	}

	row, err := q.IdemKeyGetForUpdate(ctx, dbsqlc.IdemKeyGetForUpdateParams{TenantID: c.TenantID, Endpoint: c.Endpoint, IdemKey: c.Key})
	if err != nil {
		t.Fatal(err)
	}
	if !row.LeaseExpired {
		t.Error("a takeover sees the lease that ends now as live")
	}

	var inProgress, expired int64
	var oldest, prune, del float64
	if err := tx.QueryRow(ctx, keyStatsQuery).Scan(&inProgress, &expired, &oldest, &prune, &del); err != nil {
		t.Fatal(err)
	}
	if expired != 1 {
		t.Errorf("idempotency_expired_leases counts %d, want 1", expired)
	}

	// The reaper's protection of a live lease, and the two other horizons,
	// follow the same rule.
	var leaseFree, passed, justBefore bool
	if err := tx.QueryRow(ctx, `SELECT idem_lease_free(now()), idem_passed(now()), idem_passed(now() + interval '1 microsecond')`).
		Scan(&leaseFree, &passed, &justBefore); err != nil {
		t.Fatal(err)
	}
	if !leaseFree || !passed || justBefore {
		t.Errorf("idem_lease_free(now()) = %t, idem_passed(now()) = %t, idem_passed(a microsecond later) = %t; want true, true, false",
			leaseFree, passed, justBefore)
	}
}

// horizonComparison is a horizon compared with the clock by hand: the
// rule then has a second copy, free to disagree with idem_passed (as
// locked_until < now() once did with locked_until <= now()).
var horizonComparison = regexp.MustCompile(`(?i)(expires_at|retain_until|locked_until)\s*[<>]=?\s*(now\(\)|current_timestamp|clock_timestamp\(\))|(now\(\)|current_timestamp|clock_timestamp\(\))\s*[<>]=?\s*\w*\.?(expires_at|retain_until|locked_until)`)

// Every query and every line of Go a deployment runs compares a horizon
// through the functions of migration 000014, never by hand. The tooling
// (internal/tooling, the load benchmark, the chaos run) is outside this
// rule: a deployment never runs it.
func TestHorizonsAreComparedInOnePlace(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	var files []string
	queries, err := filepath.Glob(filepath.Join(root, "db", "queries", "*.sql"))
	if err != nil || len(queries) == 0 {
		t.Fatalf("no queries under db/queries (%v)", err)
	}
	files = append(files, queries...)
	for _, dir := range []string{"internal", filepath.Join("cmd", "api"), filepath.Join("tools", "processor"), "client"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "tooling" {
				return filepath.SkipDir
			}
			if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
				files = append(files, path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if horizonComparison.MatchString(line) {
				t.Errorf("%s:%d compares a horizon by hand; use idem_passed, idem_lease_free, idem_result_expired or idem_forgotten:\n%s",
					path, i+1, strings.TrimSpace(line))
			}
		}
	}
}
