package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/tooling/harness"
)

// The stored-keys benchmark (-stored-keys N): what a key table holding N
// keys costs a create, against the same creates on an empty one.
//
// The empty side is the database "payments" and the load API; the full
// side is the database "payments_full" in the same cluster, filled with N
// key rows, and its own API process (the same binary, the same settings,
// started once the fill is done). Both hold the same tenants. Each round
// runs the create scenario against both, the order alternating from round
// to round, under random keys (version 4 UUIDs, as clients mint them: a
// counter's keys would all land on the same few pages of the primary key
// and hide what a full table costs), from the tenants in turn. Every create
// is checked as in the default benchmark (an execution that writes one
// order), and at the end each key table must have grown by exactly the
// creates it executed.
//
// The N rows are what a service that receives N keys per
// IDEMPOTENCY_KEY_RETENTION holds, with the default horizons:
//
//   - a third completed, each with the recorded response of a real create
//     (status, headers, body and Location copied from one the load API
//     served, under the tenant loadtest-template, of an order with a
//     description and metadata: a body of about 420 bytes), created within
//     the last IDEMPOTENCY_TTL;
//   - two thirds tombstones (state 'expired', status and Location kept,
//     no headers, no body), created between IDEMPOTENCY_TTL and
//     IDEMPOTENCY_KEY_RETENTION ago;
//   - random keys (UUIDs, see fillSQL), spread over the tenants, at most
//     keysPerTenant each, so that no tenant reaches the default key budget
//     (a service holding N keys under that budget serves at least that
//     many tenants);
//   - created_at, expires_at and retain_until evenly spaced, oldest first,
//     as a running service appends them, except that no row reaches a
//     horizon within horizonMargin of the fill: the reapers of both APIs
//     run with their defaults and find nothing due on either side, so the
//     comparison is of the table's size, not of the reaper's work
//     (BenchmarkReaperUnderLoad measures that).
//
// Only the key table is filled: the orders those keys created are not
// there (the orders table of the full side holds the benchmark's own).
//
// The fill is INSERT ... SELECT over generate_series, fillChunk rows per
// statement, with the table's indexes (the primary key included) dropped
// first and built again afterwards from their definitions in the catalog,
// which are checked to be the same again; then VACUUM ANALYZE and a
// CHECKPOINT, as a running service's table has been vacuumed, and so that
// the rounds do not pay for flushing the fill. A primary key built by
// CREATE INDEX is packed to its fillfactor (90%), where one grown by random
// inserts is about 70% full on average: the printed size of the primary
// key is that of the packed one, about a quarter smaller.
// The fill's session skips the foreign key's check (session_replication_role
// replica: the tenants are read from the table it references) and does not
// wait for its commits' flush (synchronous_commit off: the CHECKPOINT at
// the end makes it durable).

const (
	fullDatabase = "payments_full"
	// templateTenant's create is the template of the completed rows.
	templateTenant = "loadtest-template"
	// keysPerTenant is half the default key budget (R6).
	keysPerTenant = idem.DefaultKeyBudget / 2
	// fillChunk is how many rows one statement of the fill writes.
	fillChunk = 1_000_000
	// horizonMargin: no stored key reaches a horizon sooner after the fill
	// started.
	horizonMargin = 2 * time.Hour
	// bytesPerKey is what one stored key needs on disk at most while the
	// fill runs (about 550 bytes once done: heap and indexes; the rest is
	// the WAL and the sort of the primary key's build), to refuse a fill the
	// disk cannot hold before it starts.
	bytesPerKey = 1200
)

// storedKeyTenants is how many tenants hold n stored keys.
func storedKeyTenants(n int64) int {
	return int(max(1, (n+keysPerTenant-1)/keysPerTenant))
}

// tenantNames names the benchmark's n tenants; the first is the default
// benchmark's.
func tenantNames(n int) []string {
	names := []string{"loadtest"}
	for i := 2; i <= n; i++ {
		names = append(names, "loadtest-"+strconv.Itoa(i))
	}
	return names
}

// setupStoredKeys makes the benchmark's other tenants and the template's
// in the empty database, and the full database with the same tenants
// (still empty: the fill runs in runStoredKeys, which prints its progress).
func setupStoredKeys(ctx context.Context, o options, env *environment) error {
	dbURL := env.cluster.URL("payments")
	env.tenants = tenantNames(storedKeyTenants(o.storedKeys))
	env.apiKeys = []string{env.apiKey}
	for _, name := range env.tenants[1:] {
		key, err := harness.CreateTenant(env.apiBin, dbURL, name)
		if err != nil {
			return err
		}
		env.apiKeys = append(env.apiKeys, key)
	}
	var err error
	if env.templateKey, err = harness.CreateTenant(env.apiBin, dbURL, templateTenant); err != nil {
		return err
	}

	conn, err := pgx.Connect(ctx, env.cluster.URL("postgres"))
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+fullDatabase)
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	env.fullDBURL = env.cluster.URL(fullDatabase)
	migrate := exec.CommandContext(ctx, env.apiBin, "migrate", "up")
	migrate.Env = append(os.Environ(), "DATABASE_URL="+env.fullDBURL)
	if out, err := migrate.CombinedOutput(); err != nil {
		return fmt.Errorf("api migrate up (%s): %w\n%s", fullDatabase, err, out)
	}
	for _, name := range env.tenants {
		key, err := harness.CreateTenant(env.apiBin, env.fullDBURL, name)
		if err != nil {
			return err
		}
		env.fullKeys = append(env.fullKeys, key)
	}
	env.fullDB, err = pgxpool.New(ctx, env.fullDBURL)
	return err
}

