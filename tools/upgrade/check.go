package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/tooling/harness"
	"github.com/idemref/payments/internal/tooling/natstmp"
	"github.com/idemref/payments/internal/tooling/pgtmp"
	"github.com/idemref/payments/internal/tooling/processorsim"
)

const (
	// timeout bounds the whole check, builds included.
	timeout = 10 * time.Minute
	// settle bounds each wait for something asynchronous: a payment's
	// final state, the events that mark its order paid, a webhook, a reaper
	// pass.
	settle = 30 * time.Second
	// overlap is how long both servers run side by side with nothing
	// asked of them, their background jobs (completer, reaper, relay,
	// consumer) polling the same tables, before the reaper is given work.
	overlap = 2 * time.Second
	// webhookSecret signs the simulator's webhooks for both servers.
	webhookSecret = "upgrade-check-webhook-secret"
	amount        = 4200
)

// env is everything the check started.
type env struct {
	out     io.Writer
	verbose bool
	work    string
	dataDir string
	cluster *pgtmp.Cluster
	nats    *natstmp.Server
	sim     *processorsim.Server
	db      *pgxpool.Pool
	dbURL   string
	procs   []*harness.Process
	http    *http.Client
}

func (e *env) say(format string, args ...any) {
	fmt.Fprintf(e.out, "upgrade: "+format+"\n", args...)
}

// check runs the whole check; see the package comment.
func check(ctx context.Context, o options, stdout io.Writer) (err error) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	root, err := harness.ModuleRoot()
	if err != nil {
		return err
	}
	prev, err := previousRelease(root, o.from)
	if err != nil {
		return err
	}
	e := &env{out: stdout, verbose: o.verbose, http: &http.Client{Timeout: 30 * time.Second}}
	e.say("the previous release is %s, chosen by the rule: %s", prev.Rev[:12], prev.Rule)

	if e.work, err = os.MkdirTemp("", "upgrade-"); err != nil {
		return err
	}
	defer func() {
		e.stop()
		if err != nil {
			// What the servers said is most often the cause.
			for _, p := range e.procs {
				if lines := harness.ErrorLines(p.LogPath, 3); len(lines) > 0 {
					err = fmt.Errorf("%w\n%s logged:\n%s", err, p.Name, strings.Join(lines, "\n"))
				}
			}
		}
		if o.keep || err != nil {
			e.say("kept %s (binaries, both servers' logs api-old.log and api-new.log, PostgreSQL's data in %s)", e.work, e.dataDir)
			return
		}
		_ = os.RemoveAll(e.work)
		_ = os.RemoveAll(e.dataDir)
	}()

	r, err := e.buildReleases(ctx, root, prev)
	if err != nil {
		return err
	}
	if err := e.start(ctx); err != nil {
		return err
	}
	if err := e.migrate(ctx, r); err != nil {
		return err
	}
	// 2. A tenant from each binary's CLI: each server must authenticate
	// the other's.
	if r.keyNew, err = e.tenant(ctx, r.newBin, "upgrade-new"); err != nil {
		return fmt.Errorf("api-new tenant create: %w", err)
	}
	if r.keyOld, err = e.tenant(ctx, r.oldBin, "upgrade-old"); err != nil {
		return fmt.Errorf("the previous release's api tenant create on schema %d: %w", r.version, err)
	}
	if err := e.upgrade(ctx, r); err != nil {
		return err
	}
	e.say("ok: %s (migrations to %d) served beside the work tree (to %d) on schema %d: order, replay, payment, cross-replays, refunds, reaper; no error logged; %s",
		r.oldName, r.oldKnows, r.newKnows, r.version, time.Since(began).Round(100*time.Millisecond))
	return nil
}

// releases is what the check compares: the previous release's api and
// this tree's, and what the steps learn of them.
type releases struct {
	oldName, oldBin, newBin string
	// oldKnows and newKnows are the newest migration each knows; version
	// is the schema's after api-new migrate up.
	oldKnows, newKnows int
	version            int64
	// keyNew and keyOld are the API keys of the tenants each binary's CLI
	// created.
	keyNew, keyOld string
}

