package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/tooling/harness"
	"github.com/idemref/payments/internal/tooling/pgtmp"
)

const (
	// pgUser is the superuser pgtmp's initdb makes; every local
	// connection is trusted, so it needs no password.
	pgUser     = "postgres"
	pgDatabase = "payments"
	// pgStandbyName is the standby's application_name on the primary, which
	// synchronous_standby_names refers to, and the name of its replication
	// slot there.
	pgStandbyName = "standby1"
	// pgWaitTimeout bounds each wait for a server or a bouncer to answer
	// and for replication to reach the state we need.
	pgWaitTimeout = 30 * time.Second
	// pgBouncerStopTimeout is how long pgbouncer gets to exit on SIGTERM
	// before its process group is killed.
	pgBouncerStopTimeout = 5 * time.Second
)

// pgPairOptions configures startPGPair.
type pgPairOptions struct {
	// Work holds the data directories, configurations and logs, one
	// subdirectory per process. It must exist and be reachable by the
	// account PostgreSQL runs as (pgtmp checks).
	Work string
	// Sync makes the standby synchronous: a commit on the primary returns
	// only once the standby has flushed it. Otherwise streaming is
	// asynchronous.
	Sync bool
	// Replication, when set, is given the primary's address (host:port)
	// and returns the address the standby dials instead, where the caller
	// puts a link it can cut.
	Replication func(primaryAddr string) (string, error)
	// Log receives progress; nil discards it.
	Log *slog.Logger
}

// pgPair is a PostgreSQL primary with one streaming standby and a
// PgBouncer in front of each, all real processes on this machine: the
// shape of a production deployment whose orchestrator fails over by
// promoting the standby. The address getters and Primary may be called
// from any goroutine; the other methods from one at a time.
type pgPair struct {
	sync        bool
	log         *slog.Logger
	nodeOpts    [2]pgtmp.Options // how each node starts, to restart it alike
	nodes       [2]*pgtmp.Cluster
	nodeAddrs   [2]string
	bouncers    [2]*pgBouncer
	bouncerAddr [2]string
	primary     atomic.Int32
	down        [2]bool // killed: never started again
	promoted    bool    // the standby took over: nothing streams any more
}

// startPGPair starts a durable primary, copies it into a standby that
// streams from it (through o.Replication's address when given) and waits
// until the standby streams, synchronously when o.Sync. Then it creates
// the database payments and starts one PgBouncer per node. On error
// everything started is stopped again.
func startPGPair(ctx context.Context, o pgPairOptions) (_ *pgPair, err error) {
	p := &pgPair{sync: o.Sync, log: o.Log}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	defer func() {
		if err != nil {
			p.Stop()
		}
	}()
	start := time.Now()
	if err := p.startPrimary(ctx, o.Work); err != nil {
		return nil, err
	}
	if err := p.startStandby(ctx, o.Work, o.Replication); err != nil {
		return nil, err
	}
	if err := p.waitStreaming(ctx); err != nil {
		return nil, err
	}
	// Only now: with a synchronous standby, a commit waits until the
	// standby has it.
	if err := pgExec(ctx, p.adminURL(0), "CREATE DATABASE "+pgDatabase); err != nil {
		return nil, err
	}
	for i, node := range p.nodes {
		b, err := startPGBouncer(ctx, node, filepath.Join(o.Work, fmt.Sprintf("bouncer%d", i)), p.URL)
		if err != nil {
			return nil, err
		}
		p.bouncers[i], p.bouncerAddr[i] = b, b.addr
	}
	p.log.Info("PostgreSQL pair ready", "nodes", p.nodeAddrs, "bouncers", p.bouncerAddr, "sync", o.Sync,
		"took", time.Since(start).Round(time.Millisecond))
	return p, nil
}

// pgNodeSettings are the settings both nodes run with: either may be the
// primary, so both are as durable as a production primary.
func pgNodeSettings() map[string]string {
	return map[string]string{
		"fsync":              "on",
		"synchronous_commit": "on",
		"full_page_writes":   "on",
		"wal_level":          "replica",
		"max_wal_senders":    "10",
		"hot_standby":        "on",
		// A standby whose primary went away retries after this long (the
		// default is 5 s), so it streams again soon after a restart or a
		// restored link. Promotion waits for a retry under way too: with
		// 1s it took 1.2 s in half the runs here, with 200ms 0.2-0.45 s.
		"wal_retrieve_retry_interval": "200ms",
	}
}

// startPrimary initializes and starts node 0.
func (p *pgPair) startPrimary(ctx context.Context, work string) error {
	settings := pgNodeSettings()
	if p.sync {
		settings["synchronous_standby_names"] = pgStandbyName
	}
	return p.startNode(ctx, 0, pgtmp.Options{Dir: filepath.Join(work, "node0"), Settings: settings, Logger: p.log})
}

// startStandby copies the primary into node 1 with pg_basebackup and
// starts it streaming from the primary, or from the address replication
// returns for it.
func (p *pgPair) startStandby(ctx context.Context, work string, replication func(string) (string, error)) error {
	upstream := p.nodeAddrs[0]
	if replication != nil {
		var err error
		if upstream, err = replication(upstream); err != nil {
			return fmt.Errorf("replication link: %w", err)
		}
	}
	opts := pgtmp.Options{
		Dir:      filepath.Join(work, "node1"),
		Settings: pgNodeSettings(),
		Standby:  &pgtmp.Standby{Primary: upstream, Name: pgStandbyName},
		Logger:   p.log,
	}
	return p.startNode(ctx, 1, opts)
}

// startNode starts node i and records how, with the port it got, so that
// a restart reuses both.
func (p *pgPair) startNode(ctx context.Context, i int, opts pgtmp.Options) error {
	c, err := pgtmp.Start(ctx, opts)
	if err != nil {
		return fmt.Errorf("node %d: %w", i, err)
	}
	opts.Port = c.Port()
	p.nodeOpts[i], p.nodes[i] = opts, c
	p.nodeAddrs[i] = fmt.Sprintf("127.0.0.1:%d", c.Port())
	return nil
}