// side is one database and the API that serves it.
type side struct {
	name     string
	load     *load
	apiKeys  []string
	create   scenario
	executed int // creates executed, the priming and the warm-up included
	before   keyTable
	after    keyTable

	createIO, replayIO ioCounters // blocks read and hit during the create rounds, the replay rounds
	replay             scenario   // replays of the side's stored keys (storedreplays.go)
	stored             storedRows
}

type storedKeysResults struct {
	keys           int64
	tenants        int
	empty, full    *side
	fill           fillResult
	template       templateInfo
	marginExceeded bool // the run outlasted horizonMargin: the reapers may have had work
	memLimit       int64
	memPeak        int64 // PostgreSQL's cgroup's peak usage, with -pg-memory
}

// runStoredKeys is the benchmark of -stored-keys.
func runStoredKeys(ctx context.Context, o options, env *environment, stdout io.Writer) error {
	fmt.Fprintf(stdout, "loadtest: PostgreSQL %s (fsync=%s synchronous_commit=%s full_page_writes=%s), %d CPUs, c=%d, pool=%d, %d rounds of %s per database; creates under %s keys from %d tenant(s) against an empty key table and one holding %d keys, then replays of stored keys\n",
		env.settings["server_version"], env.settings["fsync"], env.settings["synchronous_commit"], env.settings["full_page_writes"],
		runtime.NumCPU(), o.concurrency, o.pool, o.rounds, o.duration, keyOrderName(o.keyOrder), len(env.tenants), o.storedKeys)
	res, err := measureStoredKeys(ctx, o, env, stdout)
	if err != nil {
		for _, p := range []*harness.Process{env.loadAPI, env.fullAPI} {
			if p == nil {
				continue
			}
			if lines := harness.ErrorLines(p.LogPath, 10); len(lines) > 0 {
				fmt.Fprintf(os.Stderr, "loadtest: the last errors %s logged:\n%s\n", p.Name, strings.Join(lines, "\n"))
			}
		}
		return err
	}
	reportStoredKeys(stdout, o, res)
	return nil
}