// sent is an idempotent request sent once, to be sent again: its first
// answer is what every replay must be.
type sent struct {
	path, idemKey, body string
	first               answer
}

// replayOf sends s again to the server at base as who; see replay.
func (e *env) replayOf(ctx context.Context, who, base, apiKey string, s sent) error {
	return e.replay(ctx, who, base, apiKey, s.path, s.idemKey, s.body, s.first)
}

// buildReleases builds the previous release's api and this tree's.
func (e *env) buildReleases(ctx context.Context, root string, prev release) (*releases, error) {
	r := &releases{oldName: prev.Rev[:12]}
	// The previous release's tree is extracted once per revision into the
	// user's cache and built there: a package's directory is part of its
	// build cache key, so the same directory each run makes a second build
	// a link, and this tree's packages come from the cache make test
	// filled.
	oldTree, err := extract(root, prev.Rev)
	if err != nil {
		return nil, err
	}
	t := time.Now()
	if r.newBin, err = build(ctx, root, filepath.Join(e.work, "api-new")); err != nil {
		return nil, fmt.Errorf("build this tree's api: %w", err)
	}
	if r.oldBin, err = build(ctx, oldTree, filepath.Join(e.work, "api-old")); err != nil {
		return nil, fmt.Errorf("build the previous release's api (%s): %w", r.oldName, err)
	}
	e.say("built api-old (%s) and api-new (the work tree) in %s", r.oldName, time.Since(t).Round(100*time.Millisecond))
	if r.oldKnows, err = newestMigration(filepath.Join(oldTree, "db", "migrations")); err != nil {
		return nil, err
	}
	if r.newKnows, err = newestMigration(filepath.Join(root, "db", "migrations")); err != nil {
		return nil, err
	}
	return r, nil
}

// migrate is step 1: this tree's migrations, by this tree's binary, as the
// release's migration Job runs them before the rolling update.
func (e *env) migrate(ctx context.Context, r *releases) error {
	if out, err := e.cli(ctx, r.newBin, "migrate", "up"); err != nil {
		return fmt.Errorf("api-new migrate up: %w\n%s", err, out)
	}
	var dirty bool
	if err := e.db.QueryRow(ctx, "SELECT version, dirty FROM schema_migrations").Scan(&r.version, &dirty); err != nil {
		return fmt.Errorf("read schema_migrations: %w", err)
	}
	if dirty || r.version != int64(r.newKnows) {
		return fmt.Errorf("after api-new migrate up the schema is at version %d (dirty %v), want %d, this tree's newest migration", r.version, dirty, r.newKnows)
	}
	e.say("migrated with api-new to version %d; the previous release knows migrations up to %d", r.version, r.oldKnows)
	// What a rollback meets if it reruns the previous release's migration
	// Job: said, not judged (the rolling update itself never runs it).
	if out, err := e.cli(ctx, r.oldBin, "migrate", "up"); err != nil {
		e.say("note: api-old migrate up on schema %d fails (%v): %s", r.version, err, lastLine(out))
	} else {
		e.say("note: api-old migrate up on schema %d succeeds: %s", r.version, lastLine(out))
	}
	return nil
}