// waitStreaming waits until node 0's pg_stat_replication shows the
// standby streaming and, when sync, as its synchronous standby: before
// that a commit would not wait for the standby. Node 0 is the primary
// for as long as there is a standby.
func (p *pgPair) waitStreaming(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, pgWaitTimeout)
	defer cancel()
	want := "streaming"
	if p.sync {
		want = "streaming/sync"
	}
	var got string
	for {
		var state, syncState string
		err := pgQueryRow(ctx, p.adminURL(0),
			"SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1", []any{pgStandbyName}, &state, &syncState)
		switch {
		case err == nil:
			got = state + "/" + syncState
			if state == "streaming" && (!p.sync || syncState == "sync") {
				return nil
			}
		case errors.Is(err, pgx.ErrNoRows):
			got = "not connected"
		default:
			got = err.Error()
		}
		select {
		case <-ctx.Done():
			standbyLog := filepath.Join(p.nodeOpts[1].Dir, "postgres.log")
			return fmt.Errorf("standby is not %s after %s (last: %s)\n--- %s ---\n%s",
				want, pgWaitTimeout, got, standbyLog, harness.Tail(standbyLog))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// NodeAddrs returns the PostgreSQL servers' addresses: [0] the original
// primary, [1] the original standby.
func (p *pgPair) NodeAddrs() [2]string { return p.nodeAddrs }

// BouncerAddrs returns the addresses of the PgBouncers in front of node 0
// and node 1.
func (p *pgPair) BouncerAddrs() [2]string { return p.bouncerAddr }

// User is the user name to connect as; no password is needed.
func (p *pgPair) User() string { return pgUser }

// Primary is the index of the node that is the primary now.
func (p *pgPair) Primary() int { return int(p.primary.Load()) }

// URL is a connection URL for the database payments at addr.
func (p *pgPair) URL(addr string) string {
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", pgUser, addr, pgDatabase)
}

// adminURL is a URL for node i's database postgres, which exists before
// payments does.
func (p *pgPair) adminURL(i int) string { return p.nodes[i].URL("postgres") }

// KillPrimary crashes the primary as a machine crash would: its postmaster
// and every backend die at once by SIGKILL. It returns once they are gone.
// The node is never started again, as a failed-over primary must not come
// back as a second writer.
func (p *pgPair) KillPrimary() error {
	i := p.Primary()
	if p.down[i] {
		return fmt.Errorf("node %d, the primary, is already down", i)
	}
	p.nodes[i].Kill()
	p.down[i] = true
	p.log.Info("PostgreSQL primary killed", "node", i)
	return nil
}

// Promote makes the standby the primary with pg_promote, as an
// orchestrator does, and returns how long it took until the standby
// answered as a primary.
func (p *pgPair) Promote(ctx context.Context) (time.Duration, error) {
	i := 1 - p.Primary()
	if p.promoted || p.down[i] {
		return 0, errors.New("there is no standby to promote")
	}
	url := p.adminURL(i)
	start := time.Now()
	var done bool
	if err := pgQueryRow(ctx, url, "SELECT pg_promote(true, 60)", nil, &done); err != nil {
		return 0, fmt.Errorf("promote node %d: %w", i, err)
	}
	if !done {
		return 0, fmt.Errorf("promote node %d: not done within 60 s", i)
	}
	var inRecovery bool
	if err := pgQueryRow(ctx, url, "SELECT pg_is_in_recovery()", nil, &inRecovery); err != nil {
		return 0, fmt.Errorf("promote node %d: %w", i, err)
	}
	if inRecovery {
		return 0, fmt.Errorf("promote node %d: still in recovery after pg_promote", i)
	}
	took := time.Since(start)
	p.promoted = true
	p.primary.Store(int32(i))
	p.log.Info("PostgreSQL standby promoted", "node", i, "took", took.Round(time.Millisecond))
	return took, nil
}

// RestartPrimary stops the primary in mode "fast" or "immediate" (see
// pgtmp.Cluster.StopMode) and starts it again on its port and data
// directory. It returns once the primary accepts connections and, for a
// synchronous pair that still has its standby, once the standby streams
// in sync again, since until then every commit waits.
func (p *pgPair) RestartPrimary(ctx context.Context, mode string) error {
	i := p.Primary()
	if p.down[i] {
		return fmt.Errorf("node %d, the primary, is down for good", i)
	}
	start := time.Now()
	if err := p.nodes[i].StopMode(mode); err != nil {
		return fmt.Errorf("stop node %d (%s): %w", i, mode, err)
	}
	if err := p.startNode(ctx, i, p.nodeOpts[i]); err != nil {
		return err
	}
	if p.sync && !p.promoted {
		if err := p.waitStreaming(ctx); err != nil {
			return err
		}
	}
	p.log.Info("PostgreSQL primary restarted", "node", i, "mode", mode, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// Stop stops the bouncers, then the primary, then the standby, ignoring
// what is already dead. Work is left for inspection.
func (p *pgPair) Stop() {
	for _, b := range p.bouncers {
		if b != nil {
			b.stop()
		}
	}
	first := p.Primary()
	for _, i := range []int{first, 1 - first} {
		if p.nodes[i] == nil {
			continue
		}
		if err := p.nodes[i].Stop(); err != nil {
			p.log.Warn("PostgreSQL node did not stop cleanly", "node", i, "err", err)
		}
	}
}

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

// startPGBouncer runs pgbouncer in front of node as the account node runs
// as (pgbouncer refuses root too), with its files in dir, and waits until
// a query through it succeeds. url makes a connection URL from an
// address.
func startPGBouncer(ctx context.Context, node *pgtmp.Cluster, dir string, url func(string) string) (*pgBouncer, error) {
	bin, err := pgBouncerBinary()
	if err != nil {
		return nil, err
	}
	addr, conf, err := writePGBouncerConfig(dir, node.Port())
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
	if err := node.StartProcess(b.cmd); err != nil {
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
