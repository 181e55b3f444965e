package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
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

// Patroni's clocks for a test: its documented minimum TTL, and loop_wait
// and retry_timeout within the rule it relies on,
// loop_wait + 2 × retry_timeout <= ttl. The rule is what fences a cut-off
// leader: it fails to renew its key within retry_timeout and demotes
// itself, well before the key expires at ttl and a standby may take
// over. docs/deployment.md says what production would set.
const (
	patroniTTL          = 20 * time.Second
	patroniLoopWait     = 2 * time.Second
	patroniRetryTimeout = 5 * time.Second
	// patroniScope names the cluster in etcd.
	patroniScope = "chaos"
	// pgMembers: a leader and one synchronous standby.
	pgMembers = 2
	// failoverTimeout bounds the wait for Patroni to elect a leader after
	// a fault: its TTL, a few loops and a promotion, with room to spare.
	failoverTimeout = 90 * time.Second
	// patroniStopTimeout is how long Patroni gets to stop PostgreSQL and
	// itself on SIGTERM before both are killed.
	patroniStopTimeout = 30 * time.Second
)

// pgClusterOptions configures startPGCluster.
type pgClusterOptions struct {
	// Work holds etcd's and each member's files, one subdirectory each.
	// It must be reachable by the account PostgreSQL runs as.
	Work string
	// Sync turns on Patroni's synchronous_mode: a commit on the leader
	// returns only once the standby has flushed it, and Patroni promotes
	// only the standby named synchronous. Off, streaming is asynchronous:
	// the negative control's misconfiguration.
	Sync bool
	// Faults makes the links between the members, and between each member
	// and etcd, that scenarios cut.
	Faults *faults
	// Log receives progress; nil discards it.
	Log *slog.Logger
}

// pgCluster is PostgreSQL as a deployment runs it: two members managed by
// Patroni, which keeps its leader key in a three-member etcd, elects the
// leader, fails over on its own, demotes a leader cut off from etcd and
// rejoins a former leader with pg_rewind. A PgBouncer sits in front of
// each member. Every link Patroni and replication use goes through
// toxiproxy; the PgBouncers reach their member directly, so that a
// scenario can cut a leader off from its cluster while the API can still
// reach it (a split brain attempt). Leader and the address getters may be
// called from any goroutine; the other methods from one at a time.
type pgCluster struct {
	sync        bool
	log         *slog.Logger
	patroni     string // the patroni binary
	etcd        *etcdCluster
	members     [pgMembers]*patroniMember
	bouncers    [pgMembers]*pgBouncer
	bouncerAddr [pgMembers]string
	leader      atomic.Int32
}

// patroniMember is one Patroni process and the PostgreSQL it runs.
type patroniMember struct {
	name     string // Patroni's member name and the standby's application_name
	dir      string
	dataDir  string
	config   string
	logPath  string // Patroni's log, with PostgreSQL's in it
	pgAddr   string // where PostgreSQL listens
	restAddr string // where Patroni's REST API listens
	// What others dial: etcd, as this member reaches it (one link per
	// etcd member); this member's PostgreSQL (replication, pg_rewind) and
	// REST API, as the other member reaches them (connect_address).
	etcdLinks [etcdMembers]*link
	pgLink    *link
	restLink  *link

	cmd    *exec.Cmd
	exited chan struct{}
}

// patroniBinary finds patroni on PATH, as Debian's patroni installs it.
func patroniBinary() (string, error) {
	bin, err := exec.LookPath("patroni")
	if err != nil {
		return "", errors.New("patroni not found: install it (Debian/Ubuntu: apt-get install patroni etcd-server)")
	}
	if _, err := exec.LookPath("patronictl"); err != nil {
		return "", errors.New("patronictl not found: install it (Debian/Ubuntu: apt-get install patroni)")
	}
	return bin, nil
}

