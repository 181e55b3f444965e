package deploy

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// recipeSection is the heading of docs/deployment.md's recipe.
const recipeSection = "## Run it in Podman: the recipe"

// testRecipe runs docs/deployment.md's recipe as a person would type it,
// every block in order, from the repository's root, with only
// DATABASE_URL given (an empty database of the test's): make image, a
// NATS server, the Podman secret, the migration, the dev overlay under
// podman kube play, a tenant, an order and its replay. The recipe's last
// block, which stops everything, runs at the end, and also when an
// earlier block fails. Between the two the test checks what the recipe
// started: the answers, the order's one row, the container's user and
// read-only root, and the admin listener.
func testRecipe(t *testing.T, p *podman, img image) {
	blocks, err := testkit.ShellBlocks(filepath.Join("..", "docs", "deployment.md"), recipeSection)
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) < 7 {
		t.Fatalf("the recipe has %d blocks: image, broker, secret, migration, serve, tenant, order and its replay, and the teardown", len(blocks))
	}
	for _, port := range []int{18080, 19090, 14222} {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatalf("the recipe needs port %d free (the dev overlay's): %v", port, err)
		}
		l.Close()
	}
	dbURL := testdb.CreateEmptyDatabase(t)
	if socketDir(t, dbURL) != "" {
		t.Fatalf("the recipe's containers reach PostgreSQL over TCP; the test's database is on a Unix socket (%s): set TEST_DATABASE_URL to a TCP URL", socketDir(t, dbURL))
	}
	// The recipe builds localhost/payments-api; the test removes it after
	// unless it was there before.
	existed := p.command("image", "exists", "localhost/payments-api:latest").Run() == nil

	dir := t.TempDir()
	ready, done, logFile := filepath.Join(dir, "ready"), filepath.Join(dir, "done"), filepath.Join(dir, "recipe.log")
	last := len(blocks) - 1
	script := "set -euo pipefail\nrecipe_teardown() {\nset +eu\n" + blocks[last] + "}\ntrap recipe_teardown EXIT\n" +
		strings.Join(blocks[:last], "") +
		"touch \"$RECIPE_READY\"\nwhile [ ! -e \"$RECIPE_DONE\" ]; do sleep 0.2; done\n"
	log, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = ".."
	cmd.Env = append(p.env, "DATABASE_URL="+dbURL, "RECIPE_READY="+ready, "RECIPE_DONE="+done)
	cmd.Stdout, cmd.Stderr = log, log
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	output := func() string { b, _ := os.ReadFile(logFile); return string(b) }
	finish := func() error {
		_ = os.WriteFile(done, nil, 0o600)
		select {
		case err := <-exited:
			return err
		case <-time.After(2 * time.Minute):
			_ = cmd.Process.Kill()
			return fmt.Errorf("the teardown did not end within 2 minutes")
		}
	}
	t.Cleanup(func() {
		if !existed {
			tag, _ := os.ReadFile(filepath.Join("..", "bin", "image.tag"))
			for _, ref := range []string{"latest", strings.TrimSpace(string(tag)), strings.TrimSpace(string(tag)) + ".sbom"} {
				p.quiet("rmi", "localhost/payments-api:"+ref)
			}
		}
	})

	deadline := time.After(10 * time.Minute)
wait:
	for {
		select {
		case err := <-exited:
			t.Fatalf("the recipe failed (%v) after %v:\n%s", err, time.Since(start).Round(time.Second), output())
		case <-deadline:
			_ = finish()
			t.Fatalf("the recipe did not reach its last step within 10 minutes:\n%s", output())
		case <-time.After(200 * time.Millisecond):
			if _, err := os.Stat(ready); err == nil {
				break wait
			}
		}
	}
	checkRecipe(t, p, img, dbURL, output())
	if err := finish(); err != nil {
		t.Fatalf("the recipe's teardown: %v\n%s", err, output())
	}
	t.Logf("the recipe's %d blocks ran in %v", len(blocks), time.Since(start).Round(time.Second))
}

// checkRecipe checks what the recipe started, while it runs.
func checkRecipe(t *testing.T, p *podman, img image, dbURL, out string) {
	t.Helper()
	answers := regexp.MustCompile(`(?s)HTTP/1\.1 (\d{3})[^\n]*\n(.*?)\r\n\r\n([^\n]*)\n`).FindAllStringSubmatch(out, -1)
	if len(answers) != 2 || answers[0][1] != "201" || answers[1][1] != "201" {
		t.Fatalf("the recipe's order and its replay: want 201 twice, got %d answers:\n%s", len(answers), out)
	}
	replayed := regexp.MustCompile(`(?im)^Idempotent-Replayed: true\r$`)
	if replayed.MatchString(answers[0][2]) || !replayed.MatchString(answers[1][2]) {
		t.Errorf("want the second answer, not the first, marked Idempotent-Replayed: true:\n%s", out)
	}
	if answers[0][3] != answers[1][3] {
		t.Errorf("the replay differs from the first answer:\n%s\n%s", answers[0][3], answers[1][3])
	}
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	var n int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM orders WHERE reference = 'recipe-1001'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("orders with reference recipe-1001: %d rows, want 1", n)
	}

	// podman kube play names the container <deployment>-pod-0-<container>.
	var ctr []struct {
		Config     struct{ User string }
		HostConfig struct{ ReadonlyRootfs bool }
	}
	if err := json.Unmarshal([]byte(p.run(t, "inspect", "payments-api-pod-0-api")), &ctr); err != nil || len(ctr) != 1 {
		t.Fatalf("podman inspect payments-api-pod-0-api: %v", err)
	}
	if u := ctr[0].Config.User; !ctr[0].HostConfig.ReadonlyRootfs || u == "" || strings.HasPrefix(u, "0") {
		t.Errorf("the dev overlay's container: user %q, read-only root %v; want the image's non-root user on a read-only root", u, ctr[0].HostConfig.ReadonlyRootfs)
	}
	checkAdmin(t, "http://127.0.0.1:18080", "http://127.0.0.1:19090", img)
	t.Logf("the recipe: order %s, replayed; one row", answers[0][3])
}