// upgrade is steps 3 to 5, the rolling update: the previous release alone
// on the new schema, then both at once, then this tree's alone.
func (e *env) upgrade(ctx context.Context, r *releases) error {
	oldAPI, oldURL, order1, pay1, err := e.oldAlone(ctx, r)
	if err != nil {
		return err
	}
	// 4. Both at once, as during the rolling update.
	newAPI, newURL, err := e.serve(ctx, "api-new", r.newBin, "REAPER_INTERVAL=0")
	if err != nil {
		return fmt.Errorf("this tree's api serve: %w", err)
	}
	e.say("api-new serves beside api-old at %s", newURL)
	order2, pay2, err := e.crossReplays(ctx, r, oldURL, newURL, order1, pay1)
	if err != nil {
		return err
	}
	if err := e.overlapAndReap(ctx, r, oldAPI, newAPI); err != nil {
		return err
	}

	// 5. The previous release goes; this one keeps answering.
	oldAPI.Stop()
	if err := e.replayOf(ctx, "api-new", newURL, r.keyOld, order2); err != nil {
		return err
	}
	if err := e.replayOf(ctx, "api-new", newURL, r.keyOld, pay2); err != nil {
		return err
	}
	newAPI.Stop()
	for _, p := range []*harness.Process{oldAPI, newAPI} {
		if lines := harness.ErrorLines(p.LogPath, 10); len(lines) > 0 {
			return fmt.Errorf("%s logged errors:\n%s", p.Name, strings.Join(lines, "\n"))
		}
	}
	return nil
}

// oldAlone is step 3: the previous release alone on the new schema
// creates an order and pays it, and replays both.
func (e *env) oldAlone(ctx context.Context, r *releases) (oldAPI *harness.Process, oldURL string, order1, pay1 sent, err error) {
	oldAPI, oldURL, err = e.serve(ctx, "api-old", r.oldBin, "REAPER_INTERVAL=500ms")
	if err != nil {
		return nil, "", sent{}, sent{}, fmt.Errorf("the previous release's api serve (%s, migrations up to %d) does not start on schema version %d: %w", r.oldName, r.oldKnows, r.version, err)
	}
	e.say("api-old serves on schema %d at %s", r.version, oldURL)

	order1 = sent{path: "/v1/orders", idemKey: "upgrade-order-1",
		body: `{"reference":"upgrade-1","customer_id":"cus_upgrade","amount":` + strconv.Itoa(amount) + `,"currency":"EUR"}`}
	if order1.first, err = e.create(ctx, "api-old", oldURL, r.keyNew, order1.path, order1.idemKey, order1.body); err != nil {
		return nil, "", sent{}, sent{}, err
	}
	if err := e.replayOf(ctx, "api-old", oldURL, r.keyNew, order1); err != nil {
		return nil, "", sent{}, sent{}, err
	}
	if err := e.count(ctx, "orders with reference upgrade-1", 1, "SELECT count(*) FROM orders WHERE reference = 'upgrade-1'"); err != nil {
		return nil, "", sent{}, sent{}, err
	}
	if err := e.count(ctx, "key rows for upgrade-order-1", 1, "SELECT count(*) FROM idempotency_keys WHERE idem_key = 'upgrade-order-1'"); err != nil {
		return nil, "", sent{}, sent{}, err
	}
	orderID1, err := idOf(order1.first)
	if err != nil {
		return nil, "", sent{}, sent{}, err
	}
	e.say("api-old: order %s created, replayed byte for byte, one row", orderID1)

	e.sim.Simulator.SetWebhooks(processorsim.WebhookConfig{URL: oldURL + "/v1/webhooks/processor", Secrets: []string{webhookSecret}})
	pay1 = sent{path: "/v1/payments", idemKey: "upgrade-pay-1",
		body: fmt.Sprintf(`{"order_id":%q,"amount":%d,"currency":"EUR","payment_method":"pm_card_visa"}`, orderID1, amount)}
	if pay1.first, err = e.pay(ctx, "api-old", oldURL, r.keyNew, pay1.idemKey, pay1.body, orderID1); err != nil {
		return nil, "", sent{}, sent{}, err
	}
	if err := e.replayOf(ctx, "api-old", oldURL, r.keyNew, pay1); err != nil {
		return nil, "", sent{}, sent{}, err
	}
	e.say("api-old: order %s paid: one charge, the payment row succeeded, the order paid by its events, the webhook applied", orderID1)
	return oldAPI, oldURL, order1, pay1, nil
}

