package clienttest

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/tooling/testkit"
)

// The TypeScript client (G10) is tested here, against the same real server
// as the Go client's tests, because its tests must see what the server did:
// the node --test suites in clients/typescript/test drive the client, and
// this test serves them real stacks and what happened on them.
//
// A suite asks the control server (PAYMENTS_TEST_CONTROL) for a stack: a
// server of its own on its own database, with its own processor simulator
// and a tenant, behind a proxy that plays the faults the suite scripts (the
// faultTransport of the Go client's tests: an answer dropped after the
// server committed, a gateway's 503 or 429). It then asks for the stack's
// state: the orders, key and payment rows, as the database holds them, the
// requests the proxy saw, and the simulator's calls.

// tsDir is the package, from this package's directory.
var tsDir = filepath.Join("..", "..", "clients", "typescript")

// lookPath finds a program on PATH; on CI its absence fails the test.
func lookPath(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is not installed: %v", name, err)
	}
	t.Skipf("%s is not installed: %v", name, err)
	return ""
}

// TestTypeScriptClient (G10) compiles the TypeScript client with the pinned
// tsc (--strict, from tsconfig.json), checks what npm would publish, and
// runs its node --test suites against real servers.
func TestTypeScriptClient(t *testing.T) {
	t.Parallel()
	tsc := testkit.NodeTool(t, filepath.Join("..", ".."), "tsc")
	node := lookPath(t, "node")
	pkg := buildTypeScript(t, tsc)

	t.Run("PackListsWhatIsPublished", func(t *testing.T) {
		checkPackList(t, lookPath(t, "npm"), pkg)
	})
	t.Run("NoRuntimeDependencies", func(t *testing.T) {
		checkNoDependencies(t, pkg)
	})
	t.Run("SuitesAgainstTheServer", func(t *testing.T) {
		runSuites(t, node, pkg)
	})
}

// buildTypeScript copies the package's sources into a temporary directory
// and compiles them there: the work tree gets no dist/, and nothing stale
// from an earlier build there can be tested or listed.
func buildTypeScript(t *testing.T, tsc string) string {
	t.Helper()
	dir := t.TempDir()
	err := filepath.WalkDir(tsDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(tsDir, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if rel == "dist" || rel == "node_modules" {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dir, rel), 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, rel), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cmd := exec.CommandContext(t.Context(), tsc, "-p", ".", "--pretty", "false")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tsc -p clients/typescript: %v\n%s", err, out)
	}
	t.Logf("tsc compiled the package in %v", time.Since(start).Round(time.Millisecond))
	return dir
}

// checkPackList: npm pack --dry-run lists exactly what a release
// publishes: the compiled modules and their declarations, one pair per
// source file, the README, the licence and package.json; no source, no
// test, no configuration.
func checkPackList(t *testing.T, npm, pkg string) {
	cmd := exec.CommandContext(t.Context(), npm, "pack", "--dry-run", "--json", "--ignore-scripts")
	cmd.Dir = pkg
	cmd.Env = append(os.Environ(), "NPM_CONFIG_UPDATE_NOTIFIER=false", "NPM_CONFIG_FUND=false", "NPM_CONFIG_AUDIT=false")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("npm pack --dry-run: %v\n%s", err, out)
	}
	var packs []struct {
		Name  string `json:"name"`
		Files []struct {
			Path string `json:"path"`
		} `json:"files"`
	}
	if err := json.Unmarshal(out, &packs); err != nil || len(packs) != 1 {
		t.Fatalf("npm pack --dry-run --json: %v\n%s", err, out)
	}
	var got []string
	for _, f := range packs[0].Files {
		got = append(got, f.Path)
	}
	want := []string{"LICENSE", "README.md", "package.json"}
	sources, err := filepath.Glob(filepath.Join(tsDir, "src", "*.ts"))
	if err != nil || len(sources) == 0 {
		t.Fatalf("no sources in %s/src: %v", tsDir, err)
	}
	for _, s := range sources {
		base := strings.TrimSuffix(filepath.Base(s), ".ts")
		want = append(want, "dist/"+base+".js", "dist/"+base+".d.ts")
	}
	slices.Sort(got)
	slices.Sort(want)
	t.Logf("npm pack --dry-run, %s:\n  %s", packs[0].Name, strings.Join(got, "\n  "))
	if !slices.Equal(got, want) {
		t.Errorf("npm pack would publish\n  %s\nwant exactly\n  %s\n(the files field of clients/typescript/package.json)",
			strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// importSpec finds the module specifiers of static and dynamic imports
// and re-exports in compiled JavaScript.
var importSpec = regexp.MustCompile(`(?m)(?:^\s*(?:import|export)\b[^;]*?\bfrom\s*|\bimport\s*\(\s*|^\s*import\s+)["']([^"']+)["']`)

// checkNoDependencies: package.json declares no dependency of any kind,
// and the compiled modules import only each other: the client runs on the
// platform's fetch, AbortSignal and crypto.
func checkNoDependencies(t *testing.T, pkg string) {
	data, err := os.ReadFile(filepath.Join(pkg, "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	var manifest map[string]any
	if err := json.Unmarshal(data, &manifest); err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"dependencies", "peerDependencies", "optionalDependencies", "bundleDependencies", "bundledDependencies"} {
		if _, ok := manifest[field]; ok {
			t.Errorf("clients/typescript/package.json has %q: the client has no runtime dependencies", field)
		}
	}
	modules, err := filepath.Glob(filepath.Join(pkg, "dist", "*.js"))
	if err != nil || len(modules) == 0 {
		t.Fatalf("no compiled modules in dist/: %v", err)
	}
	imports := 0
	for _, m := range modules {
		src, err := os.ReadFile(m)
		if err != nil {
			t.Fatal(err)
		}
		for _, spec := range importSpec.FindAllStringSubmatch(string(src), -1) {
			imports++
			if !strings.HasPrefix(spec[1], "./") {
				t.Errorf("dist/%s imports %q: only the package's own modules may be imported", filepath.Base(m), spec[1])
			}
		}
	}
	if imports == 0 {
		t.Error("found no import in dist/: the pattern no longer matches tsc's output")
	}
}

// runSuites runs the node --test suites with a control server, and serves
// their stacks from this goroutine (setup may stop the test).
func runSuites(t *testing.T, node, pkg string) {
	suites, err := filepath.Glob(filepath.Join(pkg, "test", "*.test.mjs"))
	if err != nil || len(suites) == 0 {
		t.Fatalf("no node --test suites in clients/typescript/test: %v", err)
	}
	ctl := newControl()
	srv := httptest.NewServer(ctl)
	t.Cleanup(srv.Close)
	defer close(ctl.done)

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	args := append([]string{"--test", "--test-reporter=spec", "--test-concurrency=" + strconv.Itoa(len(suites))}, suites...)
	cmd := exec.CommandContext(ctx, node, args...)
	cmd.Dir = pkg
	cmd.Env = append(os.Environ(), "PAYMENTS_TEST_CONTROL="+srv.URL, "NO_COLOR=1")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for {
		select {
		case req := <-ctl.requests:
			req.reply <- ctl.add(t, req.to)
		case err := <-exited:
			t.Logf("node --test (%v):\n%s", time.Since(start).Round(time.Millisecond), out.String())
			if err != nil {
				t.Fatalf("node --test failed: %v (its output is above)", err)
			}
			return
		}
	}
}

// control serves the suites' stacks.
type control struct {
	requests chan stackRequest
	done     chan struct{} // closed when the test no longer serves requests

	mu     sync.Mutex
	stacks map[string]*tsStack
}

type stackRequest struct {
	to    timeouts
	reply chan *tsStack
}

// tsStack is one stack: the server bundle and the proxy the client talks
// to, which plays the bundle's faults.
type tsStack struct {
	id    string
	b     *bundle
	proxy string
}

func newControl() *control {
	return &control{requests: make(chan stackRequest), done: make(chan struct{}), stacks: map[string]*tsStack{}}
}

// add starts a stack: the real server on a database of its own (setup),
// behind a reverse proxy whose transport is the bundle's faultTransport. A
// fault that fails the round trip (cut) becomes a connection closed without
// an answer, as a link failing after the server committed.
func (c *control) add(t *testing.T, to timeouts) *tsStack {
	b := setup(t, to)
	target, err := url.Parse(b.url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport: b.faults,
		ErrorHandler: func(http.ResponseWriter, *http.Request, error) {
			panic(http.ErrAbortHandler) // close the connection, answer nothing
		},
	}
	front := httptest.NewServer(proxy)
	t.Cleanup(front.Close)
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &tsStack{id: "s" + strconv.Itoa(len(c.stacks)+1), b: b, proxy: front.URL}
	c.stacks[s.id] = s
	return s
}

func (c *control) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost && r.URL.Path == "/stacks" {
		c.serveNew(w, r)
		return
	}
	id, action, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/stacks/"), "/")
	c.mu.Lock()
	s := c.stacks[id]
	c.mu.Unlock()
	if s == nil {
		http.Error(w, "no stack "+id, http.StatusNotFound)
		return
	}
	var err error
	switch {
	case r.Method == http.MethodPost && action == "faults":
		err = s.serveFaults(r)
	case r.Method == http.MethodPost && action == "latency":
		var body struct {
			MS int64 `json:"ms"`
		}
		if err = json.NewDecoder(r.Body).Decode(&body); err == nil {
			s.b.sim.SetLatency(time.Duration(body.MS) * time.Millisecond)
		}
	case r.Method == http.MethodGet && action == "state":
		var st tsState
		if st, err = s.state(r.Context()); err == nil {
			writeJSON(w, st)
			return
		}
	default:
		err = fmt.Errorf("no action %s %s", r.Method, action)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// serveNew asks the test's goroutine for a stack with the server's
// timeouts the suite names (default: setup's).
func (c *control) serveNew(w http.ResponseWriter, r *http.Request) {
	var body struct {
		RequestTimeoutMS int64 `json:"request_timeout_ms"`
		LockTimeoutMS    int64 `json:"lock_timeout_ms"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	to := timeouts{request: requestTimeout, lock: lockTimeout}
	if body.RequestTimeoutMS > 0 {
		to.request = time.Duration(body.RequestTimeoutMS) * time.Millisecond
	}
	if body.LockTimeoutMS > 0 {
		to.lock = time.Duration(body.LockTimeoutMS) * time.Millisecond
	}
	req := stackRequest{to: to, reply: make(chan *tsStack, 1)}
	select {
	case c.requests <- req:
	case <-c.done:
		http.Error(w, "the test is over", http.StatusServiceUnavailable)
		return
	}
	var s *tsStack
	select {
	case s = <-req.reply:
	case <-c.done: // setup stopped the test
		http.Error(w, "the test is over", http.StatusServiceUnavailable)
		return
	}
	writeJSON(w, map[string]string{"id": s.id, "url": s.proxy, "api_key": s.b.apiKey})
}

// serveFaults sets the stack's script: one fault per attempt, in order,
// then forever for every later attempt ("" forwards them untouched).
// A fault is "cut" (forward, let the server commit, drop its answer) or
// "status CODE [RETRY-AFTER]" (a gateway's answer; the server sees nothing).
func (s *tsStack) serveFaults(r *http.Request) error {
	var body struct {
		Script  []string `json:"script"`
		Forever string   `json:"forever"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		return err
	}
	script := make([]fault, 0, len(body.Script))
	for _, name := range body.Script {
		f, err := parseFault(name)
		if err != nil {
			return err
		}
		script = append(script, f)
	}
	var forever fault
	if body.Forever != "" {
		var err error
		if forever, err = parseFault(body.Forever); err != nil {
			return err
		}
	}
	s.b.faults.mu.Lock()
	s.b.faults.script = script
	s.b.faults.mu.Unlock()
	s.b.faults.forever(forever)
	return nil
}

func parseFault(name string) (fault, error) {
	f := strings.Fields(name)
	switch {
	case len(f) == 1 && f[0] == "cut":
		return cutAfterCommit, nil
	case len(f) >= 2 && len(f) <= 3 && f[0] == "status":
		code, err := strconv.Atoi(f[1])
		if err != nil {
			return nil, err
		}
		retryAfter := ""
		if len(f) == 3 {
			retryAfter = f[2]
		}
		return status(code, retryAfter), nil
	}
	return nil, fmt.Errorf("no fault %q: want \"cut\" or \"status CODE [RETRY-AFTER]\"", name)
}

// tsState is what a stack's server did, for the suites to assert on.
type tsState struct {
	Orders   []tsOrder   `json:"orders"`
	Keys     []tsKey     `json:"keys"`
	Payments []tsPayment `json:"payments"`
	Attempts []tsAttempt `json:"attempts"` // every request the proxy saw, in order
	SimCalls []tsSimCall `json:"sim_calls"`
}

type tsOrder struct {
	ID        string `json:"id"`
	Reference string `json:"reference"`
}

type tsKey struct {
	Key            string `json:"key"`
	Endpoint       string `json:"endpoint"`
	State          string `json:"state"`
	ResponseStatus *int   `json:"response_status"`
}

type tsPayment struct {
	ID      string `json:"id"`
	OrderID string `json:"order_id"`
	Status  string `json:"status"`
}

type tsAttempt struct {
	Method string `json:"method"`
	Path   string `json:"path"`
	Key    string `json:"key"`
	AtMS   int64  `json:"at_ms"`
}

type tsSimCall struct {
	Path           string `json:"path"`
	IdempotencyKey string `json:"idempotency_key"`
	Executed       bool   `json:"executed"`
	Replayed       bool   `json:"replayed"`
}

// state reads the stack's rows from its database, the proxy's record and
// the simulator's calls.
func (s *tsStack) state(ctx context.Context) (tsState, error) {
	st := tsState{Attempts: []tsAttempt{}, SimCalls: []tsSimCall{}}
	var err error
	if st.Orders, err = collect[tsOrder](ctx, s, `SELECT id::text, reference FROM orders WHERE tenant_id = $1 ORDER BY created_at, id`); err != nil {
		return st, err
	}
	if st.Keys, err = collect[tsKey](ctx, s, `SELECT idem_key, endpoint, state, response_status FROM idempotency_keys WHERE tenant_id = $1 ORDER BY created_at`); err != nil {
		return st, err
	}
	if st.Payments, err = collect[tsPayment](ctx, s, `SELECT id::text, order_id::text, status FROM payments WHERE tenant_id = $1 ORDER BY created_at`); err != nil {
		return st, err
	}
	for _, a := range s.b.faults.seen() {
		st.Attempts = append(st.Attempts, tsAttempt{Method: a.method, Path: a.path, Key: a.key, AtMS: a.at.UnixMilli()})
	}
	for _, c := range s.b.sim.Calls() {
		st.SimCalls = append(st.SimCalls, tsSimCall{Path: c.Path, IdempotencyKey: c.IdempotencyKey, Executed: c.Executed, Replayed: c.Replayed})
	}
	return st, nil
}

// collect reads the tenant's rows of query, its columns in T's field order.
func collect[T any](ctx context.Context, s *tsStack, query string) ([]T, error) {
	rows, err := s.b.pool.Query(ctx, query, s.b.tenantID)
	if err != nil {
		return nil, err
	}
	all, err := pgx.CollectRows(rows, pgx.RowToStructByPos[T])
	if all == nil {
		all = []T{}
	}
	return all, err
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v) // a suite that went away reads nothing
}
