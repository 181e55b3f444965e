package pgtmp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	readyTimeout = 30 * time.Second
	stopTimeout  = 30 * time.Second
	// groupExitTimeout bounds the wait for killed backends, which exit as
	// soon as the kernel schedules them.
	groupExitTimeout = 5 * time.Second
	// maxSocketPath keeps "<dir>/.s.PGSQL.<port>.lock" inside sun_path,
	// which is 108 bytes on Linux and 104 on macOS.
	maxSocketPath = 100
	// portAttempts bounds retries when a port we picked is taken by someone
	// else before postgres binds it.
	portAttempts = 3
)

// errPortInUse marks a startup failure that another port may fix.
var errPortInUse = errors.New("port already in use")

// Options configures Start.
type Options struct {
	// Dir is the data directory. It is created and initialized (initdb)
	// when it holds no PG_VERSION file, and reused as is otherwise.
	Dir string
	// Port is the TCP port on 127.0.0.1; 0 picks a free one.
	Port int
	// Fast trades crash safety for speed (fsync, synchronous_commit and
	// full_page_writes off), which is right for throwaway test data.
	Fast bool
	// Logger receives progress and warnings; nil discards them.
	Logger *slog.Logger
	// Settings are extra server settings (name to value), passed as -c
	// options after pgtmp's own so that they win.
	Settings map[string]string
	// Standby, when set and Dir is not initialized yet, fills Dir with a
	// base backup of another server instead of running initdb, and makes
	// it a standby that streams from that server. An initialized Dir is
	// used as is, so a standby restarts with the same call.
	Standby *Standby
}

// Standby names the server a new standby is copied from and how the
// standby identifies itself there.
type Standby struct {
	// Primary is the host:port to copy from and then stream from. It may
	// be a proxy in front of the primary.
	Primary string
	// Name is the standby's application_name on the primary, which is
	// what synchronous_standby_names refers to, and the name of the
	// physical replication slot made for it there, so that the primary
	// keeps every WAL segment the standby has not received yet.
	Name string
}

// Cluster is a running PostgreSQL server started by Start.
type Cluster struct {
	dir        string
	port       int
	logPath    string
	tempSocket string // socket directory to remove at Stop, if we made one
	log        *slog.Logger
	acct       *account
	cmd        *exec.Cmd

	exited  chan struct{} // closed when the postmaster has exited
	waitErr error         // cmd.Wait's result, valid once exited is closed

	stopOnce sync.Once
	stopErr  error
}

// Start initializes opts.Dir if needed, starts postgres on it and returns
// once the server accepts connections. The caller must call Stop.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Dir == "" {
		return nil, errors.New("pgtmp: Options.Dir is required")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	bin, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("pgtmp: %w", err)
	}
	if err := makeDataDir(dir); err != nil {
		return nil, err
	}
	acct, err := serverAccount(dir)
	if err != nil {
		return nil, err
	}
	if err := acct.checkReachable(dir); err != nil {
		return nil, err
	}

	if initialized(dir) {
		if err := clearStalePid(dir, log); err != nil {
			return nil, err
		}
	} else {
		if err := acct.chown(dir); err != nil {
			return nil, err
		}
		if err := create(ctx, bin, dir, acct, opts, log); err != nil {
			return nil, err
		}
	}

	socketDir, tempSocket, err := socketDir(dir, acct)
	if err != nil {
		return nil, err
	}
	shmDeadline := time.Now().Add(groupExitTimeout)
	for attempt := 1; ; attempt++ {
		port := opts.Port
		if port == 0 {
			if port, err = freePort(); err != nil {
				removeTemp(tempSocket)
				return nil, err
			}
		}
		c, err := launch(ctx, bin, dir, socketDir, port, acct, settingArgs(opts), log)
		if err == nil {
			c.tempSocket = tempSocket
			log.Info("PostgreSQL started", "dir", dir, "port", port)
			return c, nil
		}
		if shmStillAttached(err) && time.Now().Before(shmDeadline) {
			// A killed server's backends can still be detaching from its
			// shared memory when the next start on the directory comes
			// (they are not our children, and a busy machine reaps them
			// late): PostgreSQL refuses to start until they are gone.
			log.Warn("the previous server's shared memory is still attached; starting again shortly", "dir", dir)
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if opts.Port != 0 || attempt >= portAttempts || !errors.Is(err, errPortInUse) {
			removeTemp(tempSocket)
			return nil, err
		}
		log.Warn("port was taken before PostgreSQL could bind it; trying another", "port", port)
	}
}

// URL returns a connection URL for database on this server, as the
// superuser postgres (trusted, no password).
func (c *Cluster) URL(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, url.PathEscape(database))
}

// Port returns the TCP port the server listens on at 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// Pid is the postmaster's process id.
func (c *Cluster) Pid() int { return c.cmd.Process.Pid }