// crossReplays is step 4's traffic: each server replays what the other
// answered, with the tenant the other's CLI made, and refunds the payment
// the other made.
func (e *env) crossReplays(ctx context.Context, r *releases, oldURL, newURL string, order1, pay1 sent) (order2, pay2 sent, err error) {
	if err := e.replayOf(ctx, "api-new", newURL, r.keyNew, order1); err != nil {
		return sent{}, sent{}, err
	}
	if err := e.replayOf(ctx, "api-new", newURL, r.keyNew, pay1); err != nil {
		return sent{}, sent{}, err
	}
	order2 = sent{path: "/v1/orders", idemKey: "upgrade-order-2",
		body: `{"reference":"upgrade-2","customer_id":"cus_upgrade","amount":` + strconv.Itoa(amount) + `,"currency":"EUR"}`}
	if order2.first, err = e.create(ctx, "api-new", newURL, r.keyOld, order2.path, order2.idemKey, order2.body); err != nil {
		return sent{}, sent{}, err
	}
	if err := e.replayOf(ctx, "api-old", oldURL, r.keyOld, order2); err != nil {
		return sent{}, sent{}, err
	}
	orderID2, err := idOf(order2.first)
	if err != nil {
		return sent{}, sent{}, err
	}
	e.sim.Simulator.SetWebhooks(processorsim.WebhookConfig{URL: newURL + "/v1/webhooks/processor", Secrets: []string{webhookSecret}})
	pay2 = sent{path: "/v1/payments", idemKey: "upgrade-pay-2",
		body: fmt.Sprintf(`{"order_id":%q,"amount":%d,"currency":"EUR","payment_method":"pm_card_visa"}`, orderID2, amount)}
	if pay2.first, err = e.pay(ctx, "api-new", newURL, r.keyOld, pay2.idemKey, pay2.body, orderID2); err != nil {
		return sent{}, sent{}, err
	}
	if err := e.replayOf(ctx, "api-old", oldURL, r.keyOld, pay2); err != nil {
		return sent{}, sent{}, err
	}
	if err := e.count(ctx, "orders", 2, "SELECT count(*) FROM orders"); err != nil {
		return sent{}, sent{}, err
	}
	if n := len(e.sim.Simulator.Charges()); n != 2 {
		return sent{}, sent{}, fmt.Errorf("the simulator holds %d charges after two payments, want 2: %+v", n, e.sim.Simulator.Charges())
	}
	e.say("both: each replayed the other's order and payment byte for byte, with the tenant the other's CLI made; 2 orders, 2 charges")

	// A refund of each payment by the release that did not make it, replayed
	// by the other: the refund insert infers the refunds' unique key
	// (ON CONFLICT), which a contract migration must not drop while a
	// release that names it still runs (docs/forking.md, "Contract
	// migrations").
	payID1, err := idOf(pay1.first)
	if err != nil {
		return sent{}, sent{}, err
	}
	payID2, err := idOf(pay2.first)
	if err != nil {
		return sent{}, sent{}, err
	}
	refund1 := sent{path: "/v1/payments/" + payID2 + "/refunds", idemKey: "upgrade-refund-1", body: `{"amount":` + strconv.Itoa(amount/2) + `}`}
	if refund1.first, err = e.create(ctx, "api-old", oldURL, r.keyOld, refund1.path, refund1.idemKey, refund1.body); err != nil {
		return sent{}, sent{}, err
	}
	if err := e.replayOf(ctx, "api-new", newURL, r.keyOld, refund1); err != nil {
		return sent{}, sent{}, err
	}
	refund2 := sent{path: "/v1/payments/" + payID1 + "/refunds", idemKey: "upgrade-refund-2", body: `{"amount":` + strconv.Itoa(amount/2) + `}`}
	if refund2.first, err = e.create(ctx, "api-new", newURL, r.keyNew, refund2.path, refund2.idemKey, refund2.body); err != nil {
		return sent{}, sent{}, err
	}
	if err := e.replayOf(ctx, "api-old", oldURL, r.keyNew, refund2); err != nil {
		return sent{}, sent{}, err
	}
	if err := e.count(ctx, "refunds", 2, "SELECT count(*) FROM refunds"); err != nil {
		return sent{}, sent{}, err
	}
	if n := len(e.sim.Simulator.Refunds()); n != 2 {
		return sent{}, sent{}, fmt.Errorf("the simulator holds %d refunds after two refunds, want 2: %+v", n, e.sim.Simulator.Refunds())
	}
	e.say("both: each refunded the other's payment, and the other replayed the refund byte for byte; 2 refunds")
	return order2, pay2, nil
}

