package main

import (
	"bufio"
	"context"
	"encoding/json"
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

	"github.com/idemref/payments/internal/pgtmp"
)

// startDatabase starts a private PostgreSQL in dir with its durability
// defaults (pgtmp without Fast: fsync, synchronous_commit and
// full_page_writes on), creates the database "payments" and checks that
// the settings really are on: a benchmark of writes on a server that does
// not flush them measures nothing worth comparing.
func startDatabase(ctx context.Context, dir string) (*pgtmp.Cluster, map[string]string, error) {
	cluster, err := pgtmp.Start(ctx, pgtmp.Options{Dir: dir})
	if err != nil {
		return nil, nil, err
	}
	conn, err := pgx.Connect(ctx, cluster.URL("postgres"))
	if err != nil {
		_ = cluster.Stop()
		return nil, nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	settings := map[string]string{}
	for _, name := range []string{"server_version", "fsync", "synchronous_commit", "full_page_writes"} {
		var v string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			_ = cluster.Stop()
			return nil, nil, err
		}
		settings[name] = v
	}
	for _, name := range []string{"fsync", "synchronous_commit", "full_page_writes"} {
		if settings[name] != "on" {
			_ = cluster.Stop()
			return nil, nil, fmt.Errorf("PostgreSQL runs with %s=%s; the benchmark needs durability on", name, settings[name])
		}
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE payments"); err != nil {
		_ = cluster.Stop()
		return nil, nil, err
	}
	return cluster, settings, nil
}

// moduleRoot is the directory of the go.mod of the module we are in.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("run the load benchmark from inside the module (make loadtest)")
	}
	return filepath.Dir(gomod), nil
}

// build compiles pkg into dir/name with the given build tags.
func build(root, dir, name, pkg, tags string) (string, error) {
	out := filepath.Join(dir, name)
	args := []string{"build", "-o", out}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %s: %w\n%s", strings.Join(cmd.Args[1:], " "), err, b)
	}
	return out, nil
}

// process is one real child process whose JSON log goes to a file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
}

// startProcess runs bin with args and env (added to ours), logging to
// dir/name.log, and waits until its log has a line with msg whose "addr"
// it returns: both the API and the simulator log where they listen.
func startProcess(ctx context.Context, dir, name, bin string, args, env []string, msg string) (*process, string, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, "", err
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	deadline := time.After(30 * time.Second)
	for {
		if addr := findAddr(logPath, msg); addr != "" {
			return p, addr, nil
		}
		select {
		case <-p.exited:
			return nil, "", fmt.Errorf("%s exited before listening; its log:\n%s", name, tail(logPath))
		case <-deadline:
			p.stop()
			return nil, "", fmt.Errorf("%s did not listen within 30s; its log:\n%s", name, tail(logPath))
		case <-ctx.Done():
			p.stop()
			return nil, "", ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func findAddr(logPath, msg string) string {
	f, err := os.Open(logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var entry struct{ Msg, Addr string }
		if json.Unmarshal(sc.Bytes(), &entry) == nil && entry.Msg == msg && entry.Addr != "" {
			return entry.Addr
		}
	}
	return ""
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

// errorLines returns the last n lines of a JSON log at level ERROR.
func errorLines(path string, n int) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var entry struct{ Level string }
		if json.Unmarshal(sc.Bytes(), &entry) == nil && entry.Level == "ERROR" {
			lines = append(lines, sc.Text())
			if len(lines) > n {
				lines = lines[1:]
			}
		}
	}
	return lines
}

// stop ends the process gracefully (SIGTERM), or kills it after 15 s.
func (p *process) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// memory reads the process's peak and current resident set size, in
// bytes, from /proc (Linux only).
func (p *process) memory() (peak, current int64, err error) {
	status, err := procStatus(p.cmd.Process.Pid)
	if err != nil {
		return 0, 0, err
	}
	kb := func(name string) (int64, error) {
		n, err := strconv.ParseInt(strings.TrimSuffix(status[name], " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse %s in /proc/%d/status: %w", name, p.cmd.Process.Pid, err)
		}
		return n << 10, nil
	}
	if peak, err = kb("VmHWM"); err != nil {
		return 0, 0, err
	}
	current, err = kb("VmRSS")
	return peak, current, err
}

// procStatus reads /proc/PID/status (Linux only) as name: value.
func procStatus(pid int) (map[string]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	fields := map[string]string{}
	for line := range strings.SplitSeq(string(b), "\n") {
		if name, value, ok := strings.Cut(line, ":"); ok {
			fields[name] = strings.TrimSpace(value)
		}
	}
	return fields, nil
}

// createTenant runs `api tenant create NAME` and returns the API key it
// prints on its last line.
func createTenant(bin, databaseURL, name string) (string, error) {
	cmd := exec.Command(bin, "tenant", "create", name)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+databaseURL)
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("api tenant create: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], nil
}
