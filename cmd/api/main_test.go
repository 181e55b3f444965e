package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/tooling/natstmp"
	"github.com/idemref/payments/internal/tooling/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// The tests in this package run the real binary, built once with the
// failpoints tag so a test can crash it at a chosen point.
var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	buildDir  string
)

func apiBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "api-bin-")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(buildDir, "api")
		out, err := exec.Command("go", "build", "-tags", "failpoints", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = &buildError{err, string(out)}
		}
	})
	if buildErr != nil {
		t.Fatalf("build the api binary: %v", buildErr)
	}
	return binPath
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }

// serverProcess is one running `api serve`.
type serverProcess struct {
	cmd    *exec.Cmd
	base   string // http://127.0.0.1:PORT
	admin  string // the admin listener's http://127.0.0.1:PORT (/metrics, pprof)
	exited chan struct{}
	mu     sync.Mutex
	logs   bytes.Buffer
}

// startServer runs `api serve` on a free port against databaseURL and
// returns once it listens. extraEnv adds variables such as FAILPOINTS.
func startServer(t *testing.T, databaseURL string, extraEnv ...string) *serverProcess {
	t.Helper()
	cmd := exec.Command(apiBinary(t), "serve")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+databaseURL, "ADDR=127.0.0.1:0", "ADMIN_ADDR=127.0.0.1:0", "NATS_URL="+natsURLFor(t, databaseURL))
	cmd.Env = append(cmd.Env, extraEnv...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &serverProcess{cmd: cmd, exited: make(chan struct{})}
	listening := make(chan string, 1)
	go func() {
		scanner := bufio.NewScanner(stderr)
		for scanner.Scan() {
			line := scanner.Bytes()
			p.mu.Lock()
			p.logs.Write(line)
			p.logs.WriteByte('\n')
			p.mu.Unlock()
			var entry struct{ Msg, Addr string }
			if json.Unmarshal(line, &entry) == nil {
				switch {
				case strings.HasPrefix(entry.Msg, "admin listening"):
					// Logged before "listening", whose channel send
					// publishes it to the test.
					p.admin = "http://" + entry.Addr
				case entry.Msg == "listening":
					listening <- entry.Addr
				}
			}
		}
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			p.mu.Lock()
			t.Logf("server logs:\n%s", p.logs.String())
			p.mu.Unlock()
		}
	})
	select {
	case addr := <-listening:
		p.base = "http://" + addr
	case <-p.exited:
		t.Fatalf("server exited before listening:\n%s", p.logs.String())
	case <-time.After(30 * time.Second):
		t.Fatal("server did not start listening within 30s")
	}
	return p
}

// Each test database has its own embedded NATS server with JetStream,
// started in this test process the first time a server process needs it:
// the processes of one test share it, and it outlives each of them, as a
// real broker outlives the services it serves. No two tests share one.
var (
	natsMu      sync.Mutex
	natsServers = map[string]*natstmp.Server{}
)

func natsURLFor(t *testing.T, databaseURL string) string {
	t.Helper()
	natsMu.Lock()
	defer natsMu.Unlock()
	if ns, ok := natsServers[databaseURL]; ok {
		return ns.URL()
	}
	ns, err := natstmp.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	natsServers[databaseURL] = ns
	t.Cleanup(func() {
		natsMu.Lock()
		delete(natsServers, databaseURL)
		natsMu.Unlock()
		ns.Shutdown()
	})
	return ns.URL()
}

// killedBySIGKILL waits for the process to exit and reports whether a
// SIGKILL ended it.
func (p *serverProcess) killedBySIGKILL(t *testing.T) bool {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("server did not exit")
	}
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// runTenantCreate runs `api tenant create` and returns the key it printed on
// its last line.
func runTenantCreate(t *testing.T, databaseURL, name string) string {
	t.Helper()
	cmd := exec.Command(apiBinary(t), "tenant", "create", name)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+databaseURL)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tenant create: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

type response struct {
	status int
	header http.Header
	body   []byte
}

var client = &http.Client{Timeout: 30 * time.Second}

func postOrder(base, apiKey, idemKey, body string) (response, error) {
	return post(base, apiKey, "/v1/orders", idemKey, body)
}

func post(base, apiKey, path, idemKey, body string) (response, error) {
	return postWith(base, apiKey, path, idemKey, body, "", "")
}

// postWith is post with one more request header, if header is not "".
func postWith(base, apiKey, path, idemKey, body, header, value string) (response, error) {
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", idemKey)
	if header != "" {
		req.Header.Set(header, value)
	}
	return do(req)
}

// do sends req and reads the whole response.
func do(req *http.Request) (response, error) {
	res, err := client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return response{res.StatusCode, res.Header, b}, err
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