// overlapAndReap lets both servers run side by side with nothing asked of
// them, then has the previous release's reaper prune on the new schema.
func (e *env) overlapAndReap(ctx context.Context, r *releases, oldAPI, newAPI *harness.Process) error {
	select {
	case <-time.After(overlap):
	case <-ctx.Done():
		return ctx.Err()
	}
	for _, p := range []*harness.Process{oldAPI, newAPI} {
		select {
		case <-p.Exited():
			return fmt.Errorf("%s exited while both ran; its log:\n%s", p.Name, harness.Tail(p.LogPath))
		default:
		}
	}

	// The previous release's reaper on the new schema: the inbox and the
	// outbox past MESSAGE_RETENTION, and a key past its retention. The new
	// server's reaper is off, so what goes, the old one took.
	if err := e.oldReaper(ctx, "upgrade-order-1"); err != nil {
		return err
	}
	e.say("api-old's reaper pruned the inbox (the horizon moved), the published outbox and a key past retention on schema %d", r.version)
	return nil
}

// extract writes the tree of rev into the user's cache directory, once
// (a revision's tree never changes), and returns where. git archive writes
// nothing to the repository, unlike a worktree, so a killed run leaves
// nothing there to prune; trees of other revisions untouched for a day
// are removed.
func extract(root, rev string) (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	base = filepath.Join(base, "api-upgrade-check")
	dir := filepath.Join(base, rev)
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(base, 0o750); err != nil {
		return "", err
	}
	if entries, err := os.ReadDir(base); err == nil {
		for _, en := range entries {
			if info, err := en.Info(); err == nil && en.Name() != rev && time.Since(info.ModTime()) > 24*time.Hour {
				_ = os.RemoveAll(filepath.Join(base, en.Name()))
			}
		}
	}
	tmp, err := os.MkdirTemp(base, rev+".tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp) // gone once renamed
	tarPath := filepath.Join(tmp, "tree.tar")
	if _, err := git(root, "archive", "--format=tar", "-o", tarPath, rev); err != nil {
		return "", err
	}
	tree := filepath.Join(tmp, "tree")
	if err := os.Mkdir(tree, 0o750); err != nil {
		return "", err
	}
	if out, err := exec.Command("tar", "-xf", tarPath, "-C", tree).CombinedOutput(); err != nil {
		return "", fmt.Errorf("tar -xf %s: %w\n%s", tarPath, err, out)
	}
	if err := os.Rename(tree, dir); err != nil {
		if _, statErr := os.Stat(filepath.Join(dir, "go.mod")); statErr == nil {
			return dir, nil // a run beside this one extracted it first
		}
		return "", err
	}
	return dir, nil
}

// build compiles ./cmd/api of the module at dir into out.
func build(ctx context.Context, dir, out string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/api")
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build -o %s ./cmd/api in %s: %w\n%s", out, dir, err, b)
	}
	return out, nil
}

var migrationFile = regexp.MustCompile(`^(\d+)_.*\.up\.sql$`)

// newestMigration is the highest version among the up migrations in dir.
func newestMigration(dir string) (int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	newest := 0
	for _, en := range entries {
		if m := migrationFile.FindStringSubmatch(en.Name()); m != nil {
			n, err := strconv.Atoi(m[1])
			if err != nil {
				return 0, err
			}
			newest = max(newest, n)
		}
	}
	if newest == 0 {
		return 0, fmt.Errorf("no up migration in %s", dir)
	}
	return newest, nil
}

