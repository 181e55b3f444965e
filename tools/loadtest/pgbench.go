package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/dbmigrate"
	"github.com/idemref/payments/internal/tooling/pgtmp"
)

// The -pgbench mode measures what one POST /v1/orders costs PostgreSQL,
// without HTTP or the API: pgbench sends the create's statements, pipelined
// in the round trips the API uses (the statement list of the load
// benchmark), and variants of them: the create without one piece, and
// other shapes of it. For each, the CPU the PostgreSQL backends spent per
// transaction is read from the postmaster's children's times
// (/proc/PID/stat): a backend's CPU is added there once it has exited and
// the postmaster has reaped it, which the run waits for (pgbenchSettle),
// and nothing else runs on the private cluster (autovacuum is off), so the
// figure is PostgreSQL's own work whatever else the machine does. The
// cluster is not durable (the WAL flush is not what is compared), and
// plans are generic, as the API's prepared statements are after their
// fifth execution (pg_prepared_statements shows it); with the literals
// written here PostgreSQL would otherwise keep planning some statements
// afresh on some connections, and the figures would be bimodal.
//
// The statements mirror IdemKeyGet, TxSetLockTimeout, OrderCreate and
// IdemKeyClaimCompleted in db/queries, with the API's parameters written as
// literals; keep them in step when those change. The variant limit is the
// least an idempotent create can write: the order and the key row inserted
// once, already completed with the response the create records; create /
// limit is what the pattern as built costs over that floor (P7).
// claim-first is the shape the one-transaction path had before: the key
// claimed in progress first (IdemKeyClaim, with its reclaim branch), then
// the order, then the response recorded by an UPDATE of the key row.

// pgbenchVariant is one transaction script.
type pgbenchVariant struct {
	name, what string
	script     string
}

const (
	pgbenchTenant   = "'11111111-1111-4111-8111-111111111111'::uuid"
	pgbenchKey      = "('k' || CAST(CAST(:k AS bigint) AS text))"
	pgbenchRef      = "('r' || CAST(CAST(:k AS bigint) AS text))"
	pgbenchEndpoint = "'POST /v1/orders'"
)

// pgbenchKeyColumns are the key table's columns in its order, as sqlc's
// embed in IdemKeyGet lists them.
var pgbenchKeyColumns = []string{
	"tenant_id", "endpoint", "idem_key", "fingerprint", "fingerprint_version", "state", "response_status",
	"response_headers", "response_body", "created_at", "completed_at", "expires_at", "recovery_point",
	"locked_until", "lease_generation", "resource_id", "retain_until", "resource_location",
}

// pgbenchVariants are the scripts, the baseline first.
func pgbenchVariants() []pgbenchVariant {
	q := newPgbenchSQL()
	return []pgbenchVariant{
		{"baseline", "BEGIN, insert the order, COMMIT, in 1 round trip", pgbenchRoundTrips([]string{"BEGIN READ WRITE;", q.order, "COMMIT;"})},
		{"baseline-3rt", "the same in 3 round trips", pgbenchRoundTrips([]string{"BEGIN READ WRITE;", "SELECT 1;"}, []string{q.order}, []string{"SELECT 1;", "COMMIT;"})},
		{"limit", "BEGIN, the order, the key row inserted completed, COMMIT: the floor", pgbenchRoundTrips([]string{"BEGIN READ WRITE;", q.order, q.limitCompleted, "COMMIT;"})},
		{"create", "the API's create: lookup ahead of BEGIN with the order, key row inserted completed last", q.create("idempotency_keys", true, true, false, false)},
		{"no-lock-timeout", "... without the lock_timeout statement", q.create("idempotency_keys", true, false, false, false)},
		{"savepoint", "... with the order in a savepoint (the create until 2026-12-03)", q.create("idempotency_keys", true, true, true, false)},
		{"lookup-apart", "... with the pre-read in a round trip of its own (the create until 2026-12-03)", q.create("idempotency_keys", true, true, false, true)},
		{"no-lookup", "... without the lookup (the pre-read and idem_key_absent)", q.create("idempotency_keys", false, true, false, false)},
		{"no-fk", "... without the key table's foreign key to tenants", q.create("keys_nofk", true, true, false, false)},
		{"no-checks", "... without the key table's CHECK constraints", q.create("keys_nochecks", true, true, false, false)},
		{"claim-first", "the old shape: claim (and reclaim) first, order, UPDATE to completed", pgbenchRoundTrips(
			[]string{"BEGIN READ WRITE;", pgbenchLockTimeout, q.claim},
			[]string{"SAVEPOINT sp_1;", q.order},
			[]string{"RELEASE SAVEPOINT sp_1;", q.complete, "COMMIT;"},
		)},
		{"advisory-lock", "advisory lock on the key and pre-read, order, key row inserted completed", pgbenchRoundTrips(
			[]string{"BEGIN READ WRITE;", pgbenchLockTimeout, q.advisory, q.preRead("idempotency_keys")},
			[]string{"SAVEPOINT sp_1;", q.order},
			[]string{"RELEASE SAVEPOINT sp_1;", q.completed("idempotency_keys"), "COMMIT;"},
		)},
	}
}

// pgbenchLockTimeout is TxSetLockTimeout with the API's lock timeout.
const pgbenchLockTimeout = "SELECT set_config('lock_timeout', '2000ms', true);"

// pgbenchSQL holds the statements the variants are made of, on the
// benchmark's tenant, endpoint and key (:k).
type pgbenchSQL struct {
	where, order, claim, complete, limitCompleted, advisory, absent string
	// body and headers are an order's recorded response.
	body, headers string
}

// newPgbenchSQL writes the statements out.
func newPgbenchSQL() pgbenchSQL {
	var q pgbenchSQL
	q.where = " WHERE tenant_id = " + pgbenchTenant + " AND endpoint = " + pgbenchEndpoint + " AND idem_key = " + pgbenchKey
	// The old claim (IdemKeyClaim as the one-transaction path called it:
	// no lease), with its reclaim branch for a forgotten key (E3).
	q.claim = "WITH inserted AS (INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, expires_at, retain_until, recovery_point, locked_until, lease_generation) " +
		"VALUES (" + pgbenchTenant + ", " + pgbenchEndpoint + ", " + pgbenchKey + ", decode(repeat('ab', 32), 'hex'), 1, now() + interval '1 day', now() + interval '3 days', NULL, NULL, 0) " +
		"ON CONFLICT (tenant_id, endpoint, idem_key) DO NOTHING RETURNING lease_generation), " +
		"reclaimed AS (UPDATE idempotency_keys SET fingerprint = decode(repeat('ab', 32), 'hex'), fingerprint_version = 1, " +
		"state = 'in_progress', response_status = NULL, response_headers = NULL, response_body = NULL, resource_id = NULL, resource_location = NULL, " +
		"created_at = now(), completed_at = NULL, expires_at = now() + interval '1 day', retain_until = now() + interval '3 days', recovery_point = NULL, " +
		"locked_until = NULL, lease_generation = 0" + q.where +
		" AND idem_forgotten(state, retain_until) AND NOT EXISTS (SELECT 1 FROM inserted) RETURNING lease_generation) " +
		"SELECT lease_generation FROM inserted UNION ALL SELECT lease_generation FROM reclaimed;"
	q.order = "INSERT INTO orders (tenant_id, id, reference, customer_id, amount, currency, description, metadata) VALUES (" + pgbenchTenant +
		", gen_random_uuid(), " + pgbenchRef + ", 'cus_1', 2500, 'EUR', '', '{}') ON CONFLICT ON CONSTRAINT orders_tenant_reference_key DO NOTHING RETURNING *;"
	// An order's recorded response is about 420 bytes; its Location and
	// Idempotency-Expires live in resource_location and expires_at.
	q.body = `'\x` + strings.Repeat("7b", 420) + `'`
	q.headers = `'{"Content-Type": ["application/json"]}'::jsonb`
	// The old record step: the claimed row updated with the response.
	q.complete = "UPDATE idempotency_keys SET state = 'completed', response_status = 201, response_headers = " + q.headers +
		", response_body = " + q.body + ", resource_location = '/v1/orders/x', completed_at = now()" + q.where +
		" AND state = 'in_progress' RETURNING expires_at;"
	// The key row as the record leaves it, written by one INSERT: a second
	// request under the key fails on the primary key and rolls back. The
	// limit names the lease columns too, with their defaults.
	q.limitCompleted = "INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, state, response_status, " +
		"response_headers, response_body, resource_location, completed_at, expires_at, retain_until, recovery_point, locked_until, lease_generation) " +
		"VALUES (" + pgbenchTenant + ", " + pgbenchEndpoint + ", " + pgbenchKey + ", decode(repeat('ab', 32), 'hex'), 1, 'completed', 201, " +
		q.headers + ", " + q.body + ", '/v1/orders/x', now(), now() + interval '1 day', now() + interval '3 days', NULL, NULL, 0) RETURNING expires_at;"
	// Duplicates of a key wait for each other before executing: a lock on
	// a hash of the tenant, endpoint and key, held to the end of the
	// transaction.
	q.advisory = "SELECT pg_advisory_xact_lock(hashtextextended(" + pgbenchTenant + "::text || ' ' || " + pgbenchEndpoint + " || ' ' || " + pgbenchKey + ", 0));"
	// The statement that stops the round trip when the key has a row
	// (IdemKeyAbsent): a fresh key passes.
	q.absent = "SELECT idem_key_absent(" + pgbenchTenant + ", " + pgbenchEndpoint + ", " + pgbenchKey + ");"
	return q
}

// preRead is IdemKeyGet on table: a fresh key finds nothing. on_primary()
// is its one-time check that the server is not in recovery.
func (q pgbenchSQL) preRead(table string) string {
	return "SELECT " + strings.Join(pgbenchKeyColumns, ", ") +
		", idem_result_expired(state, expires_at)::boolean AS result_expired, idem_forgotten(state, retain_until)::boolean AS forgotten FROM " +
		table + strings.Replace(q.where, " WHERE ", " WHERE on_primary() AND ", 1) + ";"
}

// completed is the key row as IdemKeyClaimCompleted writes it, on table:
// the last statement of the new shape.
func (q pgbenchSQL) completed(table string) string {
	return "INSERT INTO " + table + " (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, state, response_status, " +
		"response_headers, response_body, resource_location, completed_at, expires_at, retain_until) " +
		"VALUES (" + pgbenchTenant + ", " + pgbenchEndpoint + ", " + pgbenchKey + ", decode(repeat('ab', 32), 'hex'), 1, 'completed', 201, " +
		q.headers + ", " + q.body + ", '/v1/orders/x', now(), now() + interval '1 day', now() + interval '3 days') RETURNING expires_at;"
}

// create is the new shape, on table, with or without each piece: the
// lookup (the pre-read and idem_key_absent) ahead of BEGIN, with the lock
// timeout and the order, then the key row inserted completed and COMMIT.
// savepoint puts the order in a savepoint, as the create did until
// 2026-12-03; separate sends the lookup in a round trip of its own, as it
// did until 2026-12-03 (without idem_key_absent then).
func (q pgbenchSQL) create(table string, lookup, lockTimeouts, savepoint, separate bool) string {
	first := []string{"BEGIN READ WRITE;", when(lockTimeouts, pgbenchLockTimeout), when(savepoint, "SAVEPOINT sp_1;"), q.order}
	last := []string{when(savepoint, "RELEASE SAVEPOINT sp_1;"), q.completed(table), "COMMIT;"}
	switch {
	case lookup && separate:
		return pgbenchRoundTrips([]string{q.preRead(table)}, first, last)
	case lookup:
		return pgbenchRoundTrips(append([]string{q.preRead(table), q.absent}, first...), last)
	}
	return pgbenchRoundTrips(first, last)
}

// pgbenchRoundTrips joins the statements of each round trip into one
// pipeline; empty statements are the pieces a variant leaves out.
func pgbenchRoundTrips(trips ...[]string) string {
	var b strings.Builder
	b.WriteString("\\set k random(1, 100000000000000)\n")
	for _, trip := range trips {
		b.WriteString("\\startpipeline\n")
		for _, s := range trip {
			if s != "" {
				b.WriteString(s + "\n")
			}
		}
		b.WriteString("\\endpipeline\n")
	}
	return b.String()
}

// when is s when ok, else the empty statement.
func when(ok bool, s string) string {
	if ok {
		return s
	}
	return ""
}

// pgbenchCopy makes a copy of the key table without one piece: "fk" or
// "checks". LIKE copies neither the foreign key nor the trigger, so every
// copy gets back those it keeps, as migrations 000002 and 000012 define
// them. (No variant goes without the trigger: the create never updates a
// key's state, so it never fires.)
func pgbenchCopy(table, without string) []string {
	like := "INCLUDING ALL"
	if without == "checks" {
		like = "INCLUDING DEFAULTS INCLUDING INDEXES"
	}
	out := []string{"CREATE TABLE " + table + " (LIKE idempotency_keys " + like + ")"}
	if without != "fk" {
		out = append(out, "ALTER TABLE "+table+" ADD FOREIGN KEY (tenant_id) REFERENCES tenants (id) ON DELETE CASCADE")
	}
	return append(out, "CREATE TRIGGER "+table+"_guard_state BEFORE UPDATE OF state ON "+table+
		" FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION guard_state_transition('key')")
}

// pgbenchSetup makes the tables the variants write beside the schema's.
// Autovacuum is off (its workers are children of the postmaster too, and
// would be counted).
var pgbenchSetup = slices.Concat(
	[]string{"INSERT INTO tenants (id, name) VALUES (" + pgbenchTenant + ", 'pgbench')"},
	pgbenchCopy("keys_nofk", "fk"),
	pgbenchCopy("keys_nochecks", "checks"),
)

// pgbenchReset refills the tables before each run with a few minutes'
// worth of traffic and analyzes them, so the plans are those of a running
// service (on an empty table the planner guesses otherwise).
var pgbenchReset = []string{
	"TRUNCATE orders, idempotency_keys, keys_nofk, keys_nochecks CASCADE",
	"INSERT INTO orders (tenant_id, id, reference, customer_id, amount, currency) SELECT " + pgbenchTenant +
		", gen_random_uuid(), 'fill-' || i, 'cus_1', 100, 'EUR' FROM generate_series(1, 50000) AS i",
	pgbenchFill("idempotency_keys"), pgbenchFill("keys_nofk"), pgbenchFill("keys_nochecks"),
	"VACUUM ANALYZE orders, idempotency_keys, keys_nofk, keys_nochecks",
	"CHECKPOINT",
}

func pgbenchFill(table string) string {
	return "INSERT INTO " + table + " (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, state, response_status, " +
		"response_headers, response_body, completed_at, expires_at, retain_until) SELECT " + pgbenchTenant +
		", 'POST /v1/orders', 'fill-' || i, decode(repeat('ab', 32), 'hex'), 1, 'completed', 201, '{}', '\\x7b7d', now(), " +
		"now() + interval '1 day', now() + interval '3 days' FROM generate_series(1, 50000) AS i"
}

func runPgbench(ctx context.Context, o options, stdout io.Writer) (err error) {
	pgbench, err := exec.LookPath("pgbench")
	if err != nil {
		return fmt.Errorf("-pgbench needs pgbench on PATH (Debian: postgresql-client): %w", err)
	}
	dataDir, err := os.MkdirTemp("", "loadtest-pg-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dataDir)
	work, err := os.MkdirTemp("", "loadtest-pgbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	// Not durable: WAL flushes and full-page images would be counted at
	// random, whenever a checkpoint falls, and the figure is the CPU of the
	// statements themselves.
	cluster, err := pgtmp.Start(ctx, pgtmp.Options{Dir: dataDir, Fast: true})
	if err != nil {
		return err
	}
	defer func() {
		if serr := cluster.Stop(); serr != nil {
			err = errors.Join(err, serr)
		}
	}()
	b := &pgbenchBench{pgbench: pgbench, work: work, clients: 2, tx: 6000}
	if o.short {
		b.tx = 500
	}
	version, err := b.prepare(ctx, cluster)
	if b.conn != nil {
		defer b.conn.Close(context.WithoutCancel(ctx))
	}
	if err != nil {
		return err
	}

	variants := pgbenchVariants()
	for _, v := range variants {
		if err := os.WriteFile(filepath.Join(work, v.name+".sql"), []byte(v.script), 0o600); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "loadtest -pgbench: PostgreSQL %s (fsync off), %d rounds of %d transactions per variant on %d connections, generic plans\n",
		version, o.rounds, b.clients*b.tx, b.clients)
	us := make(map[string]series)
	for round := 1; round <= o.rounds; round++ {
		figures := make(map[string]float64, len(variants))
		for _, v := range variants {
			if figures[v.name], err = b.cpuPerTransaction(ctx, v); err != nil {
				return err
			}
		}
		if err := pgbenchPlausible(figures); err != nil {
			return fmt.Errorf("round %d: %w", round, err)
		}
		for _, v := range variants {
			us[v.name] = append(us[v.name], figures[v.name])
		}
		fmt.Fprintf(stdout, "round %d/%d done\n", round, o.rounds)
	}
	pgbenchReport(stdout, o.rounds, variants, us)
	return nil
}

// pgbenchBench is a PostgreSQL prepared for pgbench, and how each variant
// runs on it.
type pgbenchBench struct {
	pgbench, work, url string
	conn               *pgx.Conn // on the payments database
	// postmaster is the server's pid, resident its children while it is
	// idle.
	postmaster  int
	resident    []int
	clients, tx int
}

// prepare creates and migrates the payments database on cluster, with
// autovacuum off, runs pgbenchSetup there and finds the server's resident
// processes. It returns the server's version.
func (b *pgbenchBench) prepare(ctx context.Context, cluster *pgtmp.Cluster) (string, error) {
	conn, err := pgx.Connect(ctx, cluster.URL("postgres"))
	if err != nil {
		return "", err
	}
	var version string
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version')").Scan(&version); err != nil {
		return "", err
	}
	for _, sql := range []string{"CREATE DATABASE payments", "ALTER SYSTEM SET autovacuum = off", "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return "", fmt.Errorf("%s: %w", sql, err)
		}
	}
	conn.Close(ctx)
	b.url = cluster.URL("payments")
	if err := dbmigrate.Up(ctx, b.url); err != nil {
		return "", err
	}
	if b.conn, err = pgx.Connect(ctx, b.url); err != nil {
		return "", err
	}
	for _, sql := range pgbenchSetup {
		if _, err := b.conn.Exec(ctx, sql); err != nil {
			return "", fmt.Errorf("%s: %w", sql, err)
		}
	}
	// The postmaster is the parent of our backend. Its children once the
	// server is idle (the auxiliary processes and our backend) are the
	// resident ones: every measurement starts and ends with exactly those.
	var backend int
	if err := b.conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return "", err
	}
	if b.postmaster, err = parentPid(backend); err != nil {
		return "", err
	}
	if b.resident, err = pgbenchResident(ctx, b.postmaster); err != nil {
		return "", err
	}
	if !slices.Contains(b.resident, backend) {
		return "", fmt.Errorf("-pgbench: the postmaster's children %v do not include our backend %d", b.resident, backend)
	}
	return version, nil
}

// cpuPerTransaction runs variant v's script on fresh tables and returns
// the server's CPU per transaction, in µs.
func (b *pgbenchBench) cpuPerTransaction(ctx context.Context, v pgbenchVariant) (float64, error) {
	// Every run starts from the same tables, so none pays for the
	// growth (and the evictions) of the runs before it.
	for _, sql := range pgbenchReset {
		if _, err := b.conn.Exec(ctx, sql); err != nil {
			return 0, fmt.Errorf("%s: %w", sql, err)
		}
	}
	// Processes the reset started (parallel workers of its
	// VACUUM) are counted when reaped: before the reading, not
	// after it.
	if err := pgbenchSettle(ctx, b.postmaster, b.resident); err != nil {
		return 0, fmt.Errorf("before pgbench %s: %w", v.name, err)
	}
	before, err := childrenCPU(b.postmaster)
	if err != nil {
		return 0, err
	}
	cmd := exec.CommandContext(ctx, b.pgbench, "-n", "-M", "prepared", "-c", strconv.Itoa(b.clients), "-j", strconv.Itoa(b.clients),
		"-t", strconv.Itoa(b.tx), "-f", filepath.Join(b.work, v.name+".sql"), b.url)
	cmd.Env = append(os.Environ(), "PGOPTIONS=-c plan_cache_mode=force_generic_plan")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.Contains(string(out), "error") {
		return 0, fmt.Errorf("pgbench %s: %w\n%s", v.name, err, out)
	}
	// pgbench returns once it has sent its backends Terminate,
	// not once they have exited: until the postmaster has reaped
	// them their CPU is in no reading yet, and a reading now would
	// miss it (a backend's share comes all at once).
	if err := pgbenchSettle(ctx, b.postmaster, b.resident); err != nil {
		return 0, fmt.Errorf("after pgbench %s: %w", v.name, err)
	}
	after, err := childrenCPU(b.postmaster)
	if err != nil {
		return 0, err
	}
	return (after - before) * 1e6 / float64(b.clients*b.tx), nil
}

// pgbenchReport writes each variant's CPU per transaction over the rounds,
// then the ratios and differences that answer P7.
func pgbenchReport(stdout io.Writer, rounds int, variants []pgbenchVariant, us map[string]series) {
	fmt.Fprintf(stdout, "\nPostgreSQL CPU per transaction, µs, median (range) over %d rounds:\n", rounds)
	for _, v := range variants {
		fmt.Fprintf(stdout, "  %-16s %-18s %s\n", v.name, us[v.name].format(0), v.what)
	}
	// Ratios and differences are taken within a round, like the load
	// benchmark's: the variants of one round ran minutes apart at most.
	overLimit := ratio(us["create"], us["limit"])
	claimFirstOverLimit := ratio(us["claim-first"], us["limit"])
	overClaimFirst := ratio(us["create"], us["claim-first"])
	fmt.Fprintf(stdout, "\nper round, median (range):\n")
	fmt.Fprintf(stdout, "  create / limit               %-18s target <= 1.15 (P7)\n", overLimit.format(2))
	fmt.Fprintf(stdout, "  claim-first / limit          %-18s the old shape\n", claimFirstOverLimit.format(2))
	fmt.Fprintf(stdout, "  create / claim-first         %-18s the new shape over the old\n", overClaimFirst.format(2))
	for _, piece := range []struct{ name, variant string }{
		{"the lookup", "no-lookup"},
		{"lock_timeout", "no-lock-timeout"},
		{"the foreign key", "no-fk"},
		{"the CHECKs", "no-checks"},
	} {
		fmt.Fprintf(stdout, "  %-28s %-18s create - %s\n", piece.name+", µs / create", difference(us["create"], us[piece.variant]).format(0), piece.variant)
	}
	fmt.Fprintf(stdout, "  %-28s %-18s savepoint - create (taken off the create)\n", "the savepoint, µs / create", difference(us["savepoint"], us["create"]).format(0))
	fmt.Fprintf(stdout, "\npgbench: baseline_us=%.0f limit_us=%.0f create_us=%.0f create_over_limit=%.2f claim_first_us=%.0f claim_first_over_limit=%.2f create_over_claim_first=%.2f\n",
		us["baseline"].median(), us["limit"].median(), us["create"].median(), overLimit.median(),
		us["claim-first"].median(), claimFirstOverLimit.median(), overClaimFirst.median())
}

// difference subtracts b from a round by round, like ratio.
func difference(a, b series) series {
	out := make(series, 0, len(a))
	for i := range min(len(a), len(b)) {
		out = append(out, a[i]-b[i])
	}
	return out
}

// pgbenchPlausible checks one round's figures (µs per transaction, by
// variant) before they are kept. A backend's CPU reaches the postmaster's
// children's times only when the postmaster reaps it, all of it at once: a
// reading that misses a backend misses its whole share, and the figure
// drops to a half or nearly nothing (one round once read 2 µs for limit
// and create). A true figure cannot be that low: every variant inserts an
// order, which the cheapest, baseline, is alone, and the others cost up to
// a few times as much. So a figure that is not positive, or below a
// quarter of the round's median, is a failed measurement, and the run
// stops rather than print it. The median, not the baseline, is the
// reference so that a baseline read too low is caught as well: it is
// about half the median, twice the bound.
func pgbenchPlausible(figures map[string]float64) error {
	values := slices.Collect(maps.Values(figures))
	floor := series(values).median() / 4
	var bad []string
	for _, name := range slices.Sorted(maps.Keys(figures)) {
		if us := figures[name]; us <= 0 || us < floor {
			bad = append(bad, fmt.Sprintf("%s %.1f µs", name, us))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("implausible PostgreSQL CPU per transaction: %s, below a quarter of the round's median (%.1f µs): "+
			"some backends' CPU was not counted (not yet reaped when read), or was counted for another variant",
			strings.Join(bad, ", "), 4*floor)
	}
	return nil
}

const (
	// pgbenchQuiet is how long the postmaster's children must stay the
	// same for the server to count as idle when the resident ones are
	// taken.
	pgbenchQuiet = 500 * time.Millisecond
	// pgbenchDeadline bounds every wait for the postmaster's children.
	pgbenchDeadline = 10 * time.Second
	pgbenchPoll     = 10 * time.Millisecond
)

// pgbenchResident waits until the postmaster's children have stayed the
// same for pgbenchQuiet (the backends of the migrations have exited, the
// autovacuum launcher has seen autovacuum off) and returns them.
func pgbenchResident(ctx context.Context, pid int) ([]int, error) {
	deadline := time.Now().Add(pgbenchDeadline)
	last, err := childPids(pid)
	if err != nil {
		return nil, err
	}
	since := time.Now()
	for time.Since(since) < pgbenchQuiet {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the postmaster's children did not settle within %s (now %s)", pgbenchDeadline, describePids(last))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(pgbenchPoll):
		}
		now, err := childPids(pid)
		if err != nil {
			return nil, err
		}
		if !slices.Equal(now, last) {
			last, since = now, time.Now()
		}
	}
	return last, nil
}

// pgbenchSettle waits until pid's children are exactly resident: every
// other child has exited and been reaped, so its CPU is in pid's children's
// times (cutime counts a child only once it has been waited for, and a
// zombie is still listed as a child), and none of the resident ones has
// gone. It fails after pgbenchDeadline, naming the children that differ.
func pgbenchSettle(ctx context.Context, pid int, resident []int) error {
	return settleChildren(ctx, pid, resident, pgbenchDeadline)
}

func settleChildren(ctx context.Context, pid int, want []int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		now, err := childPids(pid)
		if err != nil {
			return err
		}
		extra, missing := pidsDiff(now, want)
		if len(extra) == 0 && len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("after %s, process %d still has children that have not exited or not been reaped: %s", timeout, pid, describePids(extra))
			if len(extra) == 0 {
				msg = fmt.Sprintf("process %d has lost children that should have stayed: %v", pid, missing)
			} else if len(missing) > 0 {
				msg += fmt.Sprintf("; and it has lost children that should have stayed: %v", missing)
			}
			return errors.New(msg)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pgbenchPoll):
		}
	}
}

// pidsDiff returns the pids of now not in want, and those of want not in
// now; both are sorted.
func pidsDiff(now, want []int) (extra, missing []int) {
	for _, p := range now {
		if _, found := slices.BinarySearch(want, p); !found {
			extra = append(extra, p)
		}
	}
	for _, p := range want {
		if _, found := slices.BinarySearch(now, p); !found {
			missing = append(missing, p)
		}
	}
	return extra, missing
}

// describePids names each pid with its command line, or as a zombie.
func describePids(pids []int) string {
	var parts []string
	for _, p := range pids {
		what := "gone"
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p)); err == nil {
			what = strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
			if what == "" {
				what = "exited, not yet reaped"
			}
		}
		parts = append(parts, fmt.Sprintf("%d (%s)", p, what))
	}
	return strings.Join(parts, ", ")
}

// childPids lists pid's children, sorted, zombies included until they are
// reaped: the union of /proc/PID/task/TID/children over pid's threads
// (each file lists the children that thread forked; the postmaster has one
// thread).
func childPids(pid int) ([]int, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	if err != nil {
		return nil, err
	}
	if len(tasks) == 0 {
		return nil, fmt.Errorf("no /proc/%d/task/*/children (Linux, CONFIG_PROC_CHILDREN)", pid)
	}
	var pids []int
	for _, path := range tasks {
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // a thread that has exited since the glob
		}
		if err != nil {
			return nil, err
		}
		some, err := parseChildren(string(b))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		pids = append(pids, some...)
	}
	slices.Sort(pids)
	return slices.Compact(pids), nil
}

// parseChildren reads a /proc/PID/task/TID/children file: pids separated
// by spaces.
func parseChildren(s string) ([]int, error) {
	var pids []int
	for _, f := range strings.Fields(s) {
		p, err := strconv.Atoi(f)
		if err != nil || p <= 0 {
			return nil, fmt.Errorf("not a pid: %q", f)
		}
		pids = append(pids, p)
	}
	return pids, nil
}

// parentPid reads the parent of pid from /proc.
func parentPid(pid int) (int, error) {
	status, err := procStatus(pid)
	if err != nil {
		return 0, fmt.Errorf("-pgbench reads the postmaster's CPU from /proc (Linux, the server on this machine): %w", err)
	}
	return strconv.Atoi(status["PPid"])
}

// childrenCPU is the user and system CPU, in seconds, of pid's children
// that have exited and been waited for (cutime + cstime, proc(5)).
func childrenCPU(pid int) (float64, error) {
	_, reaped, err := procCPU(pid)
	return reaped, err
}

// procCPU reads pid's own user and system CPU (utime + stime) and that of
// its children that have exited and been waited for (cutime + cstime),
// in seconds, from /proc/PID/stat (proc(5)).
func procCPU(pid int) (own, reaped float64, err error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The command name, in parentheses, may hold spaces: count fields
	// after its closing parenthesis (field 2).
	_, rest, ok := strings.Cut(string(stat), ") ")
	if !ok {
		return 0, 0, fmt.Errorf("unreadable /proc/%d/stat", pid)
	}
	fields := strings.Fields(rest)
	if len(fields) < 15 {
		return 0, 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	var ticks [4]float64
	for i, f := range fields[11:15] { // fields 14 to 17: utime, stime, cutime, cstime
		if ticks[i], err = strconv.ParseFloat(f, 64); err != nil {
			return 0, 0, err
		}
	}
	return (ticks[0] + ticks[1]) / clockTicks, (ticks[2] + ticks[3]) / clockTicks, nil
}

// clockTicks is USER_HZ, the unit of /proc's times: 100 on every Linux
// architecture Go supports.
const clockTicks = 100