func measureStoredKeys(ctx context.Context, o options, env *environment, stdout io.Writer) (*storedKeysResults, error) {
	conns := o.concurrency + 8
	res := &storedKeysResults{keys: o.storedKeys, tenants: len(env.tenants)}
	res.empty = &side{name: "empty", load: newLoad(env.loadURL, env.apiKey, env.runID, env.db, conns), apiKeys: env.apiKeys}
	res.empty.load.timeOrderedKeys = env.timeOrderedKeys

	var err error
	if res.template, err = makeTemplate(ctx, res.empty.load, env.templateKey); err != nil {
		return nil, err
	}
	if res.fill, err = fillStoredKeys(ctx, env, env.fullFill(o.storedKeys), res.template, stdout); err != nil {
		return nil, err
	}
	if res.full, err = startFullSide(ctx, o, env, conns); err != nil {
		return nil, err
	}

	sides := []*side{res.empty, res.full}
	for _, s := range sides {
		if s.before, err = readKeyTable(ctx, s.load.db); err != nil {
			return nil, err
		}
	}
	if want := o.storedKeys; res.full.before.rows != want {
		return nil, fmt.Errorf("the full key table holds %d rows after the fill, want %d", res.full.before.rows, want)
	}
	printKeyTable(stdout, "the full key table", res.full.before)

	if err := warmUp(ctx, o, sides); err != nil {
		return nil, err
	}
	if err := ioPhase(ctx, sides, func(s *side) *ioCounters { return &s.createIO }, func() error {
		return createRounds(ctx, o, res, stdout)
	}); err != nil {
		return nil, err
	}

	// Each key table grew by the creates it executed: one key row each,
	// and nothing pruned or deleted by the reapers (none was due).
	res.marginExceeded = time.Since(res.fill.start) >= horizonMargin
	for _, s := range sides {
		if s.after, err = readKeyTable(ctx, s.load.db); err != nil {
			return nil, err
		}
		if grew := s.after.rows - s.before.rows; grew != int64(s.executed) && !res.marginExceeded {
			return nil, fmt.Errorf("%s: the key table grew by %d rows for %d creates executed", s.name, grew, s.executed)
		}
	}
	if err := replayRounds(ctx, o, env, res, stdout); err != nil {
		return nil, err
	}
	if env.memGroup != nil {
		res.memLimit = env.memGroup.limit
		if _, res.memPeak, err = env.memGroup.usage(); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// startFullSide starts the API on the filled database and returns its
// side.
func startFullSide(ctx context.Context, o options, env *environment, conns int) (*side, error) {
	var addr string
	var err error
	env.fullAPI, addr, err = harness.StartProcess(ctx, env.workDir, "api-full", env.apiBin, []string{"serve"},
		append(slices.Clip(env.apiEnv), "DATABASE_URL="+env.fullDBURL+"&pool_max_conns="+strconv.Itoa(o.pool)), "listening")
	if err != nil {
		return nil, err
	}
	env.fullURL = "http://" + addr
	s := &side{name: "full", load: newLoad(env.fullURL, env.fullKeys[0], env.runID, env.fullDB, conns), apiKeys: env.fullKeys}
	s.load.timeOrderedKeys = env.timeOrderedKeys
	return s, nil
}

// warmUp sends one create per tenant first, on each side: each API looks
// the tenant's API key up and counts its key rows for the budget once;
// then a warm-up of a round's length, which also brings the full side's
// hot pages (the indexes' upper levels) back into PostgreSQL's buffers
// after the fill. Neither is reported.
func warmUp(ctx context.Context, o options, sides []*side) error {
	for _, s := range sides {
		r, err := s.load.createRandom(ctx, min(o.concurrency, len(s.apiKeys)), 0, s.apiKeys, len(s.apiKeys))
		s.executed += r.ok
		if err != nil {
			return fmt.Errorf("%s: first create of each tenant: %w", s.name, err)
		}
	}
	for _, s := range sides {
		r, err := s.load.createRandom(ctx, o.concurrency, o.duration, s.apiKeys, 0)
		s.executed += r.ok
		if err != nil {
			return fmt.Errorf("%s: warm-up: %w", s.name, err)
		}
	}
	return nil
}

// createRounds measures the creates on the empty and the full side, the
// two taking turns at going first.
func createRounds(ctx context.Context, o options, res *storedKeysResults, stdout io.Writer) error {
	for i := 1; i <= o.rounds; i++ {
		order := []*side{res.empty, res.full}
		if i%2 == 0 {
			order[0], order[1] = order[1], order[0]
		}
		for _, s := range order {
			if err := ctx.Err(); err != nil {
				return err
			}
			r, err := s.load.createRandom(ctx, o.concurrency, o.duration, s.apiKeys, 0)
			s.create.add(r)
			s.executed += r.ok
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", i, s.name, err)
			}
		}
		last := func(s series) float64 { return s[len(s)-1] }
		fmt.Fprintf(stdout, "round %d/%d: create on the empty table %.0f/s, on the full one %.0f/s (%s first): full / empty %.2f\n",
			i, o.rounds, last(res.empty.create.rps), last(res.full.create.rps), order[0].name,
			last(res.full.create.rps)/last(res.empty.create.rps))
	}
	return nil
}

// keyOrderName describes -key-order's keys.
func keyOrderName(order string) string {
	if order == "time" {
		return "time-ordered (version 7 UUID)"
	}
	return "random (version 4 UUID)"
}

// newKey mints a create's key: a version 4 UUID, or with -key-order time a
// version 7 (time-ordered) one.
func (l *load) newKey() string {
	if l.timeOrderedKeys {
		return uuid.Must(uuid.NewV7()).String()
	}
	return uuid.NewString()
}

// createRandom sends creates under random keys (version 4 UUIDs), from
// apiKeys in turn, for d, or (d = 0) limit requests in all. Every answer
// must be an execution, and the orders must grow by exactly their number.
func (l *load) createRandom(ctx context.Context, workers int, d time.Duration, apiKeys []string, limit int) (outcome, error) {
	url := l.base + "/v1/orders"
	var next atomic.Int64
	tr := func(t *vegeta.Target) error {
		i := next.Add(1) - 1
		if limit > 0 && i >= int64(limit) {
			return vegeta.ErrNoTargets
		}
		h := http.Header{
			"Authorization":   {"Bearer " + apiKeys[i%int64(len(apiKeys))]},
			"Content-Type":    {"application/json"},
			"Idempotency-Key": {l.newKey()},
		}
		t.Method, t.URL, t.Header, t.Body = http.MethodPost, url, h, orderBody(l.fresh("ref"))
		return nil
	}
	var out outcome
	err := l.checkRows(ctx, "create", countOrders, func() (int, error) {
		var err error
		out, err = l.attack("create", workers, d, tr, status(http.StatusCreated, false), false)
		return out.ok, err
	})
	return out, err
}

// templateInfo is the key row of one real create, which the fill's
// completed rows copy.
type templateInfo struct {
	row      string // to_jsonb of the row
	endpoint string
	bodyLen  int
	request  []byte // the request's body: a replay of a stored completed key sends it
	response []byte // the recorded response's body: every such replay answers it
}

// makeTemplate sends one create to l as the template tenant and reads its
// key row back.
func makeTemplate(ctx context.Context, l *load, apiKey string) (templateInfo, error) {
	var t templateInfo
	key := uuid.NewString()
	// An order with a description and metadata, as a shop sends them: its
	// recorded response is about 420 bytes, where the benchmark's bare
	// orders answer with about 260.
	body := fmt.Appendf(nil, `{"reference":%q,"customer_id":"cus_load","amount":%d,"currency":"EUR",`+
		`"description":"2 x coffee beans 1 kg, 1 x hand grinder; deliver on weekdays between 9 and 17, ring twice",`+
		`"metadata":{"cart_id":%q,"channel":"web"}}`, l.fresh("ref"), orderAmount, uuid.NewString())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.base+"/v1/orders", bytes.NewReader(body))
	if err != nil {
		return t, err
	}
	req.Header = http.Header{"Authorization": {"Bearer " + apiKey}, "Content-Type": {"application/json"}, "Idempotency-Key": {key}}
	resp, err := l.client.Do(req)
	if err != nil {
		return t, err
	}
	answer, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return t, err
	}
	if resp.StatusCode != http.StatusCreated || resp.Header.Get(replayedHeader) == "true" {
		return t, fmt.Errorf("the template's create: %d %s=%q %s", resp.StatusCode, replayedHeader, resp.Header.Get(replayedHeader), truncate(answer))
	}
	t.request, t.response = body, answer
	err = l.db.QueryRow(ctx, `
		SELECT to_jsonb(k)::text, k.endpoint, length(k.response_body)
		FROM idempotency_keys k JOIN tenants t ON t.id = k.tenant_id
		WHERE t.name = $1 AND k.idem_key = $2 AND k.state = 'completed'`, templateTenant, key).Scan(&t.row, &t.endpoint, &t.bodyLen)
	if err != nil {
		return t, fmt.Errorf("the template's key row: %w", err)
	}
	return t, nil
}