// start starts PostgreSQL (with the database payments), NATS and the
// processor simulator.
func (e *env) start(ctx context.Context) error {
	var err error
	// Its own directory: run as root, PostgreSQL runs as another user,
	// who must be able to reach it.
	if e.dataDir, err = os.MkdirTemp("", "upgrade-pg-"); err != nil {
		return err
	}
	if e.cluster, err = pgtmp.Start(ctx, pgtmp.Options{Dir: e.dataDir, Fast: true}); err != nil {
		return fmt.Errorf("start PostgreSQL: %w", err)
	}
	conn, err := pgx.Connect(ctx, e.cluster.URL("postgres"))
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE payments")
	_ = conn.Close(ctx)
	if err != nil {
		return err
	}
	e.dbURL = e.cluster.URL("payments")
	if e.db, err = pgxpool.New(ctx, e.dbURL); err != nil {
		return err
	}
	natsDir := filepath.Join(e.work, "nats")
	if err := os.MkdirAll(natsDir, 0o750); err != nil {
		return err
	}
	if e.nats, err = natstmp.Start(natsDir); err != nil {
		return fmt.Errorf("start NATS: %w", err)
	}
	if e.sim, err = processorsim.Start("127.0.0.1:0", processorsim.Config{}); err != nil {
		return err
	}
	return nil
}

// stop ends what start and serve started.
func (e *env) stop() {
	for _, p := range slices.Backward(e.procs) {
		p.Stop()
	}
	if e.sim != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = e.sim.Shutdown(ctx)
		cancel()
	}
	if e.nats != nil {
		e.nats.Shutdown()
	}
	if e.db != nil {
		e.db.Close()
	}
	if e.cluster != nil {
		if err := e.cluster.Stop(); err != nil {
			e.say("stop PostgreSQL: %v", err)
		}
	}
}

// cli runs one of the binaries' commands against the database.
func (e *env) cli(ctx context.Context, bin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+e.dbURL)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String() + stderr.String(), err
	}
	return stdout.String(), nil
}

// tenant runs bin's api tenant create and returns the key it printed last.
func (e *env) tenant(ctx context.Context, bin, name string) (string, error) {
	out, err := e.cli(ctx, bin, "tenant", "create", name)
	if err != nil {
		return "", fmt.Errorf("%w\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1], nil
}

// serve starts bin's api serve against the database; extra settings come
// last and win.
func (e *env) serve(ctx context.Context, name, bin string, extra ...string) (*harness.Process, string, error) {
	settings := append([]string{
		"DATABASE_URL=" + e.dbURL, "DATABASE_DIRECT_URL=", "ADDR=127.0.0.1:0", "NATS_URL=" + e.nats.URL(),
		"PROCESSOR_URL=" + e.sim.URL(), "WEBHOOK_SECRETS=" + webhookSecret, "SHUTDOWN_GRACE=0",
		"COMPLETER_INTERVAL=1s", "LOG_LEVEL=info",
	}, extra...)
	p, addr, err := harness.StartProcess(ctx, e.work, name, bin, []string{"serve"}, settings, "listening")
	if err != nil {
		return nil, "", err
	}
	e.procs = append(e.procs, p)
	return p, "http://" + addr, nil
}

// answer is one HTTP response.
type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) String() string {
	return fmt.Sprintf("%d %s", a.status, bytes.TrimSpace(a.body))
}

// problemCode is the code of a problem+json body, or "".
func (a answer) problemCode() string {
	var p struct{ Code string }
	_ = json.Unmarshal(a.body, &p)
	return p.Code
}

func (e *env) send(ctx context.Context, who, base, apiKey, method, path, idemKey, body string) (answer, error) {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, r)
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	res, err := e.http.Do(req)
	if err != nil {
		return answer{}, fmt.Errorf("%s: %s %s: %w", who, method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return answer{}, fmt.Errorf("%s: %s %s: read the body: %w", who, method, path, err)
	}
	a := answer{res.StatusCode, res.Header, b}
	if e.verbose {
		e.say("  %s: %s %s (key %s) -> %s", who, method, path, idemKey, a)
	}
	return a, nil
}

// create sends a request that must execute: a 201 that is not a replay.
func (e *env) create(ctx context.Context, who, base, apiKey, path, idemKey, body string) (answer, error) {
	a, err := e.send(ctx, who, base, apiKey, http.MethodPost, path, idemKey, body)
	if err != nil {
		return a, err
	}
	if a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") == "true" {
		return a, fmt.Errorf("%s: POST %s (key %s) answered %s (Idempotent-Replayed %q), want a 201 that executed", who, path, idemKey, a, a.header.Get("Idempotent-Replayed"))
	}
	return a, nil
}

