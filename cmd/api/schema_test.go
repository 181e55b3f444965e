package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/dbmigrate"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// G8, the binary's side: serve refuses a database its migrations have not
// reached, naming the command to run, and the previous release's
// `api migrate up` (its migration Job rerun, or a rollback of the code)
// leaves a newer schema alone and succeeds. tools/upgrade runs the
// previous release's binary itself.
func TestSchemaVersionAtStart(t *testing.T) {
	t.Parallel()
	t.Run("ServeRefusesAnUnmigratedDatabase", func(t *testing.T) {
		t.Parallel()
		url := testdb.CreateEmptyDatabase(t)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a serve that starts would run until killed
		defer cancel()
		cmd := exec.CommandContext(ctx, apiBinary(t), "serve")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+url, "NATS_URL=nats://127.0.0.1:9", "ADDR=127.0.0.1:0")
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "run api migrate up first") {
			t.Fatalf("serve on an empty database: %v, want a refusal naming api migrate up:\n%s", err, out)
		}
	})
	t.Run("ServeWaitsForADatabaseThatDoesNotAnswer", func(t *testing.T) {
		// A process started during a failover (nothing accepts writes
		// yet) must wait for the database, not exit into a restart loop.
		t.Parallel()
		proxy, cfg := testkit.DatabaseProxy(t, testdb.New(t))
		proxy.Cut()
		url := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", cfg.ConnConfig.User, proxy.Addr(), cfg.ConnConfig.Database)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, apiBinary(t), "serve")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+url, "NATS_URL="+natsURLFor(t, url), "ADDR=127.0.0.1:0")
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		lines := make(chan string)
		go func() {
			defer close(lines)
			scanner := bufio.NewScanner(stderr)
			for scanner.Scan() {
				lines <- scanner.Text()
			}
		}()
		next := func(want string) string {
			t.Helper()
			for line := range lines {
				if strings.Contains(line, want) {
					return line
				}
			}
			t.Fatalf("serve exited before logging %q", want)
			return ""
		}
		next("waiting for it before serving")
		time.Sleep(2 * schemaCheckRetry) // still waiting, not exiting
		proxy.Restore()
		next("schema version checked")
		var entry struct{ Addr string }
		if err := json.Unmarshal([]byte(next(`"msg":"listening"`)), &entry); err != nil {
			t.Fatal(err)
		}
		if status, _ := httpGet(t, "http://"+entry.Addr+"/readyz"); status != 200 {
			t.Errorf("/readyz = %d once the database answered, want 200", status)
		}
		go func() {
			for range lines { // drain, so that serve never blocks on its log
			}
		}()
	})
	t.Run("MigrateUpLeavesANewerSchemaAlone", func(t *testing.T) {
		t.Parallel()
		url := testdb.New(t)
		latest, err := dbmigrate.Latest()
		if err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.Connect(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), `UPDATE schema_migrations SET version = $1`, int64(latest)+1); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(apiBinary(t), "migrate", "up")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "newer than this binary") {
			t.Fatalf("migrate up on a newer schema: %v, want success and a note:\n%s", err, out)
		}
		// And serve starts on it.
		srv := startServer(t, url)
		if status, _ := httpGet(t, srv.base+"/readyz"); status != 200 {
			t.Errorf("serve on a newer schema: /readyz %d", status)
		}
	})
}
