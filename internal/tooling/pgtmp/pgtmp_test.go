package pgtmp_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/tooling/pgtmp"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// dataDir returns a not yet existing data directory inside t.TempDir.
func dataDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	// As root the server runs as an unprivileged user, which must be able
	// to reach the data directory; the parent t.TempDir makes is 0700.
	if os.Geteuid() == 0 {
		if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "data")
}

func TestStartStopRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := pgtmp.Options{
		Dir:    dataDir(t),
		Fast:   true,
		Logger: testkit.Logger(t),
	}

	c, err := pgtmp.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	exec(t, ctx, c.URL("postgres"), "CREATE TABLE marker (id int); INSERT INTO marker VALUES (42)")
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	version, err := os.ReadFile(filepath.Join(opts.Dir, "PG_VERSION"))
	if err != nil {
		t.Fatal(err)
	}

	// A second start must reuse the cluster: the row survives only if
	// initdb did not run again.
	c, err = pgtmp.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, c)
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var id int
	if err := conn.QueryRow(ctx, "SELECT id FROM marker").Scan(&id); err != nil {
		t.Fatalf("marker row after restart: %v", err)
	}
	if id != 42 {
		t.Fatalf("marker = %d, want 42", id)
	}
	var serverVersion string
	if err := conn.QueryRow(ctx, "SHOW server_version_num").Scan(&serverVersion); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(serverVersion, strings.TrimSpace(string(version))) {
		t.Errorf("server_version_num %s does not match PG_VERSION %s", serverVersion, version)
	}
	if c.Port() == 0 || !strings.Contains(c.URL("x"), ":"+strconv.Itoa(c.Port())+"/x?") {
		t.Errorf("URL %q does not use Port %d", c.URL("x"), c.Port())
	}
}

func TestStaleServerIsReported(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := pgtmp.Options{Dir: dataDir(t), Fast: true}
	c, err := pgtmp.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, c)

	// A second server on the same directory, as after a crashed dev run
	// whose server survived, must fail with a clear message.
	_, err = pgtmp.Start(ctx, opts)
	if err == nil {
		t.Fatal("second Start on a running cluster succeeded")
	}
	if !strings.Contains(err.Error(), "still running") {
		t.Errorf("error does not say the server is still running: %v", err)
	}
}

// TestStandbyAndKill makes a standby with Options.Standby and checks that
// it streams under its name with its own settings, then crashes the
// primary with Kill and restarts it: crash recovery keeps what was
// committed.
func TestStandbyAndKill(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primaryOpts := pgtmp.Options{Dir: dataDir(t), Fast: true, Logger: testkit.Logger(t)}
	primary, err := pgtmp.Start(ctx, primaryOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, primary)
	standby, err := pgtmp.Start(ctx, pgtmp.Options{
		Dir:      dataDir(t),
		Fast:     true,
		Settings: map[string]string{"wal_retrieve_retry_interval": "1500ms"},
		Standby:  &pgtmp.Standby{Primary: fmt.Sprintf("127.0.0.1:%d", primary.Port()), Name: "replica1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, standby)

	exec(t, ctx, primary.URL("postgres"), "CREATE TABLE marker (id int); INSERT INTO marker VALUES (42)")
	waitMarker(ctx, t, standby.URL("postgres"))
	if got := queryString(t, ctx, primary.URL("postgres"), "SELECT application_name FROM pg_stat_replication"); got != "replica1" {
		t.Errorf("standby's application_name on the primary = %q, want replica1", got)
	}
	if got := queryString(t, ctx, primary.URL("postgres"), "SELECT slot_name::text FROM pg_replication_slots WHERE active"); got != "replica1" {
		t.Errorf("active replication slot = %q, want replica1", got)
	}
	if got := queryString(t, ctx, standby.URL("postgres"), "SHOW wal_retrieve_retry_interval"); got != "1500ms" {
		t.Errorf("standby's wal_retrieve_retry_interval = %q, want the setting 1500ms", got)
	}

	primary.Kill()
	if conn, err := pgx.Connect(ctx, primary.URL("postgres")); err == nil {
		conn.Close(ctx)
		t.Fatal("the killed primary still accepts connections")
	}
	if err := primary.StopMode("gentle"); err == nil {
		t.Error("StopMode accepted an unknown mode")
	}
	primaryOpts.Port = primary.Port()
	primary, err = pgtmp.Start(ctx, primaryOpts)
	if err != nil {
		t.Fatalf("restart after Kill: %v", err)
	}
	defer stop(t, primary)
	waitMarker(ctx, t, primary.URL("postgres"))
}

// waitMarker waits until the marker row is readable at url.
func waitMarker(ctx context.Context, t *testing.T, url string) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var id int
		if id, err = queryMarker(ctx, url); err == nil && id == 42 {
			return
		}
	}
	t.Fatalf("marker row not readable at %s: %v", url, err)
}

func queryMarker(ctx context.Context, url string) (int, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var id int
	err = conn.QueryRow(ctx, "SELECT id FROM marker").Scan(&id)
	return id, err
}

func queryString(t *testing.T, ctx context.Context, url, sql string) string {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var s string
	if err := conn.QueryRow(ctx, sql).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

func TestFindBinDirHonoursPGBin(t *testing.T) {
	t.Setenv("PG_BIN", t.TempDir())
	if _, err := pgtmp.FindBinDir(); err == nil || !strings.Contains(err.Error(), "PG_BIN") {
		t.Fatalf("FindBinDir with an empty PG_BIN directory: %v", err)
	}
}

func exec(t *testing.T, ctx context.Context, url, sql string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
}

// stop stops c and fails the test if it did not stop cleanly.
func stop(t *testing.T, c *pgtmp.Cluster) {
	t.Helper()
	if err := c.Stop(); err != nil {
		t.Error(err)
	}
}