// replay sends the request of first again under its key, and wants
// first's status and body byte for byte, marked as a replay.
func (e *env) replay(ctx context.Context, who, base, apiKey, path, idemKey, body string, first answer) error {
	a, err := e.send(ctx, who, base, apiKey, http.MethodPost, path, idemKey, body)
	if err != nil {
		return err
	}
	if a.status != first.status || !bytes.Equal(a.body, first.body) {
		return fmt.Errorf("%s: the replay of POST %s under key %s differs from the first answer:\n  first:  %s\n  replay: %s", who, path, idemKey, first, a)
	}
	if got := a.header.Get("Idempotent-Replayed"); got != "true" {
		return fmt.Errorf("%s: the replay of POST %s under key %s has Idempotent-Replayed %q, want true", who, path, idemKey, got)
	}
	return nil
}

// pay pays an order and waits until the payment is final, retrying as a
// client would while it is in progress, then checks its side effects.
func (e *env) pay(ctx context.Context, who, base, apiKey, idemKey, body, orderID string) (answer, error) {
	deadline := time.Now().Add(settle)
	var a answer
	for {
		var err error
		if a, err = e.send(ctx, who, base, apiKey, http.MethodPost, "/v1/payments", idemKey, body); err != nil {
			return a, err
		}
		code := a.problemCode()
		inProgress := a.status == http.StatusConflict && code == "idempotency_key_in_use" ||
			a.status == http.StatusServiceUnavailable && code == "processor_outcome_unknown"
		if !inProgress {
			break
		}
		if time.Now().After(deadline) {
			return a, fmt.Errorf("%s: the payment under key %s is still in progress after %s: %s", who, idemKey, settle, a)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return a, err
		}
	}
	var p struct{ Status string }
	_ = json.Unmarshal(a.body, &p)
	if a.status != http.StatusCreated || p.Status != "succeeded" {
		return a, fmt.Errorf("%s: POST /v1/payments (key %s) answered %s, want 201 with status succeeded", who, idemKey, a)
	}

	var statuses []string
	rows, err := e.db.Query(ctx, "SELECT status FROM payments WHERE order_id = $1", orderID)
	if err == nil {
		statuses, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return a, fmt.Errorf("read the payments of order %s: %w", orderID, err)
	}
	if !slices.Equal(statuses, []string{"succeeded"}) {
		return a, fmt.Errorf("%s: order %s has payment rows %v, want one succeeded", who, orderID, statuses)
	}
	var charges []string
	for _, c := range e.sim.Simulator.Charges() {
		if c.Metadata["order_id"] == orderID {
			charges = append(charges, c.ID+" "+c.Status)
		}
	}
	if len(charges) != 1 || !strings.HasSuffix(charges[0], " succeeded") {
		return a, fmt.Errorf("%s: the simulator recorded charges %v for order %s, want exactly one succeeded", who, charges, orderID)
	}

	// The events: the relay publishes payment.succeeded, the orders
	// consumer marks the order paid (whichever server's relay and
	// consumer). The webhook: the simulator delivered charge.succeeded
	// and the server accepted it.
	if err := e.waitFor(ctx, "order "+orderID+" paid (its events published and consumed)", func() (bool, string, error) {
		var status string
		err := e.db.QueryRow(ctx, "SELECT status FROM orders WHERE id = $1", orderID).Scan(&status)
		return status == "paid", "status " + status, err
	}); err != nil {
		return a, err
	}
	if err := e.waitFor(ctx, "the webhook of order "+orderID+"'s charge accepted", func() (bool, string, error) {
		var seen []string
		for _, d := range e.sim.Simulator.Deliveries() {
			seen = append(seen, fmt.Sprintf("%s %s %d", d.EventID, d.Type, d.Status))
		}
		events := e.sim.Simulator.Events()
		if len(events) == 0 {
			return false, "no event yet", nil
		}
		last := events[len(events)-1].ID
		for _, d := range e.sim.Simulator.Deliveries() {
			if d.EventID == last && d.Status >= 200 && d.Status < 300 {
				return true, "", nil
			}
		}
		return false, "deliveries " + strings.Join(seen, ", "), nil
	}); err != nil {
		return a, err
	}
	return a, nil
}

