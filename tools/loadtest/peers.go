package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/idemref/payments/internal/tooling/harness"
)

// The peers (P8): what a team would run instead of this service's key,
// around the same order insert on the same PostgreSQL, measured in the
// same rounds:
//
//	fiber        Fiber's middleware/idempotency with its Redis storage
//	             (github.com/gofiber/fiber/v2, github.com/gofiber/storage/redis/v3),
//	             tools/peers/fiberpeer, against a private redis-server
//	fiber-plain  the same Fiber app and handler without the middleware:
//	             the peer's own baseline, as baseline is ours
//	claim-first  the classic shape over HTTP: the key claimed in progress,
//	             the order, the key updated to completed, in one
//	             transaction (POST /v1/_claimfirst/orders, -tags loadtest)
//
// fiber-plain is not a peer: it is what fiber's ratio is taken against.
const (
	peerFiber      = "fiber"
	peerClaimFirst = "claim-first"
)

// peerNames are the peers measured, in the order they are reported.
var peerNames = []string{peerFiber, peerClaimFirst}

// fieldName is a peer's name in the summary line: claim-first is claim_first.
func fieldName(peer string) string { return strings.ReplaceAll(peer, "-", "_") }

// redisServer is Debian's redis-server, started on a free port in a
// temporary directory with its built-in defaults otherwise (snapshots, no
// append-only file): the configuration Fiber's storage is shown with.
type redisServer struct {
	cmd    *exec.Cmd
	addr   string
	exited chan struct{}
}

// redisPackage is what to install when redis-server is missing.
const redisPackage = "redis-server"

func startRedis(ctx context.Context, dir string) (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("the Fiber peer needs redis-server on PATH (Debian: apt-get install %s): %w", redisPackage, err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	r := &redisServer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), exited: make(chan struct{})}
	logPath := filepath.Join(dir, "redis.log")
	r.cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--daemonize", "no", "--logfile", logPath)
	if err := r.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	go func() {
		_ = r.cmd.Wait()
		close(r.exited)
	}()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if err := r.ping(); err == nil {
			return r, nil
		} else if time.Now().After(deadline) {
			r.stop()
			return nil, fmt.Errorf("redis-server on %s did not answer PING within 15s (%w); its log:\n%s", r.addr, err, harness.Tail(logPath))
		}
		select {
		case <-r.exited:
			return nil, fmt.Errorf("redis-server exited at start; its log:\n%s", harness.Tail(logPath))
		case <-ctx.Done():
			r.stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ping sends PING in the Redis protocol and expects +PONG.
func (r *redisServer) ping() error {
	conn, err := net.DialTimeout("tcp", r.addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

func (r *redisServer) stop() {
	_ = r.cmd.Process.Signal(os.Interrupt)
	select {
	case <-r.exited:
	case <-time.After(10 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.exited
	}
}

// freePort asks the kernel for a port no one listens on.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// buildFiberPeer compiles tools/peers/fiberpeer, a module of its own.
func buildFiberPeer(root, work string) (string, error) {
	return harness.Build(filepath.Join(root, "tools", "peers"), work, "fiberpeer", "./fiberpeer", "")
}

// fiberEnv is the Fiber peer's environment: the load API's database URL
// (the same pool size), the private Redis, the benchmark's tenant and API
// key.
func fiberEnv(env *environment, failpoint string) []string {
	out := []string{"DATABASE_URL=" + env.apiDBURL, "REDIS_ADDR=" + env.redis.addr, "PEER_TENANT_ID=" + env.tenantID,
		"PEER_API_KEY=" + env.apiKey, "PEER_ADDR=127.0.0.1:0"}
	if failpoint != "" {
		out = append(out, "PEER_FAILPOINT="+failpoint)
	}
	return out
}

// fiberCreate sends creates to the Fiber peer, behind its middleware
// (withKey, a fresh UUID key each: Fiber's default validation wants 36
// characters) or not: every answer must be an execution (201, not marked
// replayed), and the orders table must grow by exactly their number.
func (l *load) fiberCreate(ctx context.Context, name string, withKey bool, workers int, d time.Duration) (outcome, error) {
	path := "/plain/orders"
	if withKey {
		path = "/idem/orders"
	}
	url := l.base + path
	tr := func(t *vegeta.Target) error {
		key := ""
		if withKey {
			key = uuid.NewString()
		}
		t.Method, t.URL, t.Header, t.Body = http.MethodPost, url, l.headers(key), orderBody(l.fresh("ref"))
		return nil
	}
	var out outcome
	err := l.checkRows(ctx, name, countOrders, func() (int, error) {
		var err error
		out, err = l.attack(name, workers, d, tr, status(http.StatusCreated, false), false)
		return out.ok, err
	})
	return out, err
}

// startPeers starts the private Redis and the Fiber peer, and builds the
// API with failpoints for the crash test. The claim-first peer is a route
// of the load API.
func startPeers(ctx context.Context, env *environment, root string) error {
	if err := env.db.QueryRow(ctx, `SELECT id::text FROM tenants WHERE name = 'loadtest'`).Scan(&env.tenantID); err != nil {
		return fmt.Errorf("the benchmark's tenant: %w", err)
	}
	var err error
	if env.fiberBin, err = buildFiberPeer(root, env.workDir); err != nil {
		return err
	}
	if env.crashAPIBin, err = harness.Build(root, env.workDir, "api-failpoints", "./cmd/api", "loadtest failpoints"); err != nil {
		return err
	}
	if env.redis, err = startRedis(ctx, env.workDir); err != nil {
		return err
	}
	var addr string
	env.fiber, addr, err = harness.StartProcess(ctx, env.workDir, "fiberpeer", env.fiberBin, nil, fiberEnv(env, ""), "listening")
	if err != nil {
		return err
	}
	env.fiberURL = "http://" + addr
	return nil
}
