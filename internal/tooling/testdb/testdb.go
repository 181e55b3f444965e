package testdb

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/db/migrations"
	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/dbmigrate"
	"github.com/idemref/payments/internal/tooling/pgtmp"
)

// templateLockKey is the pg_advisory_lock key under which test binaries
// sharing a server build the template one at a time.
const templateLockKey int64 = 0x7465_7374_6462_0001

// sqlObjectInUse is SQLSTATE 55006, returned by CREATE DATABASE ...
// TEMPLATE and ALTER DATABASE ... RENAME while another session is
// connected to the database involved.
const sqlObjectInUse = "55006"

// log goes to stderr, as test output on stdout is parsed by tools; only
// warnings are worth a test reader's attention.
var log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

var (
	mainCalled bool

	serverOnce sync.Once
	adminURL   string
	serverErr  error
	cluster    *pgtmp.Cluster // nil when TEST_DATABASE_URL is used
	clusterDir string

	templateOnce sync.Once
	templateName string
	templateErr  error
)

// Main runs the tests of a test binary that uses this package, then stops
// the private PostgreSQL server if one was started, and exits with the
// tests' code. The server is TEST_DATABASE_URL's when set; otherwise a
// pgtmp cluster in a temporary directory, started by the first test that
// needs it, so that running only tests without a database costs nothing.
func Main(m *testing.M) {
	mainCalled = true
	code := m.Run()
	closeShared()
	if cluster != nil {
		if err := cluster.Stop(); err != nil {
			log.Error("stop test PostgreSQL", "err", err)
		}
		if err := os.RemoveAll(clusterDir); err != nil {
			log.Warn("remove test PostgreSQL directory", "dir", clusterDir, "err", err)
		}
	}
	os.Exit(code)
}

// AdminURL returns the URL of the server's maintenance database, for tests
// that create and drop databases themselves.
func AdminURL(t testing.TB) string {
	t.Helper()
	u, err := server()
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// New returns the URL of a fresh, migrated database of its own, dropped
// when the test ends. It suits tests that need real commits, several
// connections or several processes.
func New(t testing.TB) string {
	t.Helper()
	admin := AdminURL(t)
	template, err := migratedTemplate(admin)
	if err != nil {
		t.Fatal(err)
	}
	return createDatabase(t, admin, template)
}

// migratedTemplate returns the name of the template for the current
// migrations, building it on first use.
func migratedTemplate(admin string) (string, error) {
	templateOnce.Do(func() { templateName, templateErr = buildTemplate(admin) })
	return templateName, templateErr
}

// NewPool is New plus a pool on the new database, closed when the test
// ends.
func NewPool(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	dbURL := New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Opened as the service opens its pools (db.Open).
	pool, err := db.Open(ctx, dbURL)
	if err != nil {
		t.Fatalf("testdb: open pool: %v", err)
	}
	// Registered after New's drop, so it runs before it: the pool closes
	// before its database is dropped.
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("testdb: ping new database: %v", err)
	}
	return pool, dbURL
}

// CreateEmptyDatabase returns the URL of a new database without any
// migration applied, dropped when the test ends; for tests of the
// migrations themselves.
func CreateEmptyDatabase(t testing.TB) string {
	t.Helper()
	return createDatabase(t, AdminURL(t), "")
}

func server() (string, error) {
	serverOnce.Do(func() { adminURL, serverErr = startServer() })
	return adminURL, serverErr
}

func startServer() (string, error) {
	if !mainCalled {
		return "", errors.New("testdb: call testdb.Main(m) from TestMain before using testdb")
	}
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		if _, err := databaseURL(u, "postgres"); err != nil {
			return "", fmt.Errorf("testdb: TEST_DATABASE_URL: %w", err)
		}
		return u, nil
	}
	dir, err := os.MkdirTemp("", "testdb-")
	if err != nil {
		return "", fmt.Errorf("testdb: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgtmp.Start(ctx, pgtmp.Options{Dir: dir, Fast: true, Logger: log})
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("testdb: TEST_DATABASE_URL is not set and a private PostgreSQL could not start: %w", err)
	}
	cluster, clusterDir = c, dir
	return c.URL("postgres"), nil
}