// fillResult is what the fill did and how long it took.
type fillResult struct {
	start               time.Time // the database's clock: the rows' ages count back from it
	insert, index, tidy time.Duration
	total               time.Duration
}

// fillSQL writes the rows @lo to @hi - 1 of the @n stored keys: rows below
// @tombstones are tombstones, created from @retention - @margin to @ttl
// before @t0; the others are completed, created from @ttl - @margin before
// @t0 up to @t0. The template row gives every column not set here.
//
// A key is the MD5 of @seed and the row's number, written as a UUID: 36
// characters, uniformly spread like the version 4 UUIDs clients send, and
// about ten times cheaper than gen_random_uuid(), which reads the kernel's
// random source once per row (most of the fill's time); storedKey computes
// the same key in Go. With @timeOrdered (-key-order time) the first 12
// hex digits are the row's number instead, which grows with created_at as
// a version 7 UUID's timestamp does: the keys sort in the order they were
// created, and the benchmark's own version 7 keys sort after them all. Every row carries the template's fingerprint (it
// hashes the endpoint and the body, not the tenant or the key), so the
// template's request body sent under a completed row's key and tenant is
// a replay of that row (storedreplays.go).
const fillSQL = `
INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, state,
                              response_status, response_headers, response_body, resource_location, resource_id,
                              recovery_point, locked_until, lease_generation,
                              created_at, completed_at, expires_at, retain_until)
SELECT ts.ids[(1 + s.g % cardinality(ts.ids))::int], t.endpoint, s.key, t.fingerprint, t.fingerprint_version,
       CASE WHEN s.completed THEN 'completed' ELSE 'expired' END, t.response_status,
       CASE WHEN s.completed THEN t.response_headers END, CASE WHEN s.completed THEN t.response_body END,
       t.resource_location, t.resource_id, t.recovery_point, t.locked_until, t.lease_generation,
       s.created, s.created, s.created + ttl.v, s.created + retention.v
FROM jsonb_populate_record(NULL::idempotency_keys, @template::jsonb) t,
     (SELECT array_agg(id ORDER BY name) AS ids FROM tenants WHERE name = ANY(@tenants::text[])) ts,
     (SELECT make_interval(secs => @ttl::float8) AS v) ttl,
     (SELECT make_interval(secs => @retention::float8) AS v) retention,
     (SELECT make_interval(secs => @margin::float8) AS v) margin,
     LATERAL (
         SELECT g, (CASE WHEN @timeOrdered::bool
                         THEN overlay(md5(@seed::text || g) PLACING lpad(to_hex(g), 12, '0') FROM 1 FOR 12)
                         ELSE md5(@seed::text || g) END)::uuid::text AS key,
                g >= @tombstones::bigint AS completed,
                CASE WHEN g >= @tombstones::bigint
                     THEN @t0::timestamptz - (ttl.v - margin.v)
                          + (g - @tombstones::bigint)::float8 / (@n::bigint - @tombstones::bigint) * (ttl.v - margin.v)
                     ELSE @t0::timestamptz - (retention.v - margin.v)
                          + g::float8 / @tombstones::bigint * (retention.v - ttl.v - margin.v)
                END AS created
         FROM generate_series(@lo::bigint, @hi::bigint - 1) g
     ) s`

