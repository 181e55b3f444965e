package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/config"
	"github.com/idemref/payments/internal/dbmigrate"
	"github.com/idemref/payments/internal/messaging"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

func TestTenantCreatePrintsAWorkingKeyOnTheLastLine(t *testing.T) {
	t.Parallel()
	pool, url := testdb.NewPool(t)
	key := runTenantCreate(t, url, "acme")
	if !strings.HasPrefix(key, "sk_") {
		t.Fatalf("last line %q is not an API key", key)
	}
	// Only the SHA-256 of the key is stored.
	if n := count(t, pool, `SELECT count(*) FROM api_keys WHERE key_hash = sha256(convert_to($1, 'UTF8'))`, key); n != 1 {
		t.Fatalf("api_keys rows holding the key's hash = %d, want 1", n)
	}
	srv := startServer(t, url)
	res, err := postOrder(srv.base, key, "k", `{"reference":"r","customer_id":"c","amount":1,"currency":"EUR"}`)
	if err != nil || res.status != http.StatusCreated {
		t.Fatalf("create with the new key: %v %d %s", err, res.status, res.body)
	}
}

func TestMigrateUpCreatesTheSchema(t *testing.T) {
	t.Parallel()
	url := testdb.CreateEmptyDatabase(t)
	cmd := exec.Command(apiBinary(t), "migrate", "up")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("migrate up: %v\n%s", err, out)
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if n := count(t, pool, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("orders = %d", n)
	}
}

