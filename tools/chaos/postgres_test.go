package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/tooling/testkit"
)

// TestPGPairFailover drives the failover a deployment relies on: a write
// acknowledged through the primary's PgBouncer survives the primary's
// crash and the standby's promotion, and a client with the multi-host
// read-write URL over both PgBouncers moves on from the dead node within
// seconds and writes to the new primary.
func TestPGPairFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f, err := startFaults()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	var replication *link
	p := startTestPair(ctx, t, func(primary string) (string, error) {
		l, err := f.Link("replication", primary)
		if err != nil {
			return "", err
		}
		replication = l
		return l.Addr(), nil
	})

	// The standby streams through the link, synchronously.
	_, linkPort, _ := net.SplitHostPort(replication.Addr())
	var senderPort int
	pgQueryRowTest(ctx, t, p.URL(p.NodeAddrs()[1]), "SELECT sender_port FROM pg_stat_wal_receiver", &senderPort)
	if strconv.Itoa(senderPort) != linkPort {
		t.Errorf("standby streams from port %d, want the replication link's %s", senderPort, linkPort)
	}
	var syncState string
	pgQueryRowTest(ctx, t, p.URL(p.NodeAddrs()[0]), "SELECT sync_state FROM pg_stat_replication", &syncState)
	if syncState != "sync" {
		t.Errorf("sync_state = %q, want sync", syncState)
	}

	bouncers := p.BouncerAddrs()
	pooled := execModeURL(p.URL(bouncers[0]))
	pgExecTest(ctx, t, pooled, "CREATE TABLE acked (id int PRIMARY KEY, note text)")
	insertTest(ctx, t, pooled, 1)

	if err := p.KillPrimary(); err != nil {
		t.Fatal(err)
	}
	took, err := p.Promote(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("promotion took %s", took)
	if p.Primary() != 1 {
		t.Fatalf("Primary() = %d after Promote, want 1", p.Primary())
	}

	// The dead node's PgBouncer still accepts connections but has no
	// server: it must fail the read-write check quickly so that the
	// client moves on to the other PgBouncer.
	multi := fmt.Sprintf("postgres://%s@%s,%s/payments?sslmode=disable&target_session_attrs=read-write&default_query_exec_mode=exec",
		p.User(), bouncers[0], bouncers[1])
	start := time.Now()
	conn, err := pgx.Connect(ctx, multi)
	if err != nil {
		t.Fatalf("multi-host read-write connect after failover: %v", err)
	}
	defer conn.Close(ctx)
	t.Logf("multi-host read-write connect took %s", time.Since(start))
	if elapsed := time.Since(start); elapsed > 8*time.Second {
		t.Errorf("multi-host read-write connect took %s, want a few seconds", elapsed)
	}
	if got := conn.PgConn().Conn().RemoteAddr().String(); got != bouncers[1] {
		t.Errorf("connected through %s, want node 1's PgBouncer %s", got, bouncers[1])
	}
	var note string
	if err := conn.QueryRow(ctx, "SELECT note FROM acked WHERE id = $1", 1).Scan(&note); err != nil {
		t.Fatalf("acknowledged row after failover: %v", err)
	}
	if note != "row 1" {
		t.Errorf("note = %q, want %q", note, "row 1")
	}
	insertTest(ctx, t, multi, 2)
}

// TestPGPairRestartPrimary restarts the primary in both modes: writes
// through its PgBouncer work again afterwards, and the standby is back in
// sync.
func TestPGPairRestartPrimary(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startTestPair(ctx, t, nil)
	pooled := execModeURL(p.URL(p.BouncerAddrs()[0]))
	pgExecTest(ctx, t, pooled, "CREATE TABLE acked (id int PRIMARY KEY, note text)")
	for i, mode := range []string{"fast", "immediate"} {
		start := time.Now()
		if err := p.RestartPrimary(ctx, mode); err != nil {
			t.Fatalf("restart %s: %v", mode, err)
		}
		t.Logf("restart %s took %s", mode, time.Since(start))
		var syncState string
		pgQueryRowTest(ctx, t, p.URL(p.NodeAddrs()[0]), "SELECT sync_state FROM pg_stat_replication", &syncState)
		if syncState != "sync" {
			t.Errorf("after restart %s: sync_state = %q, want sync", mode, syncState)
		}
		// PgBouncer retries its server login after server_login_retry.
		insertEventually(ctx, t, pooled, i+1)
	}
	var n int
	pgQueryRowTest(ctx, t, pooled, "SELECT count(*) FROM acked", &n)
	if n != 2 {
		t.Errorf("%d rows after the restarts, want 2", n)
	}
}

// startTestPair starts a synchronous pair in a directory the server
// account can reach and stops it when the test ends.
func startTestPair(ctx context.Context, t *testing.T, replication func(string) (string, error)) *pgPair {
	t.Helper()
	work := t.TempDir()
	// As root the servers run as another user, who must reach work; the
	// parent t.TempDir makes is 0700.
	if os.Geteuid() == 0 {
		if err := os.Chmod(filepath.Dir(work), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	p, err := startPGPair(ctx, pgPairOptions{Work: work, Sync: true, Replication: replication, Log: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	t.Logf("startPGPair took %s", time.Since(start))
	return p
}

func execModeURL(url string) string { return url + "&default_query_exec_mode=exec" }

// insertTest writes row id in a transaction with a parameterized
// statement, as the service does through PgBouncer.
func insertTest(ctx context.Context, t *testing.T, url string, id int) {
	t.Helper()
	if err := insertRow(ctx, url, id); err != nil {
		t.Fatalf("insert row %d: %v", id, err)
	}
}

// insertEventually retries insertRow for up to ten seconds.
func insertEventually(ctx context.Context, t *testing.T, url string, id int) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if err = insertRow(ctx, url, id); err == nil {
			return
		}
	}
	t.Fatalf("insert row %d: %v", id, err)
}

func insertRow(ctx context.Context, url string, id int) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "INSERT INTO acked (id, note) VALUES ($1, $2)", id, fmt.Sprintf("row %d", id)); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func pgExecTest(ctx context.Context, t *testing.T, url, sql string) {
	t.Helper()
	if err := pgExec(ctx, url, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func pgQueryRowTest(ctx context.Context, t *testing.T, url, sql string, dest ...any) {
	t.Helper()
	if err := pgQueryRow(ctx, url, sql, nil, dest...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}