// keyIndex is one index of idempotency_keys as the catalog defines it;
// constraint is set when a constraint owns it (the primary key).
type keyIndex struct {
	name, def, constraint, constraintDef string
}

func keyIndexes(ctx context.Context, conn *pgx.Conn) ([]keyIndex, error) {
	rows, err := conn.Query(ctx, `
		SELECT c.relname, pg_get_indexdef(i.indexrelid), coalesce(con.conname, ''), coalesce(pg_get_constraintdef(con.oid), '')
		FROM pg_index i
		JOIN pg_class c ON c.oid = i.indexrelid
		LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid AND con.conrelid = i.indrelid AND con.contype IN ('p', 'u', 'x')
		WHERE i.indrelid = 'idempotency_keys'::regclass
		ORDER BY c.relname`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (keyIndex, error) {
		var k keyIndex
		err := r.Scan(&k.name, &k.def, &k.constraint, &k.constraintDef)
		return k, err
	})
}

func (k keyIndex) dropSQL() string {
	if k.constraint != "" {
		return "ALTER TABLE idempotency_keys DROP CONSTRAINT " + pgx.Identifier{k.constraint}.Sanitize()
	}
	return "DROP INDEX " + pgx.Identifier{k.name}.Sanitize()
}

func (k keyIndex) createSQL() string {
	if k.constraint != "" {
		return "ALTER TABLE idempotency_keys ADD CONSTRAINT " + pgx.Identifier{k.constraint}.Sanitize() + " " + k.constraintDef
	}
	return k.def
}

// fillTarget is a database whose key table a fill writes: n rows under
// keys derived from seed (storedKey). The full side's fill drops the
// table's indexes first and builds them again after; a small fill (the
// replays' other side, storedreplays.go) inserts into the table as it is,
// beside the rows its API wrote.
type fillTarget struct {
	database, url string
	n             int64
	seed          string
	dropIndexes   bool
	timeOrdered   bool // keys in the order of their creation (-key-order time)
}

func (env *environment) fullFill(n int64) fillTarget {
	return fillTarget{database: fullDatabase, url: env.fullDBURL, n: n, seed: env.runID + "-", dropIndexes: true, timeOrdered: env.timeOrderedKeys}
}

// fillStoredKeys fills the key table of f.database with f.n rows.
func fillStoredKeys(ctx context.Context, env *environment, f fillTarget, tpl templateInfo, stdout io.Writer) (fillResult, error) {
	var res fillResult
	n := f.n
	var st syscall.Statfs_t
	if err := syscall.Statfs(env.dataDir, &st); err != nil {
		return res, err
	}
	if free, need := int64(st.Bavail)*int64(st.Bsize), n*bytesPerKey; free < need {
		return res, fmt.Errorf("-stored-keys %d needs about %s free in %s; there are %s", n, humanBytes(need), env.dataDir, humanBytes(free))
	}

	conn, err := pgx.Connect(ctx, f.url)
	if err != nil {
		return res, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if res.start, err = prepareFill(ctx, conn, env, f.database); err != nil {
		return res, err
	}
	var indexes []keyIndex
	if f.dropIndexes {
		if indexes, err = keyIndexes(ctx, conn); err != nil {
			return res, err
		}
	}
	tombstones := n * 2 / 3
	fmt.Fprintf(stdout, "filling %s: %d key rows under %q, %d completed (the %d-byte response of a real create) and %d tombstones, over %d tenant(s)%s\n",
		f.database, n, tpl.endpoint, n-tombstones, tpl.bodyLen, tombstones, len(env.tenants), when(f.dropIndexes, "; indexes dropped, built again after"))
	began := time.Now()
	for _, ix := range indexes {
		if _, err := conn.Exec(ctx, ix.dropSQL()); err != nil {
			return res, fmt.Errorf("%s: %w", ix.dropSQL(), err)
		}
	}
	args := pgx.NamedArgs{
		"template":    tpl.row,
		"tenants":     env.tenants,
		"ttl":         idem.DefaultTTL.Seconds(),
		"retention":   idem.DefaultKeyRetention.Seconds(),
		"margin":      horizonMargin.Seconds(),
		"tombstones":  tombstones,
		"seed":        f.seed,
		"timeOrdered": f.timeOrdered,
		"n":           n,
		"t0":          res.start,
	}
	if err := insertKeyRows(ctx, conn, n, args, began, stdout); err != nil {
		return res, err
	}
	res.insert = time.Since(began)

	began = time.Now()
	if f.dropIndexes {
		if err := rebuildIndexes(ctx, conn, indexes, stdout); err != nil {
			return res, err
		}
	}
	res.index = time.Since(began)

	began = time.Now()
	for _, q := range []string{"VACUUM ANALYZE idempotency_keys", "CHECKPOINT"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return res, fmt.Errorf("%s: %w", q, err)
		}
	}
	res.tidy = time.Since(began)
	res.total = res.insert + res.index + res.tidy
	fmt.Fprintf(stdout, "  VACUUM ANALYZE and CHECKPOINT in %s; filled in %s\n", res.tidy.Round(100*time.Millisecond), res.total.Round(time.Second))
	return res, nil
}