func TestConfigurationErrorsAreClear(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"ServeWithoutDatabaseURL", []string{"serve"}, nil, "DATABASE_URL is not set"},
		{"ServeWithoutNatsURL", []string{"serve"}, map[string]string{"DATABASE_URL": "postgres://x/y"}, "NATS_URL is not set"},
		{"MessageRetentionWithinRedelivery", []string{"serve"}, map[string]string{"MESSAGE_RETENTION": "10m"}, "MESSAGE_RETENTION"},
		{"MessageRetentionWithinWebhookRetries", []string{"serve"}, map[string]string{"MESSAGE_RETENTION": "96h", "PROCESSOR_WEBHOOK_RETRY_SPAN": "120h"}, "PROCESSOR_WEBHOOK_RETRY_SPAN"},
		{"BadMaxDeliver", []string{"serve"}, map[string]string{"EVENTS_MAX_DELIVER": "0"}, "EVENTS_MAX_DELIVER"},
		{"BadDuration", []string{"serve"}, map[string]string{"DATABASE_URL": "postgres://x/y", "IDEMPOTENCY_TTL": "forever"}, "IDEMPOTENCY_TTL"},
		{"BadLogLevel", []string{"serve"}, map[string]string{"LOG_LEVEL": "loud"}, "LOG_LEVEL"},
		{"LeaseShorterThanProcessorCall", []string{"serve"}, map[string]string{"PAYMENT_LEASE": "5s", "PROCESSOR_TIMEOUT": "10s"}, "PAYMENT_LEASE"},
		{"ProcessorCallLongerThanRequest", []string{"serve"}, map[string]string{"PROCESSOR_TIMEOUT": "30s", "PAYMENT_LEASE": "60s"}, "REQUEST_TIMEOUT"},
		{"KeyRetentionShorterThanTTL", []string{"serve"}, map[string]string{"IDEMPOTENCY_TTL": "48h", "IDEMPOTENCY_KEY_RETENTION": "24h"}, "IDEMPOTENCY_KEY_RETENTION"},
		{"SettleWindowWithinProcessorCall", []string{"serve"}, map[string]string{"PROCESSOR_SETTLE_WINDOW": "5s"}, "PROCESSOR_SETTLE_WINDOW"},
		{"UnknownProcessor", []string{"serve"}, map[string]string{"PROCESSOR": "paypal"}, "want simulator"},
		{"StripeWithoutKey", []string{"serve"}, map[string]string{"PROCESSOR": "stripe"}, "PROCESSOR=stripe needs STRIPE_API_KEY"},
		{"StripeKeyWithTheSimulator", []string{"serve"}, map[string]string{"STRIPE_API_KEY": "sk_test_123"}, "STRIPE_API_KEY is set but PROCESSOR is simulator"},
		{"StripePublishableKey", []string{"serve"}, map[string]string{"PROCESSOR": "stripe", "STRIPE_API_KEY": "pk_test_123"}, "publishable pk_ key cannot charge"},
		{"StripeURLWithAPath", []string{"serve"}, map[string]string{"PROCESSOR": "stripe", "STRIPE_API_KEY": "sk_test_123", "STRIPE_API_URL": "https://api.stripe.com/v1"}, "STRIPE_API_URL"},
		{"StripeWithStandardWebhooks", []string{"serve"}, map[string]string{"PROCESSOR": "stripe", "STRIPE_API_KEY": "sk_test_123", "WEBHOOK_SCHEME": "standard"}, "Stripe-Signature"},
		{"BadStripeSearchLag", []string{"serve"}, map[string]string{"STRIPE_SEARCH_LAG": "soon"}, "STRIPE_SEARCH_LAG"},
		{"ZeroLease", []string{"serve"}, map[string]string{"PAYMENT_LEASE": "0"}, "PAYMENT_LEASE"},
		{"BadReaperInterval", []string{"serve"}, map[string]string{"REAPER_INTERVAL": "often"}, "REAPER_INTERVAL"},
		{"BadReaperBatch", []string{"serve"}, map[string]string{"REAPER_BATCH": "0"}, "REAPER_BATCH"},
		{"BadReaperDuty", []string{"serve"}, map[string]string{"REAPER_DUTY": "1.5"}, "REAPER_DUTY"},
		{"BadEventsReplicas", []string{"serve"}, map[string]string{"EVENTS_REPLICAS": "0"}, "EVENTS_REPLICAS"},
		{"TooManyEventsReplicas", []string{"serve"}, map[string]string{"EVENTS_REPLICAS": "7"}, "1 to 5"},
		{"BadEventWorkers", []string{"serve"}, map[string]string{"EVENT_WORKERS": "sometimes"}, "EVENT_WORKERS"},
		{"ReapWithoutDatabaseURL", []string{"reap"}, nil, "DATABASE_URL is not set"},
		{"ReapLoopDisabled", []string{"reap", "--loop"}, map[string]string{"DATABASE_URL": "postgres://x/y", "REAPER_INTERVAL": "0"}, "REAPER_INTERVAL"},
		{"ReapUnknownFlag", []string{"reap", "--forever"}, nil, `reap takes --loop or nothing, got "--forever"`},
		{"UnknownCommand", []string{"launch"}, nil, `unknown command "launch"`},
		{"BareMigrate", []string{"migrate"}, nil, "migrate needs up, down N or down --all"},
		{"MigrateUpWithoutDatabaseURL", []string{"migrate", "up"}, nil, "DATABASE_URL is not set: point it at PostgreSQL"},
		{"TenantCreateWithoutName", []string{"tenant", "create"}, nil, "tenant create needs the tenant's name"},
		{"ServeWithArguments", []string{"serve", "now"}, nil, `serve takes no arguments, got "now"`},
		{"BareMigrateDown", []string{"migrate", "down"}, map[string]string{"DATABASE_URL": "postgres://x/y"}, "--all"},
		{"MigrateDownZero", []string{"migrate", "down", "0"}, map[string]string{"DATABASE_URL": "postgres://x/y"}, "positive number"},
		{"NoCommand", nil, nil, "no command given"},
		{"DeadLettersWithoutNatsURL", []string{"deadletters", "redrive"}, nil, "NATS_URL is not set"},
		{"DeadLettersUnknownAction", []string{"deadletters", "purge"}, nil, `deadletters needs list or redrive, got "purge"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tt.args, func(k string) string { return tt.env[k] }, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tt.want)
			}
		})
	}
}

// api reap prunes what is past its TTL, deletes what is past its retention,
// prints both counts and leaves the rest alone.
func TestReapPrintsTheCounts(t *testing.T) {
	t.Parallel()
	pool, url := testdb.NewPool(t)
	tenant, _, err := tenants.Create(t.Context(), pool, "reap")
	if err != nil {
		t.Fatal(err)
	}
	// Three completed keys past the TTL, two tombstones past retention, one
	// key in progress since long ago, one completed key within its TTL.
	if _, err := pool.Exec(t.Context(), `
		INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, state,
		    response_status, response_headers, response_body, completed_at, expires_at, retain_until)
		SELECT $1, 'POST /v1/orders', k, sha256(convert_to(k, 'UTF8')), 1, s,
		    CASE WHEN s <> 'in_progress' THEN 201 END,
		    CASE WHEN s = 'completed' THEN '{}'::jsonb END, CASE WHEN s = 'completed' THEN '{}'::bytea END,
		    CASE WHEN s <> 'in_progress' THEN now() END, now() + e, now() + r
		FROM (VALUES ('due-1', 'completed', interval '-1s', interval '1h'),
		             ('due-2', 'completed', interval '-1s', interval '1h'),
		             ('due-3', 'completed', interval '-1s', interval '1h'),
		             ('old-1', 'expired', interval '-2h', interval '-1s'),
		             ('old-2', 'expired', interval '-2h', interval '-1s'),
		             ('busy', 'in_progress', interval '-2h', interval '-1s'),
		             ('live', 'completed', interval '1h', interval '2h')) AS f (k, s, e, r)`, tenant); err != nil {
		t.Fatal(err)
	}
	// Inbox ids and published outbox rows: one of each past the retention
	// (M3), one of each within it, and an old unpublished row (kept: it
	// has not reached the broker).
	if _, err := pool.Exec(t.Context(), `
		INSERT INTO processed_messages (consumer, source, message_id, processed_at)
		VALUES ('orders', 'payments.outbox', 'old', now() - interval '8 days'), ('orders', 'payments.outbox', 'new', now())`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), `
		INSERT INTO outbox (id, tenant_id, subject, event_type, schema_version, payload, created_at, published_at)
		VALUES (gen_random_uuid(), $1, 's', 't', 1, '{}', now() - interval '9 days', now() - interval '8 days'),
		       (gen_random_uuid(), $1, 's', 't', 1, '{}', now(), now()),
		       (gen_random_uuid(), $1, 's', 't', 1, '{}', now() - interval '9 days', NULL)`, tenant); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(apiBinary(t), "reap")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("reap: %v\n%s", err, stderr.String())
	}
	if got, want := stdout.String(), "pruned 3\ndeleted 2\nmessages deleted 1\noutbox deleted 1\n"; got != want {
		t.Fatalf("reap printed %q, want %q", got, want)
	}
	got := map[string]int{}
	rows, err := pool.Query(t.Context(), `SELECT idem_key || ' ' || state FROM idempotency_keys ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		got[k]++
	}
	want := map[string]int{"busy in_progress": 1, "due-1 expired": 1, "due-2 expired": 1, "due-3 expired": 1, "live completed": 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("keys after reap = %v, want %v", got, want)
	}
	if n := count(t, pool, `SELECT count(*) FROM processed_messages WHERE message_id = 'new'`); n != 1 {
		t.Errorf("inbox ids within the retention = %d, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox`); n != 2 {
		t.Errorf("outbox rows after reap = %d, want 2 (the recent published one and the unpublished one)", n)
	}
}

