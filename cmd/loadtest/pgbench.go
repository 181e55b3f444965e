package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/dbmigrate"
	"github.com/idemref/payments/internal/tooling/pgtmp"
)

// The -pgbench mode measures what one POST /v1/orders costs PostgreSQL,
// without HTTP or the API: pgbench sends the create's statements, pipelined
// in the round trips the API uses (the statement list of the load
// benchmark), and variants of them, each without one piece of the pattern.
// For each, the CPU the PostgreSQL backends spent per transaction is read
// from the postmaster's children's times (/proc/PID/stat): every backend is
// counted once pgbench has disconnected it, and nothing else runs on the
// private cluster (autovacuum is off), so the figure is PostgreSQL's own
// work whatever else the machine does. The cluster is not durable (the
// WAL flush is not what is compared), and plans are generic, as the API's
// prepared statements are after their fifth execution
// (pg_prepared_statements shows it); with the literals written here
// PostgreSQL would otherwise keep planning some statements afresh on some
// connections, and the figures would be bimodal.
//
// The statements mirror IdemKeyClaim, OrderCreate and IdemKeyComplete in
// db/queries, with the API's parameters written as literals; keep them in
// step when those change. The variant limit is the least an idempotent
// create can write: the order and the key row inserted once, already
// completed with the response IdemKeyComplete records; create / limit is
// what the pattern as built costs over that floor (P7).

// pgbenchVariant is one transaction script.
type pgbenchVariant struct {
	name, what string
	script     string
}

const (
	pgbenchTenant = "'11111111-1111-4111-8111-111111111111'::uuid"
	pgbenchKey    = "('k' || CAST(CAST(:k AS bigint) AS text))"
	pgbenchRef    = "('r' || CAST(CAST(:k AS bigint) AS text))"
)