// rebuildIndexes builds the dropped indexes again and checks that they
// are the migrations' own.
func rebuildIndexes(ctx context.Context, conn *pgx.Conn, indexes []keyIndex, stdout io.Writer) error {
	if err := buildIndexes(ctx, conn, indexes, stdout); err != nil {
		return err
	}
	again, err := keyIndexes(ctx, conn)
	if err != nil {
		return err
	}
	if !slices.Equal(indexes, again) {
		return fmt.Errorf("the indexes built again differ from the migrations':\nbefore %q\nafter  %q", indexes, again)
	}
	return nil
}

// prepareFill sets conn up for the bulk insert, checks that the full
// database holds the benchmark's tenants, and returns the server's time,
// from which the rows' ages are counted.
func prepareFill(ctx context.Context, conn *pgx.Conn, env *environment, database string) (time.Time, error) {
	// The primary key's build sorts in maintenance_work_mem; under
	// -pg-memory it takes at most a quarter of the limit, or the kernel
	// would kill the backend that sorts.
	workMem := int64(1 << 30)
	if env.memGroup != nil {
		workMem = min(workMem, env.memGroup.limit/4)
	}
	for _, q := range []string{
		"SET session_replication_role = replica",
		"SET synchronous_commit = off",
		fmt.Sprintf("SET maintenance_work_mem = '%dkB'", workMem>>10),
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return time.Time{}, err
		}
	}
	var tenants int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM tenants WHERE name = ANY($1)", env.tenants).Scan(&tenants); err != nil {
		return time.Time{}, err
	}
	if tenants != len(env.tenants) {
		return time.Time{}, fmt.Errorf("%s holds %d of the benchmark's %d tenants", database, tenants, len(env.tenants))
	}
	var start time.Time
	if err := conn.QueryRow(ctx, "SELECT now()").Scan(&start); err != nil {
		return time.Time{}, err
	}
	return start, nil
}

// insertKeyRows writes the n key rows of fillSQL with args, fillChunk at a
// time, printing the progress since began every 10 seconds.
func insertKeyRows(ctx context.Context, conn *pgx.Conn, n int64, args pgx.NamedArgs, began time.Time, stdout io.Writer) error {
	lastPrint := time.Now()
	for lo := int64(0); lo < n; lo += fillChunk {
		hi := min(lo+fillChunk, n)
		args["lo"], args["hi"] = lo, hi
		tag, err := conn.Exec(ctx, fillSQL, args)
		if err != nil {
			return fmt.Errorf("fill rows %d to %d: %w", lo, hi, err)
		}
		if tag.RowsAffected() != hi-lo {
			return fmt.Errorf("fill rows %d to %d: %d rows written", lo, hi, tag.RowsAffected())
		}
		if hi == n || time.Since(lastPrint) >= 10*time.Second {
			elapsed := time.Since(began)
			fmt.Fprintf(stdout, "  %d/%d rows, %s (%.0f rows/s)\n", hi, n, elapsed.Round(time.Second), float64(hi)/elapsed.Seconds())
			lastPrint = time.Now()
		}
	}
	return nil
}

// buildIndexes builds the dropped indexes again.
func buildIndexes(ctx context.Context, conn *pgx.Conn, indexes []keyIndex, stdout io.Writer) error {
	for _, ix := range indexes {
		t := time.Now()
		if _, err := conn.Exec(ctx, ix.createSQL()); err != nil {
			return fmt.Errorf("%s: %w", ix.createSQL(), err)
		}
		fmt.Fprintf(stdout, "  built %s in %s\n", ix.name, time.Since(t).Round(100*time.Millisecond))
	}
	return nil
}

// keyTable is the size of idempotency_keys: its rows, and pg_relation_size
// of the table, of its TOAST table and of each index.
type keyTable struct {
	rows, completed, tombstones int64
	heap, toast                 int64
	indexes                     []relSize
}