// SIGTERM stops the server gracefully: a request in flight still gets its
// answer, then the process exits 0.
func TestGracefulShutdownFinishesInFlightRequests(t *testing.T) {
	t.Parallel()
	pool, url := testdb.NewPool(t)
	key := runTenantCreate(t, url, "shutdown")
	// The failpoint pauses the request after its commit, so it is in
	// flight when SIGTERM arrives.
	srv := startServer(t, url, "FAILPOINTS=idem-after-commit=sleep:1s")
	done := make(chan response, 1)
	go func() {
		res, err := postOrder(srv.base, key, "k", `{"reference":"r","customer_id":"c","amount":1,"currency":"EUR"}`)
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	testkit.WaitFor(t, 20*time.Second, func() bool { return count(t, pool, `SELECT count(*) FROM orders`) == 1 })
	if err := srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if res := <-done; res.status != http.StatusCreated {
		t.Fatalf("in-flight request got %d, want 201", res.status)
	}
	select {
	case <-srv.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("server did not exit after SIGTERM")
	}
	if code := srv.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
}

// migrate down rolls back exactly the number of migrations asked for, and
// --all everything; a bare down is refused before it touches anything.
func TestMigrateDownTakesACount(t *testing.T) {
	t.Parallel()
	url := testdb.CreateEmptyDatabase(t)
	migrateCmd := func(args ...string) {
		t.Helper()
		cmd := exec.Command(apiBinary(t), append([]string{"migrate"}, args...)...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("migrate %v: %v\n%s", args, err, out)
		}
	}
	version := func() uint {
		t.Helper()
		v, _, err := dbmigrate.Version(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	migrateCmd("up")
	top := version()
	migrateCmd("down", "1")
	if got := version(); got >= top || got == 0 {
		t.Fatalf("version after down 1 = %d, want the one before %d", got, top)
	}
	cmd := exec.Command(apiBinary(t), "migrate", "down")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "--all") {
		t.Fatalf("bare migrate down: err %v, output %s; want a refusal naming --all", err, out)
	}
	before := version()
	if before == 0 {
		t.Fatal("the refused down rolled back everything")
	}
	migrateCmd("down", "--all")
	if got := version(); got != 0 {
		t.Fatalf("version after down --all = %d, want 0", got)
	}
}

// help, -h and --help print the usage on stdout and succeed.
func TestHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}, {"serve", "-h"}, {"migrate", "--help"}} {
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), args, func(string) string { return "" }, &stdout, &stderr); err != nil {
			t.Errorf("api %v: %v", args, err)
		}
		if !strings.Contains(stdout.String(), "api migrate down N") {
			t.Errorf("api %v printed %q, want the usage", args, stdout.String())
		}
	}
}

