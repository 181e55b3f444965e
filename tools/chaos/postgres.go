package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/tooling/harness"
	"github.com/idemref/payments/internal/tooling/pgtmp"
)

const (
	// pgUser is the superuser Patroni's initdb makes (and replicates and
	// rewinds as); every local connection is trusted, so it needs no
	// password.
	pgUser     = "postgres"
	pgDatabase = "payments"
	// pgWaitTimeout bounds each wait for etcd or a bouncer to answer.
	pgWaitTimeout = 30 * time.Second
	// pgBouncerStopTimeout is how long pgbouncer gets to exit on SIGTERM
	// before its process group is killed.
	pgBouncerStopTimeout = 5 * time.Second
)

// pgBouncer is a running pgbouncer.
type pgBouncer struct {
	addr    string
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{} // closed once the process has exited
}

// pgBouncerConfig is pgbouncer.ini for one node. Transaction pooling is
// what the service is written for. A dead server must fail clients fast
// rather than hold them, so that a client with a multi-host URL moves on
// to the other node: the first client after the server died still logs in
// (pgbouncer answers logins itself) and waits query_wait_timeout for a
// server; from then on, until a server login succeeds again, new clients
// are refused at once, and the login is retried every server_login_retry
// instead of every 15 s. pgx sends no startup parameter pgbouncer does not
// know; other drivers send extra_float_digits, and search_path is ignored
// so that a URL carrying it still connects. No unix socket: clients use
// TCP, and the account pgbouncer runs as may not write the default
// socket directory.
const pgBouncerConfig = `[databases]
%[1]s = host=127.0.0.1 port=%[2]s dbname=%[1]s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %[3]s
unix_socket_dir =
auth_type = trust
auth_file = %[4]s
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
server_connect_timeout = 3
server_login_retry = 1
query_wait_timeout = 5
ignore_startup_parameters = extra_float_digits,search_path
`

// startPGBouncer runs pgbouncer in front of the PostgreSQL on serverPort
// as the account PostgreSQL runs as (pgbouncer refuses root too), with
// its files in dir, and waits until a query through it succeeds. url
// makes a connection URL from an address.
func startPGBouncer(ctx context.Context, serverPort int, dir string, url func(string) string) (*pgBouncer, error) {
	bin, err := pgBouncerBinary()
	if err != nil {
		return nil, err
	}
	addr, conf, err := writePGBouncerConfig(dir, serverPort)
	if err != nil {
		return nil, err
	}
	b := &pgBouncer{addr: addr, logPath: filepath.Join(dir, "pgbouncer.log"), exited: make(chan struct{})}
	logFile, err := os.Create(b.logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child keeps its own descriptor
	b.cmd = exec.Command(bin, conf)
	b.cmd.Dir = dir
	b.cmd.Stdout, b.cmd.Stderr = logFile, logFile
	if err := pgtmp.StartAs(dir, b.cmd); err != nil {
		return nil, fmt.Errorf("start pgbouncer: %w", err)
	}
	go func() {
		_ = b.cmd.Wait()
		close(b.exited)
	}()
	if err := b.waitReady(ctx, url(addr)); err != nil {
		b.stop()
		return nil, fmt.Errorf("pgbouncer on %s: %w\n--- %s ---\n%s", addr, err, b.logPath, harness.Tail(b.logPath))
	}
	return b, nil
}

// pgBouncerBinary finds pgbouncer on PATH or where Debian puts it.
func pgBouncerBinary() (string, error) {
	if bin, err := exec.LookPath("pgbouncer"); err == nil {
		return bin, nil
	}
	const debian = "/usr/sbin/pgbouncer"
	if _, err := os.Stat(debian); err != nil {
		return "", errors.New("pgbouncer not found: install it (Debian/Ubuntu: apt-get install pgbouncer)")
	}
	return debian, nil
}

// writePGBouncerConfig writes pgbouncer.ini and its user list into dir for
// a server on serverPort, on a free port it returns with the
// configuration's path. The files are world-readable because pgbouncer
// runs as another user than we may.
func writePGBouncerConfig(dir string, serverPort int) (addr, conf string, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	if addr, err = freeAddr(); err != nil {
		return "", "", err
	}
	_, port, _ := strings.Cut(addr, ":")
	users := filepath.Join(dir, "users.txt")
	// trust still needs the user listed; the password is not checked.
	if err := os.WriteFile(users, []byte(fmt.Sprintf("%q \"\"\n", pgUser)), 0o644); err != nil {
		return "", "", err
	}
	conf = filepath.Join(dir, "pgbouncer.ini")
	text := fmt.Sprintf(pgBouncerConfig, pgDatabase, strconv.Itoa(serverPort), port, users)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		return "", "", err
	}
	return addr, conf, nil
}

// waitReady polls with a query through the bouncer, in the mode the
// service uses, until it succeeds, pgbouncer exits or pgWaitTimeout
// passes.
func (b *pgBouncer) waitReady(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, pgWaitTimeout)
	defer cancel()
	for {
		var one int
		err := pgQueryRow(ctx, url+"&default_query_exec_mode=exec", "SELECT $1::int", []any{1}, &one)
		if err == nil {
			return nil
		}
		select {
		case <-b.exited:
			return fmt.Errorf("exited during startup (%v)", b.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("no answer within %s: %w", pgWaitTimeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop shuts pgbouncer down at once (SIGTERM, which in 1.18 does not wait
// for clients), killing its process group if it lingers.
func (b *pgBouncer) stop() {
	_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-b.exited:
		return
	case <-time.After(pgBouncerStopTimeout):
	}
	_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
	<-b.exited
}

// pgExec runs sql on a new connection to url.
func pgExec(ctx context.Context, url, sql string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// pgQueryRow runs sql with args on a new connection to url and scans its
// one row into dest. Each call connects anew because the server behind
// url may have been restarted since the last.
func pgQueryRow(ctx context.Context, url, sql string, args []any, dest ...any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}