// buildTemplate makes sure the template for the current migrations exists
// on the server and returns its name.
func buildTemplate(admin string) (string, error) {
	sum, err := migrationsHash()
	if err != nil {
		return "", fmt.Errorf("testdb: hash migrations: %w", err)
	}
	name := "tmpl_" + sum[:12]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", fmt.Errorf("testdb: connect: %w", err)
	}
	// Closing the connection also releases the advisory lock, on every path.
	defer conn.Close(context.Background())

	// Test binaries of other packages may share this server and build the
	// same template at the same moment: one builds, the others wait and
	// then find it.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", templateLockKey); err != nil {
		return "", fmt.Errorf("testdb: lock template: %w", err)
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", fmt.Errorf("testdb: look up template: %w", err)
	}
	if exists {
		return name, nil
	}

	// The template is built under a temporary name and renamed when
	// complete, so a build that died halfway is never cloned; its leftover
	// is dropped here.
	build := name + "_build"
	steps := []string{
		"DROP DATABASE IF EXISTS " + ident(build) + " WITH (FORCE)",
		"CREATE DATABASE " + ident(build),
	}
	for _, sql := range steps {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return "", fmt.Errorf("testdb: %s: %w", sql, err)
		}
	}
	buildURL, err := databaseURL(admin, build)
	if err != nil {
		return "", err
	}
	if err := dbmigrate.Up(ctx, buildURL); err != nil {
		return "", fmt.Errorf("testdb: migrate template: %w", err)
	}

	// Cloning and renaming both need a database nobody is connected to:
	// forbid new connections, then end any the migration left behind.
	steps = []string{
		"ALTER DATABASE " + ident(build) + " WITH ALLOW_CONNECTIONS false",
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = " + literal(build),
		"ALTER DATABASE " + ident(build) + " RENAME TO " + ident(name),
		"ALTER DATABASE " + ident(name) + " WITH IS_TEMPLATE true",
	}
	for _, sql := range steps {
		if err := execRetry(ctx, conn, sql); err != nil {
			return "", fmt.Errorf("testdb: %s: %w", sql, err)
		}
	}
	return name, nil
}

// migrationsHash hashes the name and content of every migration file, so
// that any change to them names a new template.
func migrationsHash() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.FS, path)
		if err != nil {
			return err
		}
		// Length-prefixed so that moving bytes between a name and a
		// content cannot give the same hash.
		fmt.Fprintf(h, "%d:%s%d:", len(path), path, len(b))
		h.Write(b)
		return nil
	})
	return hex.EncodeToString(h.Sum(nil)), err
}

// createDatabase creates a database named t_<random> from template (the
// server's default when empty), drops it when the test ends and returns its
// URL.
func createDatabase(t testing.TB, admin, template string) string {
	t.Helper()
	name, dbURL, err := cloneDatabase(admin, template)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dropDatabase(admin, name); err != nil {
			t.Error(err)
		}
	})
	return dbURL
}

// cloneDatabase creates a database named t_<random> from template (the
// server's default when empty) and returns its name and URL.
func cloneDatabase(admin, template string) (name, dbURL string, err error) {
	name = "t_" + randomHex(8)
	dbURL, err = databaseURL(admin, name)
	if err != nil {
		return "", "", err
	}
	sql := "CREATE DATABASE " + ident(name)
	if template != "" {
		sql += " TEMPLATE " + ident(template)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := adminExec(ctx, admin, sql); err != nil {
		return "", "", fmt.Errorf("testdb: %s: %w", sql, err)
	}
	return name, dbURL, nil
}

// dropDatabase drops the database name. It runs from cleanups, when
// t.Context is already cancelled, so it brings its own context.
func dropDatabase(admin, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// FORCE ends sessions a test left open, such as a leaked pool.
	sql := "DROP DATABASE IF EXISTS " + ident(name) + " WITH (FORCE)"
	if err := adminExec(ctx, admin, sql); err != nil {
		return fmt.Errorf("testdb: %s: %w", sql, err)
	}
	return nil
}

func adminExec(ctx context.Context, admin, sql string) error {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return execRetry(ctx, conn, sql)
}

// execRetry runs sql, retrying a few times with a growing pause while it
// fails with 55006: a session on the database involved (a migration's
// connection, a pool of another test) may still be on its way out.
func execRetry(ctx context.Context, conn *pgx.Conn, sql string) error {
	const attempts = 5
	pause := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		_, err := conn.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if err == nil || attempt == attempts || !errors.As(err, &pgErr) || pgErr.Code != sqlObjectInUse {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
		pause *= 2
	}
}

// databaseURL returns base with its database replaced by name.
func databaseURL(base, name string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		// The error text of url.Parse would echo the URL and its password.
		return "", errors.New("testdb: the server URL must be a postgres:// URL")
	}
	u.Path = "/" + name
	u.RawPath = ""
	return u.String(), nil
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// literal quotes s as an SQL string; the statements it is used in are
// logged in errors whole, which a bind parameter would hide.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}