// Every line of the usage is a command run accepts: filled in, none is a
// usage error (api dev is left out: it would start PostgreSQL).
func TestUsageListsWhatRunAccepts(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := run(context.Background(), []string{"help"}, func(string) string { return "" }, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	usageText, _, _ := strings.Cut(out.String(), "\nConfiguration comes from the environment")
	fill := strings.NewReplacer("NAME", "acme", "TENANT", "acme", "KEYID", "1a2b3c4d", " N", " 1", "[", "", "]", "")
	lines := 0
	for line := range strings.Lines(usageText) {
		synopsis, _, _ := strings.Cut(strings.TrimPrefix(line, "  "), "  ")
		if !strings.HasPrefix(line, "  api ") || synopsis == "api dev" {
			continue
		}
		lines++
		args := strings.Fields(fill.Replace(synopsis))[1:]
		if err := run(context.Background(), args, func(string) string { return "" }, io.Discard, io.Discard); errors.Is(err, errUsage) {
			t.Errorf("api %s, from the usage line %q: %v", strings.Join(args, " "), strings.TrimSpace(line), err)
		}
	}
	if lines < 15 {
		t.Errorf("the usage has %d commands, want every one:\n%s", lines, usageText)
	}
}

// Every command that needs PostgreSQL says so when DATABASE_URL is unset,
// before it opens anything.
func TestCommandsSayTheyNeedDatabaseURL(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"serve"}, {"completer"}, {"reap"}, {"reap", "--loop"}, {"migrate", "up"}, {"migrate", "down", "1"}, {"migrate", "down", "--all"},
		{"tenant", "create", "acme"}, {"tenant", "list"}, {"key", "create", "acme"}, {"key", "list", "acme"}, {"key", "revoke", "acme", "1a2b3c4d"},
	} {
		err := run(context.Background(), args, func(string) string { return "" }, io.Discard, io.Discard)
		if !errors.Is(err, errNoDatabaseURL) {
			t.Errorf("api %s without DATABASE_URL: %v, want %v", strings.Join(args, " "), err, errNoDatabaseURL)
		}
	}
}

