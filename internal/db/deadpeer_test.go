package db_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/tooling/pgtmp"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// The rule of deadpeer.go: a connection whose server went silent ends
// within its tcp_user_timeout, a COMMIT included, which runs without a
// deadline of its own.

// inNamespace is set in the copy of this test binary that
// TestACommitToASilentServerEnds runs in a network namespace of its own.
const inNamespace = "DB_TEST_IN_NETWORK_NAMESPACE"

// TestACommitToASilentServerEnds cuts the link between the pool and its
// server while a COMMIT is on its way: the server never receives it, and
// nothing answers, not even a reset (a partition, not a crash). Without a
// bound the COMMIT waits for the kernel's retransmissions, about 15
// minutes; with tcp_user_timeout it ends in about that long as a transient
// error (an unknown outcome: the client's retry with the same key
// resolves it).
//
// The cut is real: the test runs itself again under unshare --net, where
// 127.0.0.1 is a loopback link of its own, the server is started there,
// and the link is taken down with ip link (the kernel then drops what TCP
// sends, and TCP retransmits, as across a partition). The machine's
// network is never touched.
func TestACommitToASilentServerEnds(t *testing.T) {
	if os.Getenv(inNamespace) == "" {
		runInNetworkNamespace(t, "^TestACommitToASilentServerEnds$")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	server := testkit.Postgres(ctx, t, pgtmp.Options{})
	execSQL(ctx, t, server.URL("postgres"), "CREATE TABLE acked (id int PRIMARY KEY)")
	const bound = time.Second
	pool, err := db.Open(ctx, server.URL("postgres")+"&tcp_user_timeout=1000")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	var started time.Time
	done := make(chan error, 1)
	go func() {
		done <- db.WithTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO acked VALUES (1)"); err != nil {
				return err
			}
			loopback(t, "down")
			started = time.Now()
			return nil // COMMIT goes out on the cut link
		})
	}()
	const patience = 20 * time.Second
	select {
	case err := <-done:
		elapsed := time.Since(started)
		loopback(t, "up")
		if err == nil || !db.IsTransient(err) {
			t.Fatalf("the COMMIT on a cut link returned %v, want a transient error", err)
		}
		if elapsed > bound+5*time.Second {
			t.Errorf("the COMMIT ended %s after the cut; tcp_user_timeout is %s", elapsed, bound)
		}
		t.Logf("the COMMIT ended %s after the cut (tcp_user_timeout %s): %v", elapsed.Round(10*time.Millisecond), bound, err)
	case <-time.After(patience):
		loopback(t, "up")
		t.Fatalf("the COMMIT still waited %s after the link was cut (tcp_user_timeout %s)", patience, bound)
	}
	// Nothing committed: the server never received the COMMIT.
	if n := countRows(ctx, t, server.URL("postgres"), 1); n != 0 {
		t.Errorf("%d rows committed, want 0", n)
	}
}

// runInNetworkNamespace runs the test named by pattern in a copy of this
// test binary, in a new network namespace whose loopback link is up.
func runInNetworkNamespace(t *testing.T, pattern string) {
	t.Helper()
	for _, tool := range []string{"unshare", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s: %v (util-linux and iproute2 are on every Debian machine)", tool, err)
		}
	}
	cmd := exec.CommandContext(t.Context(), "unshare", "--net", "sh", "-c", `ip link set lo up && exec "$@"`, "sh",
		os.Args[0], "-test.run="+pattern, "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), inNamespace+"=1")
	out, err := cmd.CombinedOutput()
	t.Logf("in a network namespace of its own:\n%s", out)
	if err != nil {
		t.Fatalf("the test failed in its network namespace: %v", err)
	}
}

// loopback sets the namespace's loopback link up or down.
func loopback(t *testing.T, state string) {
	if out, err := exec.Command("ip", "link", "set", "lo", state).CombinedOutput(); err != nil {
		t.Errorf("ip link set lo %s: %v: %s", state, err, out)
	}
}

// TestPoolConnectionsDetectDeadPeers reads the socket options of the
// pool's connections: keepalive probes, and TCP_USER_TIMEOUT from the
// URL's tcp_user_timeout or the default, which is never sent to the
// server as a setting (PgBouncer refuses unknown ones).
func TestPoolConnectionsDetectDeadPeers(t *testing.T) {
	t.Parallel()
	url := testdb.New(t)
	for _, tc := range []struct {
		param string
		want  time.Duration
	}{
		{"", db.DefaultTCPUserTimeout},
		{"&tcp_user_timeout=2500", 2500 * time.Millisecond},
		{"&tcp_user_timeout=0", 0},
	} {
		t.Run(strings.TrimPrefix(tc.param, "&"), func(t *testing.T) {
			pool, err := db.Open(t.Context(), url+tc.param)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			conn, err := pool.Acquire(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			var serverSide string
			if err := conn.QueryRow(t.Context(), "SHOW tcp_user_timeout").Scan(&serverSide); err != nil {
				t.Fatal(err)
			}
			if serverSide != "0" {
				t.Errorf("the server's tcp_user_timeout = %s: the URL's parameter was sent as a setting", serverSide)
			}
			opts := socketOptions(t, conn.Conn().PgConn().Conn())
			want := map[string]int{"TCP_USER_TIMEOUT": int(tc.want.Milliseconds()), "SO_KEEPALIVE": 1, "TCP_KEEPIDLE": 10, "TCP_KEEPINTVL": 5}
			for name, w := range want {
				if opts[name] != w {
					t.Errorf("%s = %d, want %d", name, opts[name], w)
				}
			}
		})
	}
	if _, err := db.Open(t.Context(), url+"&tcp_user_timeout=soon"); err == nil || !strings.Contains(err.Error(), "tcp_user_timeout") {
		t.Errorf("tcp_user_timeout=soon: err = %v, want it refused by name", err)
	}
}

func socketOptions(t *testing.T, c net.Conn) map[string]int {
	t.Helper()
	tcp, ok := c.(*net.TCPConn)
	if !ok {
		t.Fatalf("the connection is a %T, not TCP", c)
	}
	raw, err := tcp.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	opts := map[string]int{}
	err = raw.Control(func(fd uintptr) {
		for name, opt := range map[string][2]int{
			"TCP_USER_TIMEOUT": {unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT},
			"SO_KEEPALIVE":     {unix.SOL_SOCKET, unix.SO_KEEPALIVE},
			"TCP_KEEPIDLE":     {unix.IPPROTO_TCP, unix.TCP_KEEPIDLE},
			"TCP_KEEPINTVL":    {unix.IPPROTO_TCP, unix.TCP_KEEPINTVL},
		} {
			v, err := unix.GetsockoptInt(int(fd), opt[0], opt[1])
			if err != nil {
				t.Errorf("getsockopt %s: %v", name, err)
			}
			opts[name] = v
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return opts
}