// Stop shuts the server down with PostgreSQL's fast shutdown (open
// transactions roll back, clients are disconnected, data is checkpointed)
// and waits for it to exit; after stopTimeout it kills the server's process
// group. Stop is safe to call more than once.
func (c *Cluster) Stop() error {
	return c.StopMode("fast")
}

// shutdownSignals maps pg_ctl's shutdown modes to the signal the
// postmaster takes for each.
var shutdownSignals = map[string]syscall.Signal{
	// Open transactions roll back, clients are disconnected, data is
	// checkpointed.
	"fast": syscall.SIGINT,
	// Processes quit at once without a checkpoint; the next start runs
	// crash recovery, as after a power loss, but WAL already flushed is
	// kept.
	"immediate": syscall.SIGQUIT,
}

// StopMode is Stop with pg_ctl's shutdown mode "fast" or "immediate", for
// callers that test what a server restart does to its clients. Only the
// first of Stop, StopMode and Kill acts; later calls return its result.
func (c *Cluster) StopMode(mode string) error {
	sig, ok := shutdownSignals[mode]
	if !ok {
		return fmt.Errorf("pgtmp: unknown shutdown mode %q (want fast or immediate)", mode)
	}
	c.stopOnce.Do(func() { c.stopErr = c.stop(sig) })
	return c.stopErr
}

// Kill ends the server as a crash of its machine would: the postmaster
// and every backend get SIGKILL at once, with no chance to write or
// answer anything more. It returns when they are gone; the next Start on
// the directory runs crash recovery.
func (c *Cluster) Kill() {
	c.stopOnce.Do(func() {
		defer removeTemp(c.tempSocket)
		c.kill()
		c.log.Info("PostgreSQL killed", "dir", c.dir)
	})
}

// StartProcess starts cmd as the user the server runs as, for helpers
// that refuse root as PostgreSQL does (pgbouncer, say). Like the server,
// cmd gets its own process group, so the caller can signal every process
// it forks, and on Linux it is killed when this process dies.
func (c *Cluster) StartProcess(cmd *exec.Cmd) error {
	cmd.SysProcAttr = sysProcAttr(c.acct, syscall.SIGKILL)
	return startOnFreshThread(cmd)
}

// exitErr is why postgres exited, once exited is closed: cmd.Wait's
// error, or a stand-in for an exit with status 0 (which Wait reports as
// nil), so the message reads the same either way.
func (c *Cluster) exitErr() error {
	if c.waitErr != nil {
		return c.waitErr
	}
	return errors.New("exit status 0")
}

func (c *Cluster) stop(sig syscall.Signal) error {
	defer removeTemp(c.tempSocket)
	select {
	case <-c.exited:
		return fmt.Errorf("pgtmp: postgres had already exited (%w); see %s", c.exitErr(), c.logPath)
	default:
	}
	if err := c.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("pgtmp: signal postgres: %w", err)
	}
	select {
	case <-c.exited:
		if c.waitErr != nil {
			return fmt.Errorf("pgtmp: postgres exited with %w; see %s", c.waitErr, c.logPath)
		}
		c.log.Info("PostgreSQL stopped", "dir", c.dir)
		return nil
	case <-time.After(stopTimeout):
	}
	c.log.Warn("PostgreSQL did not stop in time; killing it", "dir", c.dir, "timeout", stopTimeout)
	c.kill()
	return fmt.Errorf("pgtmp: postgres did not stop within %s and was killed; see %s", stopTimeout, c.logPath)
}

// kill ends the whole process group, backends included, and waits for the
// postmaster to be reaped and, for at most groupExitTimeout, for the
// backends to be gone too (we are not their parent, so we cannot wait for
// them directly).
func (c *Cluster) kill() {
	pgid := c.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-c.exited
	for deadline := time.Now().Add(groupExitTimeout); groupAlive(pgid) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
}

// shmStillAttached reports whether a start failed because processes of a
// killed server on the same directory still hold its shared memory
// (PostgreSQL's FATAL "pre-existing shared memory block ... is still in
// use", which the error carries from the server's log).
func shmStillAttached(err error) bool {
	return err != nil && strings.Contains(err.Error(), "pre-existing shared memory block")
}

func initialized(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "PG_VERSION"))
	return err == nil
}

// makeDataDir creates dir itself as 0700, as postgres demands, but any
// missing parents as 0755 so that an unprivileged server user can reach it.
func makeDataDir(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("pgtmp: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("pgtmp: %w", err)
	}
	return nil
}

// create fills the empty data directory dir: a new cluster, or a copy of
// the primary for a standby.
func create(ctx context.Context, bin, dir string, acct *account, opts Options, log *slog.Logger) error {
	if opts.Standby != nil {
		return baseBackup(ctx, bin, dir, acct, *opts.Standby, opts.Fast, log)
	}
	return initdb(ctx, bin, dir, acct, opts.Fast, log)
}