// startPGCluster starts etcd, then Patroni on member 0, which bootstraps
// the cluster and becomes its leader, then member 1, which copies it and
// streams from it (synchronously when o.Sync). Then it creates the
// database payments and starts one PgBouncer per member. On error
// everything started is stopped again.
func startPGCluster(ctx context.Context, o pgClusterOptions) (_ *pgCluster, err error) {
	c := &pgCluster{sync: o.Sync, log: o.Log}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.patroni, err = patroniBinary(); err != nil {
		return nil, err
	}
	binDir, err := pgtmp.FindBinDir()
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	start := time.Now()
	if c.etcd, err = startEtcd(ctx, o.Work); err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	for i := range c.members {
		if c.members[i], err = newPatroniMember(o.Work, i, o.Faults, c.etcd.ClientAddrs()); err != nil {
			return nil, err
		}
	}
	for i, m := range c.members {
		if err := m.writeConfig(c.members[1-i], o.Sync, binDir); err != nil {
			return nil, err
		}
	}
	if err := c.startMember(0); err != nil {
		return nil, err
	}
	if _, err := c.WaitLeader(ctx, -1); err != nil {
		return nil, err
	}
	if err := c.startMember(1); err != nil {
		return nil, err
	}
	if err := c.WaitStandby(ctx, 1); err != nil {
		return nil, err
	}
	// Only now: in synchronous mode a commit waits until the standby has it.
	if err := pgExec(ctx, c.adminURL(0), "CREATE DATABASE "+pgDatabase); err != nil {
		return nil, err
	}
	for i, m := range c.members {
		port, _ := strconv.Atoi(m.pgAddr[strings.LastIndexByte(m.pgAddr, ':')+1:])
		b, err := startPGBouncer(ctx, port, filepath.Join(o.Work, fmt.Sprintf("bouncer%d", i)), c.URL)
		if err != nil {
			return nil, err
		}
		c.bouncers[i], c.bouncerAddr[i] = b, b.addr
	}
	c.log.Info("Patroni cluster ready", "members", []string{c.members[0].pgAddr, c.members[1].pgAddr},
		"bouncers", c.bouncerAddr, "sync", o.Sync, "took", time.Since(start).Round(time.Millisecond))
	return c, nil
}

// newPatroniMember picks member i's addresses and makes its links.
func newPatroniMember(work string, i int, f *faults, etcdAddrs [etcdMembers]string) (*patroniMember, error) {
	m := &patroniMember{name: "pg" + strconv.Itoa(i), dir: filepath.Join(work, "pg"+strconv.Itoa(i))}
	m.dataDir = filepath.Join(m.dir, "data")
	m.config = filepath.Join(m.dir, "patroni.yml")
	m.logPath = filepath.Join(work, m.name+".log")
	if err := os.MkdirAll(m.dir, 0o700); err != nil {
		return nil, err
	}
	var err error
	if m.pgAddr, err = freeAddr(); err != nil {
		return nil, err
	}
	if m.restAddr, err = freeAddr(); err != nil {
		return nil, err
	}
	for j, addr := range etcdAddrs {
		if m.etcdLinks[j], err = f.Link(fmt.Sprintf("%s-etcd%d", m.name, j), addr); err != nil {
			return nil, err
		}
	}
	if m.pgLink, err = f.Link(m.name+"-postgres", m.pgAddr); err != nil {
		return nil, err
	}
	if m.restLink, err = f.Link(m.name+"-rest", m.restAddr); err != nil {
		return nil, err
	}
	return m, nil
}

