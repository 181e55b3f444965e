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

// TestPatroniFailover drives the failover a deployment relies on, by
// Patroni alone: a write acknowledged through the leader's PgBouncer
// survives the loss of the leader's machine, Patroni promotes the
// standby after its TTL, and a client with the multi-host read-write URL
// over both PgBouncers moves on from the dead member and writes to the new
// leader. Then the old leader comes back as a standby and a switchover
// returns the leadership to it with every row.
func TestPatroniFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := startTestCluster(ctx, t)

	// The standby streams through the leader's link, synchronously.
	_, linkPort, _ := net.SplitHostPort(c.members[0].pgLink.Addr())
	var senderPort int
	pgQueryRowTest(ctx, t, c.URL(c.NodeAddrs()[1]), "SELECT sender_port FROM pg_stat_wal_receiver", &senderPort)
	if strconv.Itoa(senderPort) != linkPort {
		t.Errorf("standby streams from port %d, want the leader's link's %s", senderPort, linkPort)
	}
	var syncState string
	pgQueryRowTest(ctx, t, c.URL(c.NodeAddrs()[0]), "SELECT sync_state FROM pg_stat_replication", &syncState)
	if syncState != "sync" {
		t.Errorf("sync_state = %q, want sync", syncState)
	}

	bouncers := c.BouncerAddrs()
	pgExecTest(ctx, t, execModeURL(c.URL(bouncers[0])), "CREATE TABLE acked (id int PRIMARY KEY, note text)")
	insertTest(ctx, t, execModeURL(c.URL(bouncers[0])), 1)

	start := time.Now()
	old, err := c.CrashLeader()
	if err != nil {
		t.Fatal(err)
	}
	if old != 0 {
		t.Fatalf("crashed member %d, want the first leader, 0", old)
	}
	leader, err := c.WaitLeader(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Patroni promoted member %d %s after the crash", leader, time.Since(start))

	// The dead member's PgBouncer still accepts connections but has no
	// server: it must fail the read-write check quickly so that the
	// client moves on to the other PgBouncer.
	multi := fmt.Sprintf("postgres://%s@%s,%s/payments?sslmode=disable&target_session_attrs=read-write&default_query_exec_mode=exec",
		c.User(), bouncers[0], bouncers[1])
	start = time.Now()
	conn, err := pgx.Connect(ctx, multi)
	if err != nil {
		t.Fatalf("multi-host read-write connect after failover: %v", err)
	}
	t.Logf("multi-host read-write connect took %s", time.Since(start))
	if got := conn.PgConn().Conn().RemoteAddr().String(); got != bouncers[1] {
		t.Errorf("connected through %s, want member 1's PgBouncer %s", got, bouncers[1])
	}
	conn.Close(ctx)
	assertRows(ctx, t, multi, 1)
	insertTest(ctx, t, multi, 2)

	rewound, err := c.Rejoin(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("member %d rejoined (pg_rewind ran: %t)", old, rewound)
	if err := c.Switchover(ctx, old); err != nil {
		t.Fatal(err)
	}
	// The new leader's PgBouncer logs in to it again within
	// server_login_retry; until then a connection may be refused.
	waitConnect(ctx, t, multi)
	assertRows(ctx, t, multi, 2)
	insertEventually(ctx, t, multi, 3)
}

// TestPatroniFencesIsolatedLeader cuts the leader off from etcd and from
// its standby while a client still reaches it: a commit there waits for
// the standby and is never acknowledged, Patroni demotes the leader before
// it promotes the standby, and the unacknowledged row is on neither.
func TestPatroniFencesIsolatedLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := startTestCluster(ctx, t)
	direct0 := c.URL(c.NodeAddrs()[0])
	pgExecTest(ctx, t, direct0, "CREATE TABLE acked (id int PRIMARY KEY, note text)")
	insertTest(ctx, t, direct0, 1)

	if err := c.Isolate(0); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	committed := make(chan error, 1)
	go func() { committed <- insertRow(ctx, direct0, 2) }()
	// The commit must never succeed. It ends when the demotion stops the
	// server (an error), which this loop may see before it sees the node
	// in recovery.
	var demotedAfter time.Duration
	var commitErr error
	ended := false
	for demotedAfter == 0 {
		select {
		case err := <-committed:
			if err == nil {
				t.Fatal("the commit on the cut-off leader was acknowledged")
			}
			commitErr, ended = err, true
		case <-time.After(100 * time.Millisecond):
		}
		var inRecovery bool
		if err := pgQueryRow(ctx, c.adminURL(0), "SELECT pg_is_in_recovery()", nil, &inRecovery); err != nil || inRecovery {
			demotedAfter = time.Since(start)
		}
	}
	if !ended {
		commitErr = <-committed
	}
	if commitErr == nil {
		t.Fatal("the commit on the cut-off leader was acknowledged")
	}
	t.Logf("member 0 demoted itself %s after the cut; its waiting commit ended with: %v", demotedAfter, commitErr)
	leader, err := c.WaitLeader(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	promotedAfter := time.Since(start)
	t.Logf("member %d promoted %s after the cut", leader, promotedAfter)
	if promotedAfter < demotedAfter {
		t.Errorf("promoted after %s, before the old leader demoted itself after %s", promotedAfter, demotedAfter)
	}
	assertRows(ctx, t, c.URL(c.NodeAddrs()[1]), 1)

	if err := c.Heal(0); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitStandby(ctx, 0); err != nil {
		t.Fatal(err)
	}
	assertRows(ctx, t, c.URL(c.NodeAddrs()[0]), 1)
}

// startTestCluster starts a synchronous Patroni cluster in a directory
// the server account can reach and stops it when the test ends.
func startTestCluster(ctx context.Context, t *testing.T) *pgCluster {
	t.Helper()
	needClusterBinaries(t)
	work := t.TempDir()
	// As root the servers run as another user, who must reach work; the
	// parent t.TempDir makes is 0700.
	if os.Geteuid() == 0 {
		for _, dir := range []string{filepath.Dir(work), work} {
			if err := os.Chmod(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	f, err := startFaults()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Stop)
	start := time.Now()
	c, err := startPGCluster(ctx, pgClusterOptions{Work: work, Sync: true, Faults: f, Log: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	t.Logf("startPGCluster took %s", time.Since(start))
	return c
}

// waitConnect waits up to ten seconds until a connection to url succeeds.
func waitConnect(ctx context.Context, t *testing.T, url string) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var one int
		if err = pgQueryRow(ctx, url, "SELECT 1", nil, &one); err == nil {
			return
		}
	}
	t.Fatalf("connect to %s: %v", url, err)
}

// needClusterBinaries skips the test where Patroni, etcd or PgBouncer is
// not installed (each error names its Debian package), except on CI (CI
// set), where .ci/run installs them and a missing one fails the test.
func needClusterBinaries(t *testing.T) {
	t.Helper()
	for _, find := range []func() (string, error){patroniBinary, etcdBinary, pgBouncerBinary} {
		if _, err := find(); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%v: on CI the Patroni cluster must run", err)
			}
			t.Skip(err)
		}
	}
}

// assertRows checks that table acked holds exactly rows 1 to n at url.
func assertRows(ctx context.Context, t *testing.T, url string, n int) {
	t.Helper()
	var count, maxID int
	pgQueryRowTest(ctx, t, url, "SELECT count(*), coalesce(max(id), 0) FROM acked", &count, &maxID)
	if count != n || maxID != n {
		t.Errorf("acked holds %d rows up to id %d, want rows 1 to %d", count, maxID, n)
	}
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