func initdb(ctx context.Context, bin, dir string, acct *account, fast bool, log *slog.Logger) error {
	args := []string{"-D", dir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"}
	if fast {
		// Skipping initdb's final fsync saves most of its run time.
		args = append(args, "--no-sync")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), args...)
	cmd.Dir = dir // our own working directory may be unreachable for acct
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: acct.credential()}
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgtmp: initdb %s: %w\n%s", dir, err, out)
	}
	log.Info("PostgreSQL data directory initialized", "dir", dir, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// baseBackup copies the server at s.Primary into dir with pg_basebackup,
// which also creates the replication slot s.Name there and writes the
// standby settings (-R): standby.signal, and primary_conninfo and
// primary_slot_name in postgresql.auto.conf. primary_conninfo keeps every
// connection option given here, so the standby streams from s.Primary
// under the application_name s.Name.
func baseBackup(ctx context.Context, bin, dir string, acct *account, s Standby, fast bool, log *slog.Logger) error {
	host, port, err := net.SplitHostPort(s.Primary)
	if err != nil {
		return fmt.Errorf("pgtmp: standby of %q: %w", s.Primary, err)
	}
	conninfo := fmt.Sprintf("host=%s port=%s user=postgres application_name=%s", host, port, s.Name)
	args := []string{"-D", dir, "-d", conninfo, "-R", "-C", "-S", s.Name, "-X", "stream", "--checkpoint=fast"}
	if fast {
		args = append(args, "--no-sync")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "pg_basebackup"), args...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: acct.credential()}
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgtmp: pg_basebackup from %s into %s: %w\n%s", s.Primary, dir, err, out)
	}
	// The primary's own log came along with its data directory.
	if err := os.Remove(filepath.Join(dir, "postgres.log")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("pgtmp: %w", err)
	}
	log.Info("PostgreSQL standby copied", "dir", dir, "primary", s.Primary, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// clearStalePid handles a postmaster.pid left by a server that was killed.
// postgres removes it itself when the recorded pid is dead, but refuses to
// start when the pid has been reused by an unrelated process, which is
// common in containers; so a pid file pointing at a live non-postgres
// process is removed here. A live postgres gets a clear error instead.
func clearStalePid(dir string, log *slog.Logger) error {
	pidFile := filepath.Join(dir, "postmaster.pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return nil // absent, or unreadable: postgres will judge
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return nil
	}
	// Without /proc (macOS) or with the process gone, leave it to postgres.
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil
	}
	argv0, _, _ := strings.Cut(string(cmdline), "\x00")
	if base := filepath.Base(argv0); base == "postgres" || base == "postmaster" || strings.HasPrefix(argv0, "postgres:") {
		return serverStillRunning(dir, pid)
	}
	log.Warn("removing stale postmaster.pid whose pid now belongs to another process", "dir", dir, "pid", pid, "process", argv0)
	if err := os.Remove(pidFile); err != nil {
		return fmt.Errorf("pgtmp: remove stale %s: %w", pidFile, err)
	}
	return nil
}

func serverStillRunning(dir string, pid int) error {
	return fmt.Errorf("pgtmp: a PostgreSQL server (pid %d) is still running on %s, probably left over from an earlier run; "+
		"stop it with `kill -INT %d` and try again", pid, dir, pid)
}

// socketDir returns where postgres puts its unix socket: the data
// directory when the path is short enough, else a new short temporary
// directory (tempDir, to be removed at Stop).
func socketDir(dir string, acct *account) (socket, tempDir string, err error) {
	if len(dir)+len("/.s.PGSQL.65535.lock") <= maxSocketPath {
		return dir, "", nil
	}
	tempDir, err = os.MkdirTemp("", "pgtmp-")
	if err != nil {
		return "", "", fmt.Errorf("pgtmp: socket directory: %w", err)
	}
	if err := acct.chown(tempDir); err != nil {
		removeTemp(tempDir)
		return "", "", err
	}
	return tempDir, tempDir, nil
}

func removeTemp(dir string) {
	if dir != "" {
		_ = os.RemoveAll(dir)
	}
}

