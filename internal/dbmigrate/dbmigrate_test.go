package dbmigrate_test

import (
	"context"
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
