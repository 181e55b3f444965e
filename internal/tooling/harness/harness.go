// Package harness starts the real processes that the load benchmark and the
// chaos harness run against: it builds the module's commands, runs them
// with their JSON logs in files, and reads where they listen from those
// logs. Only those two commands import it.
package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// ModuleRoot is the directory of the go.mod of the module we are in.
func ModuleRoot() (string, error) {
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

// Build compiles pkg into dir/name with the given build tags.
func Build(root, dir, name, pkg, tags string) (string, error) {
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

// Process is one real child process whose JSON log goes to a file.
type Process struct {
	Name    string
	cmd     *exec.Cmd
	LogPath string
	exited  chan struct{}
}

// Spawn runs bin with args and env (added to ours), logging to
// dir/name.log, and returns at once.
func Spawn(dir, name, bin string, args, env []string) (*Process, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, cmd: cmd, LogPath: logPath, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// StartProcess spawns bin (Spawn) and waits until its log has a line with
// msg whose "addr" it returns: both the API and the simulator log where
// they listen.
func StartProcess(ctx context.Context, dir, name, bin string, args, env []string, msg string) (*Process, string, error) {
	p, err := Spawn(dir, name, bin, args, env)
	if err != nil {
		return nil, "", err
	}
	logPath := p.LogPath
	deadline := time.After(30 * time.Second)
	for {
		if addr := findAddr(logPath, msg); addr != "" {
			return p, addr, nil
		}
		select {
		case <-p.exited:
			return nil, "", fmt.Errorf("%s exited before listening; its log:\n%s", name, Tail(logPath))
		case <-deadline:
			p.Stop()
			return nil, "", fmt.Errorf("%s did not listen within 30s; its log:\n%s", name, Tail(logPath))
		case <-ctx.Done():
			p.Stop()
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

// Tail is the last 20 lines of the log at path, for an error message.
func Tail(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

// ErrorLines returns the last n lines of a JSON log at level ERROR.
func ErrorLines(path string, n int) []string {
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

// Stop ends the process gracefully (SIGTERM), or kills it after 15 s.
func (p *Process) Stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// CreateTenant runs `api tenant create NAME` and returns the API key it
// prints on its last line.
func CreateTenant(bin, databaseURL, name string) (string, error) {
	cmd := exec.Command(bin, "tenant", "create", name)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+databaseURL)
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("api tenant create: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], nil
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Kill ends the process at once (SIGKILL), as a crash would, and waits
// for it.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// Exited is closed once the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }
