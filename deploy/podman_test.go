package deploy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemref/payments/internal/tooling/natstmp"
	"github.com/idemref/payments/internal/tooling/testdb"
)

// The image runs in a real container runtime: Podman with runc. Where
// neither is installed the test skips, except on CI (CI set), where .ci/run
// installs both and a missing one is a failure.
func requirePodman(t *testing.T) {
	t.Helper()
	missing := ""
	if _, err := exec.LookPath("podman"); err != nil {
		missing = "podman"
	} else if !haveRunc() {
		missing = "runc"
	}
	if missing == "" {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is not installed: on CI the image must be run (.ci/run installs podman and runc)", missing)
	}
	t.Skipf("%s is not installed: apt-get install podman runc to build and run the image", missing)
}

func haveRunc() bool {
	if _, err := exec.LookPath("runc"); err == nil {
		return true
	}
	for _, p := range []string{"/usr/sbin/runc", "/usr/bin/runc", "/usr/local/bin/runc", "/usr/local/sbin/runc"} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// podman runs podman with the two settings a sandboxed machine needs and
// an ordinary one accepts: runc as the runtime (crun refuses cgroups in
// hybrid mode), and no default ulimits (setting them needs
// CAP_SYS_RESOURCE, which a sandbox may drop), both in a containers.conf
// of the test's own, so that the recipe's plain podman commands use them
// too; nothing of the machine's configuration changes.
type podman struct {
	env []string
}

func newPodman(t *testing.T) *podman {
	t.Helper()
	conf := filepath.Join(t.TempDir(), "containers.conf")
	if err := os.WriteFile(conf, []byte("[containers]\ndefault_ulimits = []\n[engine]\nruntime = \"runc\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &podman{env: append(os.Environ(), "CONTAINERS_CONF="+conf)}
}

func (p *podman) command(args ...string) *exec.Cmd {
	cmd := exec.Command("podman", append([]string{"--runtime", "runc"}, args...)...)
	cmd.Env = p.env
	return cmd
}

// run runs podman and returns its standard output; a failure ends the
// test with what podman printed.
func (p *podman) run(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := p.command(args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("podman %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// quiet runs podman for a cleanup, ignoring what it says.
func (p *podman) quiet(args ...string) {
	cmd := p.command(args...)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	_ = cmd.Run()
}

// hardened are the podman run options of a pod the manifests describe:
// the host's network (the test's PostgreSQL and NATS listen on
// 127.0.0.1), a read-only root file system without even a writable /tmp
// (the binary writes no file), no capability, no privilege escalation.
var hardened = []string{"--network=host", "--read-only", "--read-only-tmpfs=false", "--cap-drop=ALL", "--security-opt=no-new-privileges"}

// image is what make image built.
type image struct {
	name    string            // without a tag
	tag     string            // the version tag
	ref     string            // name:tag
	version string            // api version's version line
	bin     string            // make image's BIN: the binary, its SBOM, image.tag
	labels  map[string]string // the image's labels
}

// buildImage runs make image, as a developer does, under a name of the
// test's own and with the build context in a temporary folder, and removes
// the image when the test ends.
func buildImage(t *testing.T, p *podman) image {
	t.Helper()
	name := "localhost/payments-api-test-" + randomHex(t)
	bin := t.TempDir()
	cmd := exec.Command("make", "-C", "..", "--no-print-directory", "image", "IMAGE="+name, "BIN="+bin, "CONTAINER=podman --runtime runc")
	cmd.Env = p.env
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	t.Logf("make image (%v): %s", time.Since(start).Round(time.Second), lastLine(string(out)))

	var inspected []struct {
		ID       string `json:"Id"`
		RepoTags []string
		Config   struct {
			User       string
			Entrypoint []string
			Cmd        []string
			Labels     map[string]string
		}
	}
	if err := json.Unmarshal([]byte(p.run(t, "image", "inspect", name+":latest")), &inspected); err != nil || len(inspected) != 1 {
		t.Fatalf("podman image inspect %s:latest: %v (%d images)", name, err, len(inspected))
	}
	img := inspected[0]
	// By name, not by id: the test's tags go, an image someone else
	// tagged stays.
	t.Cleanup(func() {
		for _, tag := range img.RepoTags {
			if strings.HasPrefix(tag, name+":") {
				p.quiet("rmi", tag)
			}
		}
	})
	t.Logf("podman image ls:\n%s", p.run(t, "image", "ls", name))
	st, err := os.Stat(filepath.Join(bin, "image", "api"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ls -l: %d bytes %s", st.Size(), filepath.Join(bin, "image", "api"))

	// What the image says about itself: api version, the OCI labels and
	// the tags agree.
	version := parseVersion(t, p.run(t, append(append([]string{"run", "--rm"}, hardened...), name+":latest", "version")...))
	labels := img.Config.Labels
	for label, want := range map[string]string{
		"org.opencontainers.image.version":  version["version"],
		"org.opencontainers.image.revision": version["revision"],
	} {
		if labels[label] != want {
			t.Errorf("label %s = %q, want %q as api version prints it", label, labels[label], want)
		}
	}
	if _, err := time.Parse(time.RFC3339, labels["org.opencontainers.image.created"]); err != nil {
		t.Errorf("label org.opencontainers.image.created = %q: %v", labels["org.opencontainers.image.created"], err)
	}
	tag := regexp.MustCompile(`[^A-Za-z0-9_.-]`).ReplaceAllString(version["version"], "-")
	if !regexp.MustCompile(`^[A-Za-z0-9_]`).MatchString(tag) {
		tag = "dev"
	}
	ref := name + ":" + tag
	t.Cleanup(func() { p.quiet("rmi", ref+".sbom") }) // the SBOM's image, a tag of its own
	if !slices.Contains(img.RepoTags, ref) || !slices.Contains(img.RepoTags, name+":latest") {
		t.Errorf("the image is tagged %q, want %s and latest", img.RepoTags, ref)
	}
	if u, _, _ := strings.Cut(img.Config.User, ":"); u == "" || u == "0" || strings.Trim(u, "0123456789") != "" {
		t.Errorf("the image's user is %q, want a numeric non-root id", img.Config.User)
	}
	if len(img.Config.Entrypoint) != 1 || filepath.Base(img.Config.Entrypoint[0]) != "api" || strings.Join(img.Config.Cmd, " ") != "serve" {
		t.Errorf("entrypoint %q, command %q: want api and serve", img.Config.Entrypoint, img.Config.Cmd)
	}
	t.Logf("api version (from the image):\n%s", formatVersion(version))
	return image{name: name, tag: tag, ref: ref, version: version["version"], bin: bin, labels: labels}
}

// TestImage builds the image with make image and runs it in Podman with
// podman run (migrate up, tenant create, serve: an order and its replay);
// pushes it and its SBOM to a local OCI layout and reads them back; and
// runs docs/deployment.md's recipe word for word (the dev overlay under
// podman kube play: an order and its replay).
func TestImage(t *testing.T) {
	requirePodman(t)
	p := newPodman(t)
	img := buildImage(t, p)
	t.Run("run", func(t *testing.T) { testPodmanRun(t, p, img) })
	t.Run("push", func(t *testing.T) { testPush(t, p, img) })
	t.Run("recipe", func(t *testing.T) { testRecipe(t, p, img) })
}

// testPodmanRun: api migrate up and api serve from the image, hardened as
// the manifests run it, against an empty database and an embedded NATS.
func testPodmanRun(t *testing.T, p *podman, img image) {
	dbURL := testdb.CreateEmptyDatabase(t)
	natsURL := startNATS(t)
	mounts := socketMounts(t, dbURL)
	podmanRun := func(env map[string]string, args ...string) string {
		cmd := append(append([]string{"run", "--rm"}, hardened...), mounts...)
		for k, v := range env {
			cmd = append(cmd, "-e", k+"="+v)
		}
		return p.run(t, append(append(cmd, img.ref), args...)...)
	}
	podmanRun(map[string]string{"DATABASE_URL": dbURL}, "migrate", "up")
	key := lastLine(podmanRun(map[string]string{"DATABASE_URL": dbURL}, "tenant", "create", "podman"))

	port, adminPort := freePort(t), freePort(t)
	name := "payments-api-test-" + randomHex(t)
	args := append(append([]string{"run", "-d", "--name", name}, hardened...), mounts...)
	for k, v := range map[string]string{
		"DATABASE_URL": dbURL, "NATS_URL": natsURL, "ADDR": fmt.Sprintf("127.0.0.1:%d", port),
		"ADMIN_ADDR":     fmt.Sprintf("127.0.0.1:%d", adminPort),
		"SHUTDOWN_GRACE": "1s",
	} {
		args = append(args, "-e", k+"="+v)
	}
	p.run(t, append(args, img.ref)...) // the image's command: serve
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := p.command("logs", name).CombinedOutput()
			t.Logf("podman logs %s:\n%s", name, out)
		}
		p.quiet("rm", "-f", "-t", "0", name)
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitReady(t, base+"/readyz")
	order := createAndReplay(t, base, key, dbURL, "podman-run")
	t.Logf("podman run: order %s", order)

	// /metrics, on the admin listener only, says which build runs.
	checkAdmin(t, base, fmt.Sprintf("http://127.0.0.1:%d", adminPort), img)
	// SIGTERM reaches the binary as PID 1 and it exits cleanly.
	p.run(t, "stop", "-t", "30", name)
	if code := strings.TrimSpace(p.run(t, "inspect", "--format", "{{.State.ExitCode}}", name)); code != "0" {
		t.Errorf("api serve exited %s on SIGTERM, want 0", code)
	}
}

// checkAdmin: the admin listener serves /metrics, which names the image's
// build, and the profiler; the public listener serves neither (G6).
func checkAdmin(t *testing.T, base, admin string, img image) {
	t.Helper()
	if m := get(t, admin+"/metrics"); !strings.Contains(m, `version="`+img.version+`"`) {
		t.Errorf("the admin listener's /metrics has no payments_build_info with version %q", img.version)
	}
	if p := get(t, admin+"/debug/pprof/goroutine?debug=1"); !strings.Contains(p, "goroutine profile") {
		t.Errorf("the admin listener's /debug/pprof/goroutine answered %.200q", p)
	}
	for _, path := range []string{"/metrics", "/debug/pprof/"} {
		res, err := client.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		if res.StatusCode != http.StatusNotFound {
			t.Errorf("the public listener's %s = %d, want 404", path, res.StatusCode)
		}
	}
}

// createAndReplay creates an order with an idempotency key, sends the
// same request again, and checks the second answer is the first replayed
// and the database holds the order once. It returns the order's JSON.
func createAndReplay(t *testing.T, base, apiKey, dbURL, reference string) string {
	t.Helper()
	body := fmt.Sprintf(`{"reference":%q,"customer_id":"cus_1","amount":1250,"currency":"EUR"}`, reference)
	idemKey := "order-" + reference
	first := postOrder(t, base, apiKey, idemKey, body)
	second := postOrder(t, base, apiKey, idemKey, body)
	if first.status != http.StatusCreated || second.status != http.StatusCreated {
		t.Fatalf("create and its retry: %d %s, then %d %s; want 201 twice", first.status, first.body, second.status, second.body)
	}
	if got := second.header.Get("Idempotent-Replayed"); got != "true" {
		t.Errorf("the retry's Idempotent-Replayed = %q, want true", got)
	}
	if first.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("the first answer says it was replayed")
	}
	if !bytes.Equal(first.body, second.body) {
		t.Errorf("the replay differs from the first answer:\n%s\n%s", first.body, second.body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM orders WHERE reference = $1", reference).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("orders with reference %s: %d rows, want 1", reference, n)
	}
	return strings.TrimSpace(string(first.body))
}

type response struct {
	status int
	header http.Header
	body   []byte
}

var client = &http.Client{Timeout: 30 * time.Second}

func postOrder(t *testing.T, base, apiKey, idemKey, body string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/orders", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", idemKey)
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST /v1/orders: %v", err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{res.StatusCode, res.Header, b}
}

func get(t *testing.T, url string) string {
	t.Helper()
	res, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, res.StatusCode, b)
	}
	return string(b)
}

// waitReady polls a readiness URL until it answers 200.
func waitReady(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	last := "no answer"
	for time.Now().Before(deadline) {
		res, err := client.Get(url)
		if err == nil {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%d %s", res.StatusCode, b)
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s was not ready within 90s: %s", url, last)
}

// startNATS runs an embedded NATS server with JetStream on 127.0.0.1, as
// the cmd/api tests do, for the test's length.
func startNATS(t *testing.T) string {
	t.Helper()
	ns, err := natstmp.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	return ns.URL()
}

// socketDir is the Unix socket directory the database URL names (a
// TEST_DATABASE_URL may), or "" for TCP.
func socketDir(t *testing.T, dbURL string) string {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(cfg.Host, "/") {
		return cfg.Host
	}
	return ""
}

// socketMounts are the podman run options that let a container reach the
// database's Unix socket, if it listens on one.
func socketMounts(t *testing.T, dbURL string) []string {
	if dir := socketDir(t, dbURL); dir != "" {
		return []string{"-v", dir + ":" + dir}
	}
	return nil
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func randomHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// parseVersion reads what api version printed: name -> value.
func parseVersion(t *testing.T, out string) map[string]string {
	t.Helper()
	fields := map[string]string{}
	for line := range strings.Lines(out) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), " ")
		if ok && !strings.HasPrefix(name, "(") {
			fields[name] = strings.TrimSpace(value)
		}
	}
	for _, name := range []string{"version", "revision", "time", "modified", "go"} {
		if fields[name] == "" {
			t.Fatalf("api version printed no %s line:\n%s", name, out)
		}
	}
	return fields
}

func formatVersion(v map[string]string) string {
	var b strings.Builder
	for _, name := range []string{"version", "revision", "time", "modified", "go"} {
		fmt.Fprintf(&b, "  %-9s %s\n", name, v[name])
	}
	return b.String()
}