// pgbenchVariants are the scripts, the baseline first.
func pgbenchVariants() []pgbenchVariant {
	claim := func(table string, reclaim bool) string {
		insert := "INSERT INTO " + table + " (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, expires_at, retain_until, recovery_point, locked_until, lease_generation) " +
			"VALUES (" + pgbenchTenant + ", 'POST /v1/orders', " + pgbenchKey + ", decode(repeat('ab', 32), 'hex'), 1, now() + interval '1 day', now() + interval '3 days', NULL, NULL, 0) " +
			"ON CONFLICT (tenant_id, endpoint, idem_key) DO NOTHING RETURNING lease_generation"
		if !reclaim {
			return insert + ";"
		}
		return "WITH inserted AS (" + insert + "), reclaimed AS (UPDATE " + table + " SET fingerprint = decode(repeat('ab', 32), 'hex'), fingerprint_version = 1, " +
			"state = 'in_progress', response_status = NULL, response_headers = NULL, response_body = NULL, resource_id = NULL, resource_location = NULL, " +
			"created_at = now(), completed_at = NULL, expires_at = now() + interval '1 day', retain_until = now() + interval '3 days', recovery_point = NULL, " +
			"locked_until = NULL, lease_generation = 0 WHERE tenant_id = " + pgbenchTenant + " AND endpoint = 'POST /v1/orders' AND idem_key = " + pgbenchKey +
			" AND retain_until <= now() AND state <> 'in_progress' AND NOT EXISTS (SELECT 1 FROM inserted) RETURNING lease_generation) " +
			"SELECT lease_generation FROM inserted UNION ALL SELECT lease_generation FROM reclaimed;"
	}
	order := "INSERT INTO orders (tenant_id, id, reference, customer_id, amount, currency, description, metadata) VALUES (" + pgbenchTenant +
		", gen_random_uuid(), " + pgbenchRef + ", 'cus_1', 2500, 'EUR', '', '{}') ON CONFLICT ON CONSTRAINT orders_tenant_reference_key DO NOTHING RETURNING *;"
	// An order's recorded response is about 420 bytes; its Location and
	// Idempotency-Expires live in resource_location and expires_at.
	body := `'\x` + strings.Repeat("7b", 420) + `'`
	const headers = `'{"Content-Type": ["application/json"]}'::jsonb`
	complete := func(table string) string {
		return "UPDATE " + table + " SET state = 'completed', response_status = 201, response_headers = " + headers +
			", response_body = " + body +
			", resource_location = '/v1/orders/x', completed_at = now() WHERE tenant_id = " + pgbenchTenant +
			" AND endpoint = 'POST /v1/orders' AND idem_key = " + pgbenchKey + " AND state = 'in_progress' RETURNING expires_at;"
	}
	// The key row as the record leaves it, written by one INSERT: a second
	// request under the key fails on the primary key and rolls back.
	completed := "INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, state, response_status, " +
		"response_headers, response_body, resource_location, completed_at, expires_at, retain_until, recovery_point, locked_until, lease_generation) " +
		"VALUES (" + pgbenchTenant + ", 'POST /v1/orders', " + pgbenchKey + ", decode(repeat('ab', 32), 'hex'), 1, 'completed', 201, " +
		headers + ", " + body + ", '/v1/orders/x', now(), now() + interval '1 day', now() + interval '3 days', NULL, NULL, 0) RETURNING expires_at;"
	// roundTrips joins the statements of each round trip into one pipeline.
	roundTrips := func(trips ...[]string) string {
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
	create := func(table string, lockTimeout, reclaim, savepoint bool) string {
		when := func(ok bool, s string) string {
			if ok {
				return s
			}
			return ""
		}
		return roundTrips(
			[]string{"BEGIN;", when(lockTimeout, "SELECT set_config('lock_timeout', '2000ms', true);"), claim(table, reclaim)},
			[]string{when(savepoint, "SAVEPOINT sp_1;"), order},
			[]string{when(savepoint, "RELEASE SAVEPOINT sp_1;"), complete(table), "COMMIT;"},
		)
	}
	return []pgbenchVariant{
		{"baseline", "BEGIN, insert the order, COMMIT, in 1 round trip", roundTrips([]string{"BEGIN;", order, "COMMIT;"})},
		{"baseline-3rt", "the same in 3 round trips", roundTrips([]string{"BEGIN;", "SELECT 1;"}, []string{order}, []string{"SELECT 1;", "COMMIT;"})},
		{"limit", "BEGIN, the order, the key row inserted completed, COMMIT: the floor", roundTrips([]string{"BEGIN;", order, completed, "COMMIT;"})},
		{"create", "the idempotent create, as the API sends it", create("idempotency_keys", true, true, true)},
		{"no-lock-timeout", "... without the lock_timeout statement", create("idempotency_keys", false, true, true)},
		{"no-savepoint", "... without the savepoint", create("idempotency_keys", true, true, false)},
		{"no-reclaim", "... with a claim without its reclaim branch (E3)", create("idempotency_keys", true, false, true)},
		{"no-fk", "... without the key table's foreign key to tenants", create("keys_nofk", true, true, true)},
		{"no-checks", "... without the key table's CHECK constraints", create("keys_nochecks", true, true, true)},
		{"no-guard-trigger", "... without the state-transition trigger (000012)", create("keys_notrigger", true, true, true)},
	}
}

// pgbenchCopy makes a copy of the key table without one piece: "fk",
// "checks" or "trigger". LIKE copies neither the foreign key nor the
// trigger, so every copy gets back those it keeps, as migrations 000002
// and 000012 define them.
func pgbenchCopy(table, without string) []string {
	like := "INCLUDING ALL"
	if without == "checks" {
		like = "INCLUDING DEFAULTS INCLUDING INDEXES"
	}
	out := []string{"CREATE TABLE " + table + " (LIKE idempotency_keys " + like + ")"}
	if without != "fk" {
		out = append(out, "ALTER TABLE "+table+" ADD FOREIGN KEY (tenant_id) REFERENCES tenants (id) ON DELETE CASCADE")
	}
	if without != "trigger" {
		out = append(out, "CREATE TRIGGER "+table+"_guard_state BEFORE UPDATE OF state ON "+table+
			" FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION guard_state_transition('key')")
	}
	return out
}

// pgbenchSetup makes the tables the variants write beside the schema's.
// Autovacuum is off (its workers are children of the postmaster too, and
// would be counted).
var pgbenchSetup = slices.Concat(
	[]string{"INSERT INTO tenants (id, name) VALUES (" + pgbenchTenant + ", 'pgbench')"},
	pgbenchCopy("keys_nofk", "fk"),
	pgbenchCopy("keys_nochecks", "checks"),
	pgbenchCopy("keys_notrigger", "trigger"),
)

// pgbenchReset refills the tables before each run with a few minutes'
// worth of traffic and analyzes them, so the plans are those of a running
// service (on an empty table the planner guesses otherwise).
var pgbenchReset = []string{
	"TRUNCATE orders, idempotency_keys, keys_nofk, keys_nochecks, keys_notrigger CASCADE",
	"INSERT INTO orders (tenant_id, id, reference, customer_id, amount, currency) SELECT " + pgbenchTenant +
		", gen_random_uuid(), 'fill-' || i, 'cus_1', 100, 'EUR' FROM generate_series(1, 50000) AS i",
	pgbenchFill("idempotency_keys"), pgbenchFill("keys_nofk"), pgbenchFill("keys_nochecks"), pgbenchFill("keys_notrigger"),
	"VACUUM ANALYZE orders, idempotency_keys, keys_nofk, keys_nochecks, keys_notrigger",
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
	conn, err := pgx.Connect(ctx, cluster.URL("postgres"))
	if err != nil {
		return err
	}
	var version string
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version')").Scan(&version); err != nil {
		return err
	}
	for _, sql := range []string{"CREATE DATABASE payments", "ALTER SYSTEM SET autovacuum = off", "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	conn.Close(ctx)
	url := cluster.URL("payments")
	if err := dbmigrate.Up(ctx, url); err != nil {
		return err
	}
	if conn, err = pgx.Connect(ctx, url); err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, sql := range pgbenchSetup {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	// The postmaster is the parent of our backend.
	var backend int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return err
	}
	postmaster, err := parentPid(backend)
	if err != nil {
		return err
	}

	variants := pgbenchVariants()
	for _, v := range variants {
		if err := os.WriteFile(filepath.Join(work, v.name+".sql"), []byte(v.script), 0o600); err != nil {
			return err
		}
	}
	const clients = 2
	tx := 6000
	if o.short {
		tx = 500
	}
	fmt.Fprintf(stdout, "loadtest -pgbench: PostgreSQL %s (fsync off), %d rounds of %d transactions per variant on %d connections, generic plans\n",
		version, o.rounds, clients*tx, clients)
	cpu := make(map[string]series)
	for round := 1; round <= o.rounds; round++ {
		for _, v := range variants {
			// Every run starts from the same tables, so none pays for the
			// growth (and the evictions) of the runs before it.
			for _, sql := range pgbenchReset {
				if _, err := conn.Exec(ctx, sql); err != nil {
					return fmt.Errorf("%s: %w", sql, err)
				}
			}
			before, err := childrenCPU(postmaster)
			if err != nil {
				return err
			}
			cmd := exec.CommandContext(ctx, pgbench, "-n", "-M", "prepared", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(clients),
				"-t", strconv.Itoa(tx), "-f", filepath.Join(work, v.name+".sql"), url)
			cmd.Env = append(os.Environ(), "PGOPTIONS=-c plan_cache_mode=force_generic_plan")
			out, err := cmd.CombinedOutput()
			if err != nil || strings.Contains(string(out), "error") {
				return fmt.Errorf("pgbench %s: %w\n%s", v.name, err, out)
			}
			after, err := childrenCPU(postmaster)
			if err != nil {
				return err
			}
			cpu[v.name] = append(cpu[v.name], after-before)
		}
		fmt.Fprintf(stdout, "round %d/%d done\n", round, o.rounds)
	}
	fmt.Fprintf(stdout, "\nPostgreSQL CPU per transaction, µs, median (range) over %d rounds:\n", o.rounds)
	us := make(map[string]series)
	for _, v := range variants {
		per := make(series, len(cpu[v.name]))
		for i, seconds := range cpu[v.name] {
			per[i] = seconds * 1e6 / float64(clients*tx)
		}
		us[v.name] = per
		fmt.Fprintf(stdout, "  %-16s %-18s %s\n", v.name, per.format(0), v.what)
	}
	// Ratios and differences are taken within a round, like the load
	// benchmark's: the variants of one round ran minutes apart at most.
	overLimit := ratio(us["create"], us["limit"])
	trigger := make(series, 0, o.rounds)
	for i := range min(len(us["create"]), len(us["no-guard-trigger"])) {
		trigger = append(trigger, us["create"][i]-us["no-guard-trigger"][i])
	}
	fmt.Fprintf(stdout, "\nper round, median (range):\n")
	fmt.Fprintf(stdout, "  create / limit            %-18s target <= 1.15 (P7)\n", overLimit.format(2))
	fmt.Fprintf(stdout, "  the trigger, µs / create  %-18s create - no-guard-trigger\n", trigger.format(0))
	fmt.Fprintf(stdout, "\npgbench: baseline_us=%.0f limit_us=%.0f create_us=%.0f create_over_limit=%.2f\n",
		us["baseline"].median(), us["limit"].median(), us["create"].median(), overLimit.median())
	return nil
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
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: count fields
	// after its closing parenthesis (field 2).
	_, rest, ok := strings.Cut(string(stat), ") ")
	if !ok {
		return 0, fmt.Errorf("unreadable /proc/%d/stat", pid)
	}
	fields := strings.Fields(rest)
	if len(fields) < 15 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	var ticks float64
	for _, f := range fields[13:15] { // fields 16 and 17: cutime, cstime
		n, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	return ticks / clockTicks, nil
}

// clockTicks is USER_HZ, the unit of /proc's times: 100 on every Linux
// architecture Go supports.
const clockTicks = 100