type relSize struct {
	name  string
	bytes int64
}

func (t keyTable) indexBytes() int64 {
	var b int64
	for _, ix := range t.indexes {
		b += ix.bytes
	}
	return b
}

func readKeyTable(ctx context.Context, db *pgxpool.Pool) (keyTable, error) {
	var t keyTable
	err := db.QueryRow(ctx, `
		SELECT pg_relation_size(c.oid), coalesce(pg_relation_size(nullif(c.reltoastrelid, 0)), 0)
		FROM pg_class c WHERE c.oid = 'idempotency_keys'::regclass`).Scan(&t.heap, &t.toast)
	if err != nil {
		return t, err
	}
	rows, err := db.Query(ctx, `
		SELECT c.relname, pg_relation_size(c.oid)
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = 'idempotency_keys'::regclass
		ORDER BY 2 DESC, 1`)
	if err != nil {
		return t, err
	}
	if t.indexes, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (relSize, error) {
		var s relSize
		err := r.Scan(&s.name, &s.bytes)
		return s, err
	}); err != nil {
		return t, err
	}
	err = db.QueryRow(ctx, `
		SELECT count(*), count(*) FILTER (WHERE state = 'completed'), count(*) FILTER (WHERE state = 'expired')
		FROM idempotency_keys`).Scan(&t.rows, &t.completed, &t.tombstones)
	return t, err
}

func printKeyTable(w io.Writer, what string, t keyTable) {
	perRow := "n/a"
	if t.rows > 0 {
		perRow = strconv.FormatInt((t.heap+t.toast+t.indexBytes())/t.rows, 10)
	}
	fmt.Fprintf(w, "%s: %d rows (%d completed, %d tombstones), table %s, TOAST %s, indexes %s (%s bytes per row in all)\n",
		what, t.rows, t.completed, t.tombstones, humanBytes(t.heap), humanBytes(t.toast), humanBytes(t.indexBytes()), perRow)
	for _, ix := range t.indexes {
		fmt.Fprintf(w, "  %-36s %s\n", ix.name, humanBytes(ix.bytes))
	}
}

// humanBytes is b in binary units (kB, MB and GB of 1024).
func humanBytes(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.0f MB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.0f kB", float64(b)/(1<<10))
	default:
		return fmt.Sprintf("%d bytes", b)
	}
}

func megabytes(b int64) float64 { return float64(b) / (1 << 20) }

func reportStoredKeys(w io.Writer, o options, r *storedKeysResults) {
	fmt.Fprintf(w, "\ncreate at c=%d under %s keys from %d tenant(s), median (range) over %d rounds:\n", o.concurrency, keyOrderName(o.keyOrder), r.tenants, o.rounds)
	fmt.Fprintf(w, "  %-24s %-24s %-24s %s\n", "", "requests/s", "p50 ms", "p99 ms")
	for _, s := range []*side{r.empty, r.full} {
		label := "empty key table"
		if s == r.full {
			label = fmt.Sprintf("%d stored keys", r.keys)
		}
		fmt.Fprintf(w, "  %-24s %-24s %-24s %s\n", label, s.create.rps.format(0), s.create.p50.format(1), s.create.p99.format(1))
	}
	fmt.Fprintf(w, "\nfull / empty, per round, median (range): %s   target >= 0.85\n", ratio(r.full.create.rps, r.empty.create.rps).format(2))
	reportStoredReplays(w, o, r)

	f := r.fill
	fmt.Fprintf(w, "\nthe fill: %s (rows %s, indexes %s, VACUUM ANALYZE and CHECKPOINT %s)\n",
		f.total.Round(time.Second), f.insert.Round(time.Second), f.index.Round(time.Second), f.tidy.Round(time.Second))
	printKeyTable(w, "the full key table before the rounds", r.full.before)
	fmt.Fprintf(w, "the empty key table after the rounds: %d rows, table %s, indexes %s\n",
		r.empty.after.rows, humanBytes(r.empty.after.heap), humanBytes(r.empty.after.indexBytes()))
	if r.marginExceeded {
		fmt.Fprintf(w, "checked: %d creates executed on the empty side, %d on the full side, each one order; the key rows were not counted against them: the run outlasted the %s before the first stored key reached a horizon, so the full side's reaper may have pruned or deleted rows in the last rounds\n",
			r.empty.executed, r.full.executed, horizonMargin)
	} else {
		fmt.Fprintf(w, "checked: %d creates executed on the empty side, %d on the full side, each one order and one key row; nothing pruned or deleted\n",
			r.empty.executed, r.full.executed)
	}

	fmt.Fprintf(w, "\nloadtest: %s\n", strings.Join(storedKeysFields(r), " "))
}