// writeConfig writes the member's Patroni configuration. It is JSON, which
// is YAML too. The bootstrap section is read once, by the member that
// initializes the cluster, and kept in etcd from then on.
func (m *patroniMember) writeConfig(other *patroniMember, sync bool, binDir string) error {
	var etcdHosts []string
	for _, l := range m.etcdLinks {
		etcdHosts = append(etcdHosts, l.Addr())
	}
	config := map[string]any{
		"scope": patroniScope,
		"name":  m.name,
		"log":   map[string]any{"level": "INFO"},
		"restapi": map[string]any{
			"listen":          m.restAddr,
			"connect_address": m.restLink.Addr(),
		},
		"etcd3": map[string]any{
			"hosts": etcdHosts,
			// The hosts are proxies (our links): never replace them with
			// the members etcd advertises, which no link would cover.
			"use_proxies": true,
		},
		// There is no /dev/watchdog here. In production Patroni arms one,
		// so that a Patroni that hangs cannot leave its PostgreSQL a
		// writable leader after the key expired (docs/deployment.md).
		"watchdog":   map[string]any{"mode": "off"},
		"bootstrap":  patroniBootstrap(sync),
		"postgresql": m.postgresqlConfig(binDir),
	}
	text, err := json.MarshalIndent(config, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(m.config, text, 0o644)
}

// patroniBootstrap is the bootstrap section: the cluster's settings in
// etcd (synchronous replication when sync) and how initdb runs.
func patroniBootstrap(sync bool) map[string]any {
	return map[string]any{
		"dcs": map[string]any{
			"ttl":                     int(patroniTTL.Seconds()),
			"loop_wait":               int(patroniLoopWait.Seconds()),
			"retry_timeout":           int(patroniRetryTimeout.Seconds()),
			"maximum_lag_on_failover": 1 << 20,
			"synchronous_mode":        sync,
			// Not strict: with the standby gone, the leader goes on
			// alone once it has recorded in etcd that the standby is
			// no longer synchronous, and Patroni then promotes no one
			// until the standby has caught up again. Strict would stop
			// every write while one of two members is down
			// (docs/deployment.md weighs the two).
			"synchronous_mode_strict": false,
			"postgresql": map[string]any{
				"use_pg_rewind": true,
				"use_slots":     true,
				"parameters": map[string]any{
					// pg_rewind needs hint bits in the WAL.
					"wal_log_hints":         "on",
					"max_wal_senders":       10,
					"max_replication_slots": 10,
					"hot_standby":           "on",
					"fsync":                 "on",
					"synchronous_commit":    "on",
					"full_page_writes":      "on",
					// A standby whose upstream went away retries after
					// this long (the default is 5 s).
					"wal_retrieve_retry_interval": "200ms",
				},
			},
		},
		"initdb": []any{map[string]string{"encoding": "UTF8"}, map[string]string{"auth": "trust"}},
	}
}

// postgresqlConfig is the member's own PostgreSQL section: where it
// listens and is reached (through its link), its directories and the
// accounts, all trusted on 127.0.0.1.
func (m *patroniMember) postgresqlConfig(binDir string) map[string]any {
	trust := []string{
		"local all all trust",
		"host all all 127.0.0.1/32 trust",
		"host replication all 127.0.0.1/32 trust",
	}
	user := map[string]string{"username": pgUser}
	return map[string]any{
		"listen":          m.pgAddr,
		"connect_address": m.pgLink.Addr(),
		"data_dir":        m.dataDir,
		"bin_dir":         binDir,
		"pgpass":          filepath.Join(m.dir, "pgpass"),
		"authentication": map[string]any{
			"superuser":   user,
			"replication": user,
			"rewind":      user,
		},
		"parameters": map[string]any{"unix_socket_directories": m.dir},
		"pg_hba":     trust,
	}
}

// startMember starts Patroni for member i, as the account PostgreSQL runs
// as, on its configuration and data directory as they are: a member
// started again rejoins (with pg_rewind when it diverged).
func (c *pgCluster) startMember(i int) error {
	m := c.members[i]
	logFile, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close() // the child keeps its own descriptor
	m.cmd = exec.Command(c.patroni, m.config)
	m.cmd.Dir = m.dir
	m.cmd.Stdout, m.cmd.Stderr = logFile, logFile
	if err := pgtmp.StartAs(m.dir, m.cmd); err != nil {
		return fmt.Errorf("start Patroni %s: %w", m.name, err)
	}
	m.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		_ = cmd.Wait()
		close(exited)
	}(m.cmd, m.exited)
	c.log.Info("Patroni started", "member", m.name)
	return nil
}

// patroniStatus is what GET /patroni says of a member.
type patroniStatus struct {
	State    string `json:"state"`
	Role     string `json:"role"`
	Timeline int    `json:"timeline"`
}

// leads: the member runs PostgreSQL as the leader ("master" in Patroni 3.0,
// "primary" from 3.1).
func (s patroniStatus) leads() bool {
	return s.State == "running" && (s.Role == "master" || s.Role == "primary")
}