// oldReaper backdates the inbox, the published outbox rows and one key
// past their retention, and waits for the previous release's reaper to
// remove them: its statements run against the new schema (the inbox's
// horizon trigger among them).
func (e *env) oldReaper(ctx context.Context, idemKey string) error {
	for _, stmt := range []string{
		"UPDATE processed_messages SET processed_at = processed_at - interval '30 days'",
		"UPDATE outbox SET published_at = published_at - interval '30 days' WHERE published_at IS NOT NULL",
		"UPDATE idempotency_keys SET expires_at = now() - interval '2 hours', retain_until = now() - interval '1 hour' WHERE idem_key = '" + idemKey + "'",
	} {
		if _, err := e.db.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("backdate for the reaper: %s: %w", stmt, err)
		}
	}
	return e.waitFor(ctx, "api-old's reaper to prune the inbox, the published outbox and key "+idemKey, func() (bool, string, error) {
		var inbox, outbox, keys int
		var horizon bool
		err := e.db.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM processed_messages),
			(SELECT count(*) FROM outbox WHERE published_at IS NOT NULL),
			(SELECT count(*) FROM idempotency_keys WHERE idem_key = $1),
			(SELECT pruned_through IS NOT NULL FROM processed_messages_horizon)`, idemKey).Scan(&inbox, &outbox, &keys, &horizon)
		state := fmt.Sprintf("inbox rows %d, published outbox rows %d, key rows %d, inbox horizon set %v", inbox, outbox, keys, horizon)
		return inbox == 0 && outbox == 0 && keys == 0 && horizon, state, err
	})
}

// count checks that query counts want rows.
func (e *env) count(ctx context.Context, what string, want int, query string) error {
	var n int
	if err := e.db.QueryRow(ctx, query).Scan(&n); err != nil {
		return fmt.Errorf("count %s: %w", what, err)
	}
	if n != want {
		return fmt.Errorf("%d %s, want %d", n, what, want)
	}
	return nil
}

// waitFor polls cond until it holds, for at most settle.
func (e *env) waitFor(ctx context.Context, what string, cond func() (bool, string, error)) error {
	deadline := time.Now().Add(settle)
	for {
		ok, state, err := cond()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waited %s for %s; last seen: %s", settle, what, state)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// idOf is the id of a created resource.
func idOf(a answer) (string, error) {
	var v struct{ ID string }
	if err := json.Unmarshal(a.body, &v); err != nil || v.ID == "" {
		return "", errors.Join(fmt.Errorf("no id in %s", a), err)
	}
	return v.ID, nil
}

// lastLine is the last non-empty line of out.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}