// storedKeysFields are the last line's name=value pairs.
func storedKeysFields(r *storedKeysResults) []string {
	createRatio := ratio(r.full.create.rps, r.empty.create.rps)
	t := r.full.before
	lo, hi := 0.0, 0.0
	if len(createRatio) > 0 {
		lo, hi = slices.Min(createRatio), slices.Max(createRatio)
	}
	return []string{
		fmt.Sprintf("stored_keys=%d", r.keys),
		fmt.Sprintf("tenants=%d", r.tenants),
		fmt.Sprintf("create_full_rps=%.0f", r.full.create.rps.median()),
		fmt.Sprintf("create_empty_rps=%.0f", r.empty.create.rps.median()),
		fmt.Sprintf("full_over_empty=%.2f", createRatio.median()),
		fmt.Sprintf("full_over_empty_min=%.2f", lo),
		fmt.Sprintf("full_over_empty_max=%.2f", hi),
		fmt.Sprintf("create_full_p99_ms=%.1f", r.full.create.p99.median()),
		fmt.Sprintf("create_empty_p99_ms=%.1f", r.empty.create.p99.median()),
		fmt.Sprintf("rows=%d", t.rows),
		fmt.Sprintf("table_mb=%.0f", megabytes(t.heap)),
		fmt.Sprintf("toast_mb=%.0f", megabytes(t.toast)),
		fmt.Sprintf("indexes_mb=%.0f", megabytes(t.indexBytes())),
		fmt.Sprintf("fill_s=%.0f", r.fill.total.Seconds()),
		fmt.Sprintf("replay_full_rps=%.0f", r.full.replay.rps.median()),
		fmt.Sprintf("replay_small_rps=%.0f", r.empty.replay.rps.median()),
		fmt.Sprintf("replay_full_over_small=%.2f", ratio(r.full.replay.rps, r.empty.replay.rps).median()),
		fmt.Sprintf("replay_full_p99_ms=%.1f", r.full.replay.p99.median()),
		fmt.Sprintf("replay_small_p99_ms=%.1f", r.empty.replay.p99.median()),
		fmt.Sprintf("key_reads_per_create_full=%.2f", keyReads(r.full.createIO, r.full.create.requests)),
		fmt.Sprintf("key_reads_per_create_empty=%.2f", keyReads(r.empty.createIO, r.empty.create.requests)),
		fmt.Sprintf("key_reads_per_replay_full=%.2f", keyReads(r.full.replayIO, r.full.replay.requests)),
		fmt.Sprintf("pg_memory_mb=%.0f", megabytes(r.memLimit)),
		fmt.Sprintf("pg_memory_peak_mb=%.0f", megabytes(r.memPeak)),
	}
}

func keyReads(c ioCounters, n int) float64 {
	k, _ := c.perRequest(n)
	return k
}

// reportStoredReplays prints the replays' table, the blocks read per
// request, and the memory PostgreSQL was held to.
func reportStoredReplays(w io.Writer, o options, r *storedKeysResults) {
	fmt.Fprintf(w, "\nreplay of a random stored completed key at c=%d, median (range) over %d rounds:\n", o.concurrency, o.rounds)
	fmt.Fprintf(w, "  %-24s %-24s %-24s %s\n", "", "requests/s", "p50 ms", "p99 ms")
	for _, s := range []*side{r.empty, r.full} {
		fmt.Fprintf(w, "  %-24s %-24s %-24s %s\n", fmt.Sprintf("%d stored keys", s.stored.n), s.replay.rps.format(0), s.replay.p50.format(1), s.replay.p99.format(1))
	}
	fmt.Fprintf(w, "full / small, per round, median (range): %s\n", ratio(r.full.replay.rps, r.empty.replay.rps).format(2))

	fmt.Fprintf(w, "\nblocks read from the operating system (not found in shared_buffers) per request, over all rounds:\n")
	fmt.Fprintf(w, "  %-34s %-18s %-18s %s\n", "", "key table", "whole database", "key table hit ratio")
	row := func(label string, c ioCounters, n int) {
		k, d := c.perRequest(n)
		hit := 0.0
		if c.keyRead+c.keyHit > 0 {
			hit = float64(c.keyHit) / float64(c.keyRead+c.keyHit)
		}
		fmt.Fprintf(w, "  %-34s %-18.2f %-18.2f %.3f\n", label, k, d, hit)
	}
	row("create, empty key table", r.empty.createIO, r.empty.create.requests)
	row(fmt.Sprintf("create, %d stored keys", r.keys), r.full.createIO, r.full.create.requests)
	row(fmt.Sprintf("replay, %d stored keys", r.empty.stored.n), r.empty.replayIO, r.empty.replay.requests)
	row(fmt.Sprintf("replay, %d stored keys", r.keys), r.full.replayIO, r.full.replay.requests)
	if r.memLimit > 0 {
		fmt.Fprintf(w, "PostgreSQL held to %s by a memory cgroup (its page cache included); peak usage %s\n", humanBytes(r.memLimit), humanBytes(r.memPeak))
	}
}
