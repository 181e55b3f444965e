package testdb_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/tooling/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func TestNewIsMigrated(t *testing.T) {
	t.Parallel()
	conn := connect(t, testdb.New(t))
	var rows int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM schema_migrations").Scan(&rows); err != nil {
		t.Fatalf("schema_migrations: %v", err)
	}
	if rows == 0 {
		t.Fatal("schema_migrations is empty")
	}
}

func TestNewDatabasesAreIsolated(t *testing.T) {
	t.Parallel()
	urlA, urlB := testdb.New(t), testdb.New(t)
	if urlA == urlB {
		t.Fatalf("two New calls returned the same URL %s", urlA)
	}
	a, b := connect(t, urlA), connect(t, urlB)
	if _, err := a.Exec(t.Context(), "CREATE TABLE only_in_a (id int)"); err != nil {
		t.Fatal(err)
	}
	if exists(t, b, "only_in_a") {
		t.Fatal("a table created in one database is visible in the other")
	}
	if !exists(t, b, "schema_migrations") {
		t.Fatal("second database is not migrated")
	}
}

func TestNewPool(t *testing.T) {
	t.Parallel()
	pool, _ := testdb.NewPool(t)
	var one int
	if err := pool.QueryRow(t.Context(), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 = %d, %v", one, err)
	}
}

func TestCreateEmptyDatabase(t *testing.T) {
	t.Parallel()
	conn := connect(t, testdb.CreateEmptyDatabase(t))
	if exists(t, conn, "schema_migrations") {
		t.Fatal("empty database has schema_migrations")
	}
}

func TestDatabaseIsDroppedAtCleanup(t *testing.T) {
	t.Parallel()
	var name string
	t.Run("inner", func(t *testing.T) {
		conn := connect(t, testdb.New(t))
		if err := conn.QueryRow(t.Context(), "SELECT current_database()").Scan(&name); err != nil {
			t.Fatal(err)
		}
	})
	admin := connect(t, testdb.AdminURL(t))
	var n int
	if err := admin.QueryRow(t.Context(), "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("database %s still exists after its test ended", name)
	}
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	// Registered after the database's drop, so the connection closes first.
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func exists(t *testing.T, conn *pgx.Conn, table string) bool {
	t.Helper()
	var ok bool
	if err := conn.QueryRow(t.Context(), "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}