// The startup log names the database and the processor, never a password.
func TestStartupLogHidesPasswords(t *testing.T) {
	t.Parallel()
	if got := databaseTarget("postgres://app:s3cret@db.internal:6432/payments?sslmode=disable"); got != "db.internal:6432/payments" {
		t.Errorf("databaseTarget = %q, want db.internal:6432/payments", got)
	}
	if got := messaging.RedactURL("nats://user:s3cret@broker:4222"); strings.Contains(got, "s3cret") {
		t.Errorf("messaging.RedactURL = %q, leaks the password", got)
	}
}

// Every environment variable the configuration reads has a row in
// settings, which api help prints and docs/configuration.md shows, and
// every row is read: the three cannot drift apart.
func TestEveryVariableIsDocumented(t *testing.T) {
	t.Parallel()
	rows := map[string]bool{}
	for _, s := range config.Settings {
		if rows[s.Name] {
			t.Errorf("settings has two rows for %s", s.Name)
		}
		rows[s.Name] = true
	}
	// What loadConfig reads (a name without a row panics in withDefaults).
	read := map[string]bool{}
	if _, err := config.Load(func(name string) string { read[name] = true; return "" }); err != nil {
		t.Fatalf("the defaults of settings are refused: %v", err)
	}
	for name := range read {
		if !rows[name] {
			t.Errorf("loadConfig reads %s, which has no row in settings", name)
		}
	}
	for name := range rows {
		if !read[name] {
			t.Errorf("settings has a row for %s, which loadConfig never reads: remove it", name)
		}
	}
	// Nothing in the command reads the environment around loadConfig.
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	direct := regexp.MustCompile(`(?:Getenv|LookupEnv|getenv)\("([A-Z][A-Z0-9_]+)"`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range direct.FindAllStringSubmatch(string(src), -1) {
			if !rows[m[1]] {
				t.Errorf("%s reads %s, which has no row in settings (internal/config/config.go): add one", f, m[1])
			}
		}
	}
}

// api help prints the configuration as plain text: every variable with its
// default, no markdown, nothing wider than a terminal but a long default.
func TestHelpPrintsTheConfiguration(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	// A broken configuration does not keep help from explaining it.
	if err := run(context.Background(), []string{"help"}, func(k string) string {
		return map[string]string{"IDEMPOTENCY_TTL": "forever"}[k]
	}, &stdout, &stderr); err != nil {
		t.Fatalf("api help with IDEMPOTENCY_TTL=forever: %v", err)
	}
	out := stdout.String()
	_, conf, ok := strings.Cut(out, "\nConfiguration comes from the environment")
	if !ok {
		t.Fatalf("api help printed no configuration:\n%s", out)
	}
	if strings.ContainsAny(conf, "|`") {
		t.Errorf("api help's configuration has markdown in it:\n%s", conf)
	}
	for _, s := range config.Settings {
		line := regexp.MustCompile(`(?m)^  ` + s.Name + ` +(.*)$`).FindStringSubmatch(conf)
		switch {
		case line == nil:
			t.Errorf("api help does not list %s", s.Name)
		case s.Default != "" && !strings.HasPrefix(line[1], s.Default):
			t.Errorf("api help: %s's default is %q, want %s", s.Name, line[1], s.Default)
		}
	}
	for _, line := range strings.Split(conf, "\n") {
		if len(line) > 80 {
			t.Errorf("api help's line is %d columns wide, want at most 80: %q", len(line), line)
		}
	}
}

// A busy port is reported at once, naming ADDR, before api dev starts
// PostgreSQL, NATS and the simulator for nothing.
func TestDevRefusesABusyPortFirst(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir := t.TempDir()
	t.Chdir(dir) // .dev/ would be created here if dev got that far
	var stdout, stderr bytes.Buffer
	err = run(context.Background(), []string{"dev"}, func(k string) string {
		return map[string]string{"ADDR": ln.Addr().String()}[k]
	}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "ADDR "+ln.Addr().String()) {
		t.Fatalf("api dev on a busy port = %v, want an error naming ADDR", err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".dev")); !os.IsNotExist(err) {
		t.Errorf("api dev created .dev/ before finding the port busy (%v)", err)
	}
}
