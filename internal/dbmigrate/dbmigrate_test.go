package dbmigrate_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/dbmigrate"
	"github.com/idemref/payments/internal/tooling/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// Migrations are tested the boring way: up, down, up again, on an empty
// database, checking the schema each time. A down file that forgets a
// table, or an up file that is not re-runnable after its down, fails here.
func TestUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.CreateEmptyDatabase(t)
	tables := []string{"tenants", "api_keys", "idempotency_keys", "orders", "payments", "refunds"}

	if err := dbmigrate.Up(ctx, url); err != nil {
		t.Fatalf("up: %v", err)
	}
	version, dirty, err := dbmigrate.Version(ctx, url)
	if err != nil || dirty || version == 0 {
		t.Fatalf("after up: version %d dirty %v err %v", version, dirty, err)
	}
	assertTables(t, url, tables, true)

	if err := dbmigrate.Down(ctx, url); err != nil {
		t.Fatalf("down: %v", err)
	}
	assertTables(t, url, tables, false)

	if err := dbmigrate.Up(ctx, url); err != nil {
		t.Fatalf("up again: %v", err)
	}
	again, _, err := dbmigrate.Version(ctx, url)
	if err != nil || again != version {
		t.Fatalf("version after up, down, up = %d (%v), want %d", again, err, version)
	}
	assertTables(t, url, tables, true)

	// Up on an up-to-date database is a no-op, not an error.
	if err := dbmigrate.Up(ctx, url); err != nil {
		t.Fatalf("up when current: %v", err)
	}
}

func TestRejectsNonPostgresURL(t *testing.T) {
	t.Parallel()
	if err := dbmigrate.Up(context.Background(), "mysql://localhost/x"); err == nil {
		t.Fatal("want an error for a mysql:// URL")
	}
}

func assertTables(t *testing.T, url string, tables []string, want bool) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, table := range tables {
		var exists bool
		if err := conn.QueryRow(ctx, `SELECT to_regclass('public.' || $1) IS NOT NULL`, table).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if exists != want {
			t.Errorf("table %s exists = %v, want %v", table, exists, want)
		}
	}
}

// G8: the previous release's `api migrate up` (a rollback of the code, or
// its migration Job rerun during a rolling upgrade) on a database a newer
// release migrated is a no-op, not "no migration found for version N";
// a dirty one still fails. Mutation: drop the version check in Up and the
// first Up below fails.
func TestUpLeavesANewerSchemaAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.CreateEmptyDatabase(t)
	if err := dbmigrate.Up(ctx, url); err != nil {
		t.Fatal(err)
	}
	latest, err := dbmigrate.Latest()
	if err != nil {
		t.Fatal(err)
	}
	if v, _, _ := dbmigrate.Version(ctx, url); v != latest {
		t.Fatalf("after up: version %d, Latest %d", v, latest)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// What the next release's migration would leave: a newer version.
	if _, err := conn.Exec(ctx, `UPDATE schema_migrations SET version = $1`, latest+1); err != nil {
		t.Fatal(err)
	}
	if err := dbmigrate.Up(ctx, url); err != nil {
		t.Fatalf("up on a newer schema: %v, want nothing to do", err)
	}
	if v, dirty, _ := dbmigrate.Version(ctx, url); v != latest+1 || dirty {
		t.Fatalf("after up on a newer schema: version %d dirty %v, want %d untouched", v, dirty, latest+1)
	}
	if _, err := conn.Exec(ctx, `UPDATE schema_migrations SET dirty = true`); err != nil {
		t.Fatal(err)
	}
	if err := dbmigrate.Up(ctx, url); err == nil {
		t.Fatal("up on a dirty newer schema succeeded, want golang-migrate's error")
	}
}

// Latest is the number of the last up file in db/migrations.
func TestLatestIsTheLastMigrationFile(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../../db/migrations/*.up.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("glob: %v, %d files", err, len(files))
	}
	slices.Sort(files)
	want, err := strconv.ParseUint(strings.SplitN(filepath.Base(files[len(files)-1]), "_", 2)[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := dbmigrate.Latest(); err != nil || uint64(got) != want {
		t.Fatalf("Latest = %d (%v), want %d", got, err, want)
	}
}

// G8: serve starts only on a schema with every migration of its binary
// applied (or a newer one), and says what to run otherwise.
func TestCheckApplied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.CreateEmptyDatabase(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	latest, err := dbmigrate.Latest()
	if err != nil {
		t.Fatal(err)
	}
	check := func(step string, wantBehind bool) {
		t.Helper()
		err := dbmigrate.CheckApplied(ctx, conn)
		if behind := errors.Is(err, dbmigrate.ErrSchemaBehind); behind != wantBehind || (err != nil && !behind) {
			t.Errorf("%s: CheckApplied = %v, want behind %v", step, err, wantBehind)
		}
		if err != nil && !strings.Contains(err.Error(), "migrat") {
			t.Errorf("%s: %v does not say what to run", step, err)
		}
	}
	check("empty database", true)
	if err := dbmigrate.Up(ctx, url); err != nil {
		t.Fatal(err)
	}
	check("migrated", false)
	for _, tt := range []struct {
		step       string
		sql        string
		wantBehind bool
	}{
		{"one migration behind", `UPDATE schema_migrations SET version = $1 - 1`, true},
		{"a newer release's schema", `UPDATE schema_migrations SET version = $1 + 1`, false},
		{"dirty", `UPDATE schema_migrations SET version = $1, dirty = true`, true},
	} {
		if _, err := conn.Exec(ctx, tt.sql, int64(latest)); err != nil {
			t.Fatal(err)
		}
		check(tt.step, tt.wantBehind)
	}
}

// Two indexes on one table with the same columns, operator classes,
// collations, order, expressions and predicate cost every write twice and
// serve no read the other cannot; a unique one makes a plain twin
// redundant. The migrated schema has no such pair.
func TestNoIndexDuplicatesAnother(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testdb.New(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `
		SELECT a.indexrelid::regclass::text || ' duplicates ' || b.indexrelid::regclass::text
		FROM pg_index a
		JOIN pg_index b ON b.indrelid = a.indrelid AND b.indexrelid > a.indexrelid
		JOIN pg_class t ON t.oid = a.indrelid
		JOIN pg_namespace n ON n.oid = t.relnamespace
		WHERE n.nspname = 'public'
		  AND a.indkey::text = b.indkey::text
		  AND a.indclass::text = b.indclass::text
		  AND a.indcollation::text = b.indcollation::text
		  AND a.indoption::text = b.indoption::text
		  AND coalesce(pg_get_expr(a.indexprs, a.indrelid), '') = coalesce(pg_get_expr(b.indexprs, b.indrelid), '')
		  AND coalesce(pg_get_expr(a.indpred, a.indrelid), '') = coalesce(pg_get_expr(b.indpred, b.indrelid), '')
		ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	pairs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pairs {
		t.Errorf("index %s", p)
	}
}