// freePort asks the kernel for a free port. Someone else may take it
// before postgres binds it; Start retries in that case.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtmp: pick a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// settingArgs returns the -c options for opts: crash safety off when
// Fast, then opts.Settings in name order.
func settingArgs(opts Options) []string {
	var args []string
	if opts.Fast {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	names := make([]string, 0, len(opts.Settings))
	for name := range opts.Settings {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		args = append(args, "-c", name+"="+opts.Settings[name])
	}
	return args
}

// launch starts postgres on port with the extra arguments settings and
// waits until it accepts connections.
func launch(ctx context.Context, bin, dir, socketDir string, port int, acct *account, settings []string, log *slog.Logger) (*Cluster, error) {
	logPath := filepath.Join(dir, "postgres.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("pgtmp: %w", err)
	}
	defer logFile.Close() // the child keeps its own descriptor
	if err := acct.chown(logPath); err != nil {
		return nil, err
	}
	// The log accumulates across runs of a persistent cluster; only this
	// run's part belongs in an error.
	logStart, err := logFile.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, fmt.Errorf("pgtmp: %w", err)
	}

	args := []string{
		"-D", dir,
		"-p", strconv.Itoa(port),
		"-h", "127.0.0.1",
		"-k", socketDir,
		// Tests run many databases and pools in parallel.
		"-c", "max_connections=300",
	}
	cmd := exec.Command(filepath.Join(bin, "postgres"), append(args, settings...)...)
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// SIGINT when we die is PostgreSQL's fast shutdown; SIGTERM would wait
	// for every client to disconnect, and a developer's open psql session
	// would keep the server alive.
	cmd.SysProcAttr = sysProcAttr(acct, syscall.SIGINT)
	if err := startOnFreshThread(cmd); err != nil {
		return nil, fmt.Errorf("pgtmp: start postgres: %w", err)
	}

	c := &Cluster{dir: dir, port: port, logPath: logPath, log: log, acct: acct, cmd: cmd, exited: make(chan struct{})}
	go func() {
		c.waitErr = cmd.Wait()
		close(c.exited)
	}()
	if err := c.waitReady(ctx); err != nil {
		select {
		case <-c.exited:
		default:
			c.kill()
		}
		tail := logTail(logPath, logStart)
		switch {
		case strings.Contains(tail, "Address already in use"):
			err = fmt.Errorf("%w: %w", errPortInUse, err)
		case strings.Contains(tail, `lock file "postmaster.pid" already exists`):
			err = fmt.Errorf("%w: %w", serverStillRunning(dir, pidFromLockError(tail)), err)
		}
		return nil, fmt.Errorf("pgtmp: start postgres on port %d: %w\n--- %s ---\n%s", port, err, logPath, tail)
	}
	return c, nil
}

// startOnFreshThread runs cmd.Start on a new goroutine. The Linux
// parent-death signal fires when the forking OS thread exits, not the
// process. Threads only exit when a goroutine locked to one
// (runtime.LockOSThread) ends, and a new goroutine never runs on such a
// thread, so this keeps the server from being stopped by an unrelated
// goroutine's exit.
func startOnFreshThread(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	go func() { errc <- cmd.Start() }()
	return <-errc
}

// waitReady polls with real connections until the server answers, exits,
// or readyTimeout passes.
func (c *Cluster) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	var lastErr error
	for {
		attemptCtx, cancelAttempt := context.WithTimeout(ctx, 2*time.Second)
		err := c.ping(attemptCtx)
		cancelAttempt()
		if err == nil {
			return nil
		}
		lastErr = err
		select {
		case <-c.exited:
			return fmt.Errorf("postgres exited during startup: %w", c.exitErr())
		case <-ctx.Done():
			return fmt.Errorf("postgres did not accept connections within %s: %w", readyTimeout, lastErr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ping connects and checks that the server on our port is ours: a server
// someone else runs on the same port could otherwise answer while ours is
// failing to bind.
func (c *Cluster) ping(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var dataDir string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dataDir); err != nil {
		return err
	}
	if dataDir != c.dir {
		return fmt.Errorf("port %d is served by another PostgreSQL server (data directory %s)", c.port, dataDir)
	}
	return nil
}

// logTail returns up to the last 30 lines written to path since offset.
func logTail(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return err.Error()
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

// pidFromLockError extracts N from postgres's "Is another postmaster (PID N)
// running" hint, or returns 0.
func pidFromLockError(tail string) int {
	_, rest, ok := strings.Cut(tail, "(PID ")
	if !ok {
		return 0
	}
	num, _, _ := strings.Cut(rest, ")")
	pid, _ := strconv.Atoi(num)
	return pid
}

// StartAs starts cmd as the account Start would run a server on the data
// directory dir as, for programs that start PostgreSQL themselves and so
// refuse root as it does (an orchestrator such as Patroni). When this
// process runs as root, dir (which must exist) is handed to that account
// and its parents must be searchable by it. Like StartProcess, cmd gets
// its own process group and on Linux is killed when this process dies;
// what it starts in a session of its own is not.
func StartAs(dir string, cmd *exec.Cmd) error {
	acct, err := serverAccount(dir)
	if err != nil {
		return err
	}
	if err := acct.checkReachable(dir); err != nil {
		return err
	}
	if err := acct.chown(dir); err != nil {
		return err
	}
	cmd.SysProcAttr = sysProcAttr(acct, syscall.SIGKILL)
	return startOnFreshThread(cmd)
}