// Status asks member i's Patroni, directly, how it is. Patroni answers 503
// with the same document when PostgreSQL is not running.
func (c *pgCluster) Status(ctx context.Context, i int) (patroniStatus, error) {
	var st patroniStatus
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.members[i].restAddr+"/patroni", nil)
	if err != nil {
		return st, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// WaitLeader waits until a member other than not (-1: any) leads and no
// other member does, records it as the leader and returns its index.
func (c *pgCluster) WaitLeader(ctx context.Context, not int) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, failoverTimeout)
	defer cancel()
	var seen [pgMembers]string
	for {
		leaders := []int{}
		for i := range c.members {
			st, err := c.Status(ctx, i)
			if err != nil {
				seen[i] = err.Error()
				continue
			}
			seen[i] = st.Role + "/" + st.State
			if st.leads() {
				leaders = append(leaders, i)
			}
		}
		if len(leaders) == 1 && leaders[0] != not {
			c.leader.Store(int32(leaders[0]))
			return leaders[0], nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("no single leader (other than member %d) within %s: %q\n%s", not, failoverTimeout, seen, c.tails())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WaitStandby waits until member i streams from the leader, as its
// synchronous standby when the cluster is synchronous: until then the
// cluster could not fail over to it without loss.
func (c *pgCluster) WaitStandby(ctx context.Context, i int) error {
	ctx, cancel := context.WithTimeout(ctx, failoverTimeout)
	defer cancel()
	var got string
	for {
		var state, syncState string
		err := pgQueryRow(ctx, c.adminURL(c.Leader()),
			"SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1", []any{c.members[i].name}, &state, &syncState)
		switch {
		case err == nil:
			got = state + "/" + syncState
			if state == "streaming" && (!c.sync || syncState == "sync" && c.namedSynchronous(ctx, i)) {
				return nil
			}
		case errors.Is(err, pgx.ErrNoRows):
			got = "not connected"
		default:
			got = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("member %s is not a streaming standby (sync: %t) within %s (last: %s)\n%s",
				c.members[i].name, c.sync, failoverTimeout, got, c.tails())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// namedSynchronous says whether Patroni has recorded member i as the
// synchronous standby in etcd (its REST API's GET /sync answers 200), as
// a switchover and a failover to it require; PostgreSQL may already
// stream to it in sync a loop earlier.
func (c *pgCluster) namedSynchronous(ctx context.Context, i int) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.members[i].restAddr+"/sync", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// tails is the end of every member's log, for an error message.
func (c *pgCluster) tails() string {
	var b strings.Builder
	for _, m := range c.members {
		if m != nil {
			fmt.Fprintf(&b, "--- %s ---\n%s\n", m.logPath, harness.Tail(m.logPath))
		}
	}
	return b.String()
}

// Leader is the index of the member last seen leading.
func (c *pgCluster) Leader() int { return int(c.leader.Load()) }

// Name is member i's name in Patroni.
func (c *pgCluster) Name(i int) string { return c.members[i].name }

// NodeAddrs returns the PostgreSQL servers' addresses, member 0's first.
func (c *pgCluster) NodeAddrs() [pgMembers]string {
	return [pgMembers]string{c.members[0].pgAddr, c.members[1].pgAddr}
}

// BouncerAddrs returns the addresses of the PgBouncers in front of member
// 0 and member 1.
func (c *pgCluster) BouncerAddrs() [pgMembers]string { return c.bouncerAddr }

// User is the user name to connect as; no password is needed.
func (c *pgCluster) User() string { return pgUser }

// URL is a connection URL for the database payments at addr.
func (c *pgCluster) URL(addr string) string {
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", pgUser, addr, pgDatabase)
}

// adminURL is a URL for member i's database postgres, which exists before
// payments does.
func (c *pgCluster) adminURL(i int) string {
	return fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable&connect_timeout=3", pgUser, c.members[i].pgAddr)
}

// postmasterPID reads member i's postmaster.pid; 0 when there is none or
// its process is gone (a crash leaves the file behind).
func (c *pgCluster) postmasterPID(i int) int {
	b, err := os.ReadFile(filepath.Join(c.members[i].dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	if pid <= 0 || !alive(pid) {
		return 0
	}
	return pid
}

// signalPostgres sends sig to member i's postmaster: Patroni starts it in a
// session of its own, so the process group is the postmaster's pid, and
// SIGKILL goes to every backend at once, as a machine crash would.
func (c *pgCluster) signalPostgres(i int, sig syscall.Signal) error {
	pid := c.postmasterPID(i)
	if pid == 0 {
		return fmt.Errorf("member %s runs no PostgreSQL", c.members[i].name)
	}
	if sig == syscall.SIGKILL {
		if err := syscall.Kill(-pid, sig); err == nil {
			return waitGone(pid)
		}
	}
	return syscall.Kill(pid, sig)
}

// waitGone waits until process pid has exited.
func waitGone(pid int) error {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if !alive(pid) {
			return nil
		}
	}
	return fmt.Errorf("process %d still runs", pid)
}

// alive says whether process pid exists and is not a zombie: zombies hold
// no sockets or files, and where init does not reap orphans they never
// leave.
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

// killPatroni ends member i's Patroni by SIGKILL, leaving its PostgreSQL
// running.
func (c *pgCluster) killPatroni(i int) {
	m := c.members[i]
	if m.cmd == nil {
		return
	}
	_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
	<-m.exited
	m.cmd = nil
}

// CrashLeader kills the leader's Patroni and PostgreSQL by SIGKILL, as the
// loss of its machine would, and returns the member's index. Patroni on the
// standby must notice on its own: the leader key expires after the TTL.
func (c *pgCluster) CrashLeader() (int, error) {
	i := c.Leader()
	c.killPatroni(i)
	if err := c.signalPostgres(i, syscall.SIGKILL); err != nil {
		return i, err
	}
	c.log.Info("Patroni leader crashed", "member", c.members[i].name)
	return i, nil
}

// Rejoin starts member i's Patroni again after a crash and waits until it
// streams from the leader as its standby: Patroni rewinds it with
// pg_rewind first when it diverged. It reports whether pg_rewind ran.
func (c *pgCluster) Rejoin(ctx context.Context, i int) (rewound bool, err error) {
	before := logSize(c.members[i].logPath)
	if err := c.startMember(i); err != nil {
		return false, err
	}
	if err := c.WaitStandby(ctx, i); err != nil {
		return false, err
	}
	return logHas(c.members[i].logPath, before, "pg_rewind exit code=0"), nil
}

// Isolate cuts member i off from etcd and from the other member, both
// ways (replication, pg_rewind, the REST API Patroni asks its peers on),
// as a network partition would. Its PgBouncer, and so the API, still
// reach it.
func (c *pgCluster) Isolate(i int) error { return c.setIsolated(i, true) }

// Heal restores what Isolate cut.
func (c *pgCluster) Heal(i int) error { return c.setIsolated(i, false) }

func (c *pgCluster) setIsolated(i int, cut bool) error {
	links := c.members[i].etcdLinks[:]
	for _, m := range c.members {
		links = append(links, m.pgLink, m.restLink)
	}
	for _, l := range links {
		op := l.Up
		if cut {
			op = l.Down
		}
		if err := op(); err != nil {
			return err
		}
	}
	return nil
}

// Switchover asks Patroni, as an operator would with patronictl, to hand
// the leadership to member candidate, and waits until it leads.
func (c *pgCluster) Switchover(ctx context.Context, candidate int) error {
	leader := c.Leader()
	cmd := exec.CommandContext(ctx, "patronictl", "-c", c.members[leader].config, "switchover",
		"--leader", c.members[leader].name, "--candidate", c.members[candidate].name, "--force")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("patronictl switchover: %w\n%s", err, out)
	}
	if got, err := c.WaitLeader(ctx, leader); err != nil {
		return fmt.Errorf("%w\npatronictl switchover said:\n%s", err, out)
	} else if got != candidate {
		return fmt.Errorf("switchover: member %d leads, want %d", got, candidate)
	}
	return nil
}

// RestartLeader restarts the leader's PostgreSQL, which stays the leader:
// "fast" asks Patroni (patronictl restart, a fast shutdown), "immediate"
// sends the postmaster SIGQUIT itself, as pg_ctl -m immediate does, and
// Patroni starts it again on its next loop. It returns once the leader
// runs again and its standby streams, since in synchronous mode every
// commit waits until then.
func (c *pgCluster) RestartLeader(ctx context.Context, mode string) error {
	i := c.Leader()
	switch mode {
	case "fast":
		cmd := exec.CommandContext(ctx, "patronictl", "-c", c.members[i].config, "restart", patroniScope, c.members[i].name, "--force")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("patronictl restart: %w\n%s", err, out)
		}
	case "immediate":
		pid := c.postmasterPID(i)
		if err := c.signalPostgres(i, syscall.SIGQUIT); err != nil {
			return err
		}
		if err := waitGone(pid); err != nil {
			return err
		}
	default:
		return fmt.Errorf("restart mode %q", mode)
	}
	if got, err := c.WaitLeader(ctx, -1); err != nil {
		return err
	} else if got != i {
		return fmt.Errorf("after a restart member %d leads, want %d", got, i)
	}
	return c.WaitStandby(ctx, 1-i)
}

// Stop stops the bouncers, then each Patroni (which stops its
// PostgreSQL), then etcd; whatever lingers is killed. Work is left for
// inspection.
func (c *pgCluster) Stop() {
	for _, b := range c.bouncers {
		if b != nil {
			b.stop()
		}
	}
	for i, m := range c.members {
		if m == nil {
			continue
		}
		if m.cmd != nil {
			_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-m.exited:
				m.cmd = nil
			case <-time.After(patroniStopTimeout):
				c.log.Warn("Patroni did not stop in time", "member", m.name)
				c.killPatroni(i)
			}
		}
		if c.postmasterPID(i) != 0 {
			_ = c.signalPostgres(i, syscall.SIGKILL)
		}
	}
	if c.etcd != nil {
		c.etcd.Stop()
	}
}

// logSize is the size of the file at path now; 0 when there is none.
func logSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logHas says whether the file at path holds s after offset.
func logHas(path string, offset int64, s string) bool {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < offset {
		return false
	}
	return strings.Contains(string(b[offset:]), s)
}
