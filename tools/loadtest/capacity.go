package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/idemref/payments/internal/tooling/harness"
	"github.com/idemref/payments/internal/tooling/pgtmp"
)

// The -capacity mode measures what one core of the primary sustains, in
// the unit published PostgreSQL benchmarks use: transactions (commits) per
// second, here per second of PostgreSQL's CPU. Three scenarios, each for
// -duration at -c concurrency, in -rounds rounds whose order rotates:
//
//	create   POST /v1/orders under fresh keys
//	payment  POST /v1/payments on unpaid orders under fresh keys (the
//	         processor simulator is called)
//	mix      of every 20 requests, 12 creates, 5 replays and 3 payments
//	         (60/25/15)
//
// For each run it reads, over the run's window, the commits of the
// payments database (pg_stat_database.xact_commit) and PostgreSQL's CPU:
// the postmaster's own, its live children's (utime + stime of each) and
// its reaped children's (its cutime + cstime), so a backend that exits in
// the window is counted through its parent. The machine's two cores are
// shared by the API, the load generator and PostgreSQL, so wall-clock
// throughput says what this machine does, while commits per CPU second say
// what a core given wholly to PostgreSQL would do. The background jobs of
// the API under load (the outbox relay, the completer, the orders
// consumer) run as in production, and their commits and CPU count: commits
// per request is what one request costs the database, everything included.
//
// PostgreSQL publishes a backend's statistics at most once a second while
// it is busy, and within capacitySettle once it goes idle: each window
// therefore starts after a settle and ends one settle after the load, and
// what the server does when idle (measured once, before the rounds, over a
// settle) is taken off for the settle that ends the window. Work the load
// leaves behind (events still to relay) lands in the settle and counts.
//
// Each run's side effects are checked as the other modes check theirs:
// the orders table grows by the creates executed, the succeeded payments
// and the processor simulator's executed charges by the payments, and a
// replay writes nothing; any difference fails the run.
//
// With -sync-standby a streaming standby of the primary (pgtmp's
// Options.Standby) is named in synchronous_standby_names, with
// synchronous_commit on, and pg_stat_replication must show it as sync
// before the rounds: every commit then waits for the standby's flush. The
// standby's processes are not the primary's children and are not counted.
//
// -capacity-json PATH writes the results in the shape of the results files
// of ClickHouse's PostgresBench (github.com/ClickHouse/PostgresBench,
// <system>/results/*.json), whose top-level fields it keeps:
//
//	{
//	  "system": "...", "date": "2026-12-31",
//	  "instance": {"type": CPU model, "vcpus": 2, "ram_gb": 8, "instance_storage": "", "primary_storage": "ext4 (local)"},
//	  "machine": "2vCPU, 8GB RAM", "cluster_size": 1 (2 with the standby), "tuned": "no", "comment": "...",
//	  "postgres_version": "15.20",
//	  "benchmark": {"tool": "loadtest -capacity", "workload": "create, payment, mix 60/25/15 ...", "clients": 32,
//	                "threads": 2, "duration": 20, "query_mode": pgx's exec mode,
//	                and ours: "pool", "rounds", "sync_standby" ("yes"/"no"), "fsync", "synchronous_commit",
//	                "synchronous_standby_names", "settle_seconds", "idle_commits_per_second", "idle_cpu_per_second"},
//	  "load": {"load_time_seconds": the setup's time},
//	  "results": [{"run": 1, "tps": commits/s, "transactions": commits, "failed_transactions": rollbacks,
//	               "latency_avg_ms", "latency_stddev_ms", "latency_p95_ms", "latency_p99_ms",
//	               and ours: "scenario", "requests", "creates", "replays", "payments", "rps", "latency_p50_ms",
//	               "wall_seconds", "postgres_cpu_seconds", "postgres_busy", "tps_per_vcpu", "rps_per_vcpu",
//	               "commits_per_request"}, ... one per scenario and round],
//	  "summary": [{"scenario", medians of "tps", "rps", "tps_per_vcpu", "rps_per_vcpu", "commits_per_request",
//	               "postgres_busy", "latency_p50_ms", "latency_p95_ms", "latency_p99_ms"}]
//	}
//
// PostgresBench's "tps" is pgbench's transactions per second; ours is the
// payments database's commits per second, the same count, and
// "failed_transactions" its rollbacks (xact_rollback). A file holds the
// three scenarios, each run tagged with its scenario.

// capacitySettle is how long a window waits for PostgreSQL's statistics:
// an idle backend publishes its pending counts within 10 s
// (PGSTAT_IDLE_INTERVAL), and a second more is the margin.
const capacitySettle = 11 * time.Second

// capacityStandbyName is the standby's application_name and slot.
const capacityStandbyName = "capacity_standby"

// The scenarios, in the order of the first round.
const (
	scenarioCreate  = "create"
	scenarioPayment = "payment"
	scenarioMix     = "mix"
)

var capacityScenarios = []string{scenarioCreate, scenarioPayment, scenarioMix}

// The mix: of every mixBlock requests, mixCreates creates, mixReplays
// replays, and payments for the rest.
const (
	mixBlock   = 20
	mixCreates = mixCreate * mixBlock / 100
	mixReplays = mixReplay * mixBlock / 100
	mixShare   = "60/25/15 creates/replays/payments"
)

// mixKind is what the mix's i-th request is.
func mixKind(i int64) requestKind {
	switch r := i % mixBlock; {
	case r < mixCreates:
		return kindCreate
	case r < mixCreates+mixReplays:
		return kindReplay
	default:
		return kindPayment
	}
}

// paymentShare is the share of a scenario's requests that pay an order.
func paymentShare(scenario string) float64 {
	switch scenario {
	case scenarioPayment:
		return 1
	case scenarioMix:
		return float64(mixBlock-mixCreates-mixReplays) / mixBlock
	}
	return 0
}

// capacityOptions applies -capacity's defaults (3 rounds of 20 s; with
// -short, 1 round of 2 s) to the flags not given, and checks that its
// flags go with it.
func capacityOptions(o *options, fs *flag.FlagSet) error {
	if !o.capacity {
		if o.syncStandby || o.capacityJSON != "" {
			return errors.New("-sync-standby and -capacity-json go with -capacity")
		}
		return nil
	}
	if o.pgbench || o.storedKeys > 0 {
		return errors.New("-capacity, -pgbench and -stored-keys are separate benchmarks; give one")
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	rounds, duration := 3, 20*time.Second
	if o.short {
		rounds, duration = 1, 2*time.Second
	}
	if !set["rounds"] {
		o.rounds = rounds
	}
	if !set["duration"] {
		o.duration = duration
	}
	return nil
}

// pgReading is one reading of the payments database's counters and
// PostgreSQL's CPU.
type pgReading struct {
	at                 time.Time
	commits, rollbacks int64
	cpu                float64 // seconds
}

// idleRates is what the server does per second with no load.
type idleRates struct {
	commits, cpu float64
}

// capacitySample is one scenario's run.
type capacitySample struct {
	scenario                             string
	round                                int
	requests, creates, replays, payments int
	wall                                 time.Duration // the load's
	commits, rollbacks                   float64       // over the window, the idle share off
	cpu                                  float64       // PostgreSQL's CPU seconds, likewise
	lat                                  latencyFigures
	ranOut                               bool // the payments ran out of unpaid orders
}

// latencyFigures are a run's latencies, in ms.
type latencyFigures struct {
	avg, stddev, p50, p95, p99 float64
}

// latencyStats summarizes latencies: mean, standard deviation and the
// nearest-rank percentiles.
func latencyStats(l []time.Duration) latencyFigures {
	if len(l) == 0 {
		return latencyFigures{}
	}
	var sum float64
	for _, d := range l {
		sum += ms(d)
	}
	avg := sum / float64(len(l))
	var sq float64
	for _, d := range l {
		sq += (ms(d) - avg) * (ms(d) - avg)
	}
	return latencyFigures{
		avg: avg, stddev: math.Sqrt(sq / float64(len(l))),
		p50: ms(harness.Percentile(l, 50)), p95: ms(harness.Percentile(l, 95)), p99: ms(harness.Percentile(l, 99)),
	}
}

// newSample computes a run's figures from the readings r0 (before the
// load) and r1 (a settle after it ended at loadEnd), taking the idle
// rates off for the settle.
func newSample(scenario string, round int, out outcome, kinds [3]int, r0, r1 pgReading, loadEnd time.Time, idle idleRates) capacitySample {
	settle := r1.at.Sub(loadEnd).Seconds()
	return capacitySample{
		scenario: scenario, round: round,
		requests: out.ok, creates: kinds[kindCreate], replays: kinds[kindReplay], payments: kinds[kindPayment],
		wall:      out.elapsed,
		commits:   float64(r1.commits-r0.commits) - idle.commits*settle,
		rollbacks: float64(r1.rollbacks - r0.rollbacks),
		cpu:       r1.cpu - r0.cpu - idle.cpu*settle,
		lat:       latencyStats(out.latencies),
	}
}

// capacityFigures are a run's rates.
type capacityFigures struct {
	rps, tps          float64 // requests and commits per wall-clock second
	tpsPerVCPU        float64 // commits per second of PostgreSQL's CPU
	rpsPerVCPU        float64 // requests per second of PostgreSQL's CPU
	commitsPerRequest float64
	busy              float64 // PostgreSQL's CPU seconds per wall second
}

func (s capacitySample) figures() capacityFigures {
	wall := s.wall.Seconds()
	return capacityFigures{
		rps: float64(s.requests) / wall, tps: s.commits / wall,
		tpsPerVCPU: s.commits / s.cpu, rpsPerVCPU: float64(s.requests) / s.cpu,
		commitsPerRequest: s.commits / float64(s.requests),
		busy:              s.cpu / wall,
	}
}

// plausible refuses a run whose figures cannot be divided: no requests,
// no commits or no CPU counted.
func (s capacitySample) plausible() error {
	if s.requests <= 0 || s.wall <= 0 || s.commits <= 0 || s.cpu <= 0 {
		return fmt.Errorf("%s round %d: %d requests in %s, %.0f commits, %.2f s of PostgreSQL's CPU: nothing to divide",
			s.scenario, s.round, s.requests, s.wall, s.commits, s.cpu)
	}
	return nil
}

// paymentsNeeded is how many unpaid orders a run of scenario for d
// should find: its last rate (or, before it ran, the create's) times its
// share of payments, half again as many, and one per client.
func paymentsNeeded(scenario string, last map[string]float64, d time.Duration, clients int) int {
	share := paymentShare(scenario)
	if share == 0 {
		return 0
	}
	rate := last[scenario]
	if rate == 0 {
		rate = last[scenarioCreate]
	}
	if rate == 0 {
		rate = 1000
	}
	return int(math.Ceil(rate*share*d.Seconds()*1.5)) + clients
}

// postgresCPU reads PostgreSQL's CPU in seconds: the postmaster's own,
// its live children's and its reaped children's. A child reaped between
// the readings would be counted twice or not at all, so the postmaster's
// reaped total is read before and after the children, and the reading is
// taken again until it has not moved.
func postgresCPU(postmaster int) (float64, error) {
	for range 20 {
		_, before, err := procCPU(postmaster)
		if err != nil {
			return 0, err
		}
		children, err := childPids(postmaster)
		if err != nil {
			return 0, err
		}
		var live float64
		for _, pid := range children {
			own, _, err := procCPU(pid)
			if err != nil {
				continue // reaped since the list: the postmaster's total moves
			}
			live += own
		}
		own, after, err := procCPU(postmaster)
		if err != nil {
			return 0, err
		}
		if after == before {
			return own + after + live, nil
		}
	}
	return 0, fmt.Errorf("the postmaster %d reaped children through 20 readings of its CPU in a row", postmaster)
}

// sleepCtx waits d, or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// runCapacity is the -capacity mode.
func runCapacity(ctx context.Context, o options, stdout io.Writer) error {
	began := time.Now()
	env, err := start(ctx, o)
	if env != nil {
		defer env.stop()
	}
	if err != nil {
		return err
	}
	c, err := newCapacityRun(ctx, o, env)
	if c != nil {
		defer c.close()
	}
	if err != nil {
		return err
	}
	c.setup = time.Since(began)
	c.header(stdout)
	samples, err := c.measureAll(ctx, stdout)
	if err != nil {
		c.logErrors()
		return err
	}
	capacityReport(stdout, o, samples)
	if o.capacityJSON == "" {
		return nil
	}
	if err := writeCapacityJSON(o.capacityJSON, c.result(samples)); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "capacity: wrote %s\n", o.capacityJSON)
	return nil
}

// capacityRun is the mode's state: the environment, the load on the
// load API, a connection that reads the statistics, and the standby.
type capacityRun struct {
	o          options
	env        *environment
	l          *load
	ids        *orderIDs // orders created, paid in turn by the payments
	stats      *pgx.Conn // to the database postgres: its reads commit nothing in payments
	postmaster int
	standby    *pgtmp.Cluster
	settings   map[string]string // the primary's, as measured
	storage    string            // the data directory's file system
	idle       idleRates
	last       map[string]float64 // each scenario's last requests/s
	setup      time.Duration
}

func newCapacityRun(ctx context.Context, o options, env *environment) (*capacityRun, error) {
	c := &capacityRun{o: o, env: env, ids: &orderIDs{}, last: map[string]float64{}, settings: map[string]string{}}
	c.l = newLoad(env.loadURL, env.apiKey, env.runID, env.db, o.concurrency+8)
	var err error
	if c.stats, err = pgx.Connect(ctx, env.cluster.URL("postgres")); err != nil {
		return c, err
	}
	var backend int
	if err := c.stats.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return c, err
	}
	if c.postmaster, err = parentPid(backend); err != nil {
		return c, err
	}
	c.storage = fileSystem(env.dataDir)
	if o.syncStandby {
		if err := c.startStandby(ctx); err != nil {
			return c, err
		}
	}
	if err := c.readSettings(ctx); err != nil {
		return c, err
	}
	return c, c.l.setupReplays(ctx, o.replayKeys)
}

// readSettings reads the primary's durability settings as the API's
// sessions see them, and refuses to measure without them.
func (c *capacityRun) readSettings(ctx context.Context) error {
	for _, name := range []string{"server_version", "fsync", "synchronous_commit", "full_page_writes", "synchronous_standby_names"} {
		var v string
		if err := c.stats.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			return err
		}
		c.settings[name] = v
	}
	for _, name := range []string{"fsync", "synchronous_commit", "full_page_writes"} {
		if c.settings[name] != "on" {
			return fmt.Errorf("PostgreSQL runs with %s=%s; -capacity needs durability on", name, c.settings[name])
		}
	}
	return nil
}

// startStandby starts a streaming standby of the primary, makes it the
// primary's synchronous standby, and waits until pg_stat_replication
// says so.
func (c *capacityRun) startStandby(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "loadtest-standby-")
	if err != nil {
		return err
	}
	c.env.dirs = append(c.env.dirs, dir)
	c.standby, err = pgtmp.Start(ctx, pgtmp.Options{Dir: dir, Standby: &pgtmp.Standby{
		Primary: fmt.Sprintf("127.0.0.1:%d", c.env.cluster.Port()), Name: capacityStandbyName,
	}})
	if err != nil {
		return fmt.Errorf("the standby: %w", err)
	}
	for _, sql := range []string{
		`ALTER SYSTEM SET synchronous_standby_names = '"` + capacityStandbyName + `"'`,
		"ALTER SYSTEM SET synchronous_commit = on",
		"SELECT pg_reload_conf()",
	} {
		if _, err := c.stats.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	var state, sync string
	for deadline := time.Now().Add(30 * time.Second); ; {
		err := c.stats.QueryRow(ctx, "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1", capacityStandbyName).Scan(&state, &sync)
		if err == nil && state == "streaming" && sync == "sync" {
			c.settings["replication"] = fmt.Sprintf("%s state=%s sync_state=%s", capacityStandbyName, state, sync)
			return nil
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the standby %s is not a streaming synchronous standby after 30 s (state %q, sync_state %q)", capacityStandbyName, state, sync)
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// close stops the standby (after taking it out of
// synchronous_standby_names, so that no commit waits for it) and closes
// the statistics connection.
func (c *capacityRun) close() {
	ctx := context.Background()
	if c.standby != nil {
		for _, sql := range []string{"ALTER SYSTEM RESET synchronous_standby_names", "SELECT pg_reload_conf()"} {
			if _, err := c.stats.Exec(ctx, sql); err != nil {
				fmt.Fprintln(os.Stderr, "loadtest: release the standby:", err)
			}
		}
		if err := c.standby.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "loadtest: stop the standby:", err)
		}
	}
	if c.stats != nil {
		c.stats.Close(ctx)
	}
}

func (c *capacityRun) logErrors() {
	if lines := harness.ErrorLines(c.env.loadAPI.LogPath, 10); len(lines) > 0 {
		fmt.Fprintf(os.Stderr, "loadtest: the last errors %s logged:\n%s\n", c.env.loadAPI.Name, strings.Join(lines, "\n"))
	}
}

// header writes what is measured, on what.
func (c *capacityRun) header(w io.Writer) {
	s := c.settings
	mode := c.o.execMode
	if mode == "" {
		mode = "cache_statement"
	}
	fmt.Fprintf(w, "loadtest -capacity: PostgreSQL %s (fsync=%s synchronous_commit=%s full_page_writes=%s synchronous_standby_names='%s'), data on %s, %d CPUs, c=%d, pool=%d (%s), %d rounds of %s per scenario, settle %s\n",
		s["server_version"], s["fsync"], s["synchronous_commit"], s["full_page_writes"], s["synchronous_standby_names"],
		c.storage, runtime.NumCPU(), c.o.concurrency, c.o.pool, mode, c.o.rounds, c.o.duration, capacitySettle)
	fmt.Fprintf(w, "scenarios: create, payment, mix (%s), rotating order\n", mixShare)
	if c.standby != nil {
		fmt.Fprintf(w, "sync standby: %s (its CPU is not counted)\n", s["replication"])
	}
}

// measureAll warms up, measures the idle rates, then runs the rounds.
func (c *capacityRun) measureAll(ctx context.Context, stdout io.Writer) ([]capacitySample, error) {
	warm := max(c.o.duration/4, time.Second)
	for _, name := range capacityScenarios {
		if err := c.topUp(ctx, name, warm); err != nil {
			return nil, err
		}
		out, _, err := c.drive(name, warm)
		if err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
		c.last[name] = out.rps()
	}
	if err := c.calibrate(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "idle: %.1f commits/s, %.1f ms of PostgreSQL's CPU per s (the server and the API's background jobs), taken off each window's settle\n",
		c.idle.commits, c.idle.cpu*1000)
	var samples []capacitySample
	for round := 1; round <= c.o.rounds; round++ {
		first := (round - 1) % len(capacityScenarios)
		for _, name := range slices.Concat(capacityScenarios[first:], capacityScenarios[:first]) {
			s, err := c.measure(ctx, name, round)
			if err != nil {
				return nil, fmt.Errorf("round %d: %w", round, err)
			}
			f := s.figures()
			fmt.Fprintf(stdout, "round %d/%d %-7s %6.0f requests/s %6.0f commits/s %5.2f commits/request, PostgreSQL busy %.2f, %6.0f commits/s per vCPU, %6.0f requests/s per vCPU, p99 %.1f ms\n",
				round, c.o.rounds, name, f.rps, f.tps, f.commitsPerRequest, f.busy, f.tpsPerVCPU, f.rpsPerVCPU, s.lat.p99)
			samples = append(samples, s)
		}
	}
	return samples, nil
}

// calibrate measures the idle rates over a settle, after one.
func (c *capacityRun) calibrate(ctx context.Context) error {
	if err := sleepCtx(ctx, capacitySettle); err != nil {
		return err
	}
	r0, err := c.read(ctx)
	if err != nil {
		return err
	}
	if err := sleepCtx(ctx, capacitySettle); err != nil {
		return err
	}
	r1, err := c.read(ctx)
	if err != nil {
		return err
	}
	dt := r1.at.Sub(r0.at).Seconds()
	c.idle = idleRates{commits: float64(r1.commits-r0.commits) / dt, cpu: (r1.cpu - r0.cpu) / dt}
	return nil
}

// read takes a reading of the payments database's counters and of
// PostgreSQL's CPU.
func (c *capacityRun) read(ctx context.Context) (pgReading, error) {
	var r pgReading
	if err := c.stats.QueryRow(ctx, "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = 'payments'").Scan(&r.commits, &r.rollbacks); err != nil {
		return r, err
	}
	var err error
	r.cpu, err = postgresCPU(c.postmaster)
	r.at = time.Now()
	return r, err
}

// effects are the rows and charges a run's checks compare.
type effects struct {
	orders, payments, charges int
}

func (c *capacityRun) effects(ctx context.Context) (effects, error) {
	var e effects
	var err error
	if e.orders, err = c.l.count(ctx, countOrders); err != nil {
		return e, err
	}
	if e.payments, err = c.l.count(ctx, countPayments); err != nil {
		return e, err
	}
	e.charges, err = executedCharges(ctx, c.env.processorURL)
	return e, err
}

// checkEffects fails unless the orders grew by the creates executed, and
// the succeeded payments and the executed charges by the payments: a
// replay, or a payment's retry, writes and charges nothing.
func checkEffects(s capacitySample, before, after effects) error {
	var bad []string
	if d := after.orders - before.orders; d != s.creates {
		bad = append(bad, fmt.Sprintf("%d orders written for %d creates executed", d, s.creates))
	}
	if d := after.payments - before.payments; d != s.payments {
		bad = append(bad, fmt.Sprintf("%d payments succeeded for %d executed", d, s.payments))
	}
	if d := after.charges - before.charges; d != s.payments {
		bad = append(bad, fmt.Sprintf("the processor executed %d charges for %d payments", d, s.payments))
	}
	if len(bad) > 0 {
		return fmt.Errorf("%s: %s", s.scenario, strings.Join(bad, "; "))
	}
	return nil
}

// measure runs scenario once in its window and checks its side effects.
func (c *capacityRun) measure(ctx context.Context, scenario string, round int) (capacitySample, error) {
	if err := c.topUp(ctx, scenario, c.o.duration); err != nil {
		return capacitySample{}, err
	}
	before, err := c.effects(ctx)
	if err != nil {
		return capacitySample{}, err
	}
	if err := sleepCtx(ctx, capacitySettle); err != nil {
		return capacitySample{}, err
	}
	r0, err := c.read(ctx)
	if err != nil {
		return capacitySample{}, err
	}
	out, kinds, err := c.drive(scenario, c.o.duration)
	loadEnd := time.Now()
	if err != nil {
		return capacitySample{}, err
	}
	if err := sleepCtx(ctx, capacitySettle); err != nil {
		return capacitySample{}, err
	}
	r1, err := c.read(ctx)
	if err != nil {
		return capacitySample{}, err
	}
	after, err := c.effects(ctx)
	if err != nil {
		return capacitySample{}, err
	}
	s := newSample(scenario, round, out.outcome, kinds, r0, r1, loadEnd, c.idle)
	s.ranOut = out.ranOut
	if err := checkEffects(s, before, after); err != nil {
		return s, err
	}
	c.last[scenario] = out.rps()
	return s, s.plausible()
}

// capacityOutcome is an attack's outcome, and whether the payments ran
// out of unpaid orders.
type capacityOutcome struct {
	outcome
	ranOut bool
}

// drive runs scenario for d and returns what was answered, by kind.
func (c *capacityRun) drive(scenario string, d time.Duration) (capacityOutcome, [3]int, error) {
	var kinds [3]int
	switch scenario {
	case scenarioCreate:
		out, err := c.l.attack(scenario, c.o.concurrency, d, c.l.createTargeter("/v1/orders", true), status(http.StatusCreated, false), true)
		kinds[kindCreate] = out.ok
		if err == nil {
			err = c.ids.add(out.bodies)
		}
		out.bodies = nil
		return capacityOutcome{outcome: out}, kinds, err
	case scenarioPayment:
		var ranOut atomic.Bool
		out, err := c.l.attack(scenario, c.o.concurrency, d, c.l.paymentTargeter("/v1/payments", true, c.ids, &ranOut), paymentSucceeded, false)
		kinds[kindPayment] = out.ok
		return capacityOutcome{outcome: out, ranOut: ranOut.Load()}, kinds, err
	}
	return c.mix(d)
}

// mix sends the mix for d. Each answer is checked as what it says it
// is (a payment by its path, a replay by its header, otherwise a create),
// and the answers of each kind must be as many as the requests of that
// kind sent: a create answered as a replay, or a replay executed, fails.
func (c *capacityRun) mix(d time.Duration) (capacityOutcome, [3]int, error) {
	create := c.l.createTargeter("/v1/orders", true)
	replay, replayed, err := c.l.replayTargeter()
	if err != nil {
		return capacityOutcome{}, [3]int{}, err
	}
	var ranOut atomic.Bool
	pay := c.l.paymentTargeter("/v1/payments", true, c.ids, &ranOut)
	var seq atomic.Int64
	var sent [3]atomic.Int64
	tr := func(t *vegeta.Target) error {
		kind := mixKind(seq.Add(1) - 1)
		err := [3]vegeta.Targeter{create, replay, pay}[kind](t)
		if err == nil {
			sent[kind].Add(1)
		}
		return err
	}
	var got [3]int
	var created [][]byte
	expect := func(res *vegeta.Result) string {
		kind, check := kindCreate, status(http.StatusCreated, false)
		switch {
		case strings.HasSuffix(res.URL, "/v1/payments"):
			kind, check = kindPayment, paymentSucceeded
		case res.Headers.Get(replayedHeader) == "true":
			kind, check = kindReplay, replayed
		}
		if p := check(res); p != "" {
			return p
		}
		got[kind]++
		if kind == kindCreate {
			created = append(created, res.Body)
		}
		return ""
	}
	out, err := c.l.attack(scenarioMix, c.o.concurrency, d, tr, expect, false)
	if err != nil {
		return capacityOutcome{}, got, err
	}
	for k, name := range []string{"creates", "replays", "payments"} {
		if n := int(sent[k].Load()); got[k] != n {
			return capacityOutcome{}, got, fmt.Errorf("mix: %d %s sent, %d answered as such", n, name, got[k])
		}
	}
	return capacityOutcome{outcome: out, ranOut: ranOut.Load()}, got, c.ids.add(created)
}

// topUp creates, outside any window, the unpaid orders a run of scenario
// for d should find (paymentsNeeded), checking that each was written.
func (c *capacityRun) topUp(ctx context.Context, scenario string, d time.Duration) error {
	// A payment run that ran out took more turns than there were
	// orders: the next unpaid order is the first one added after it.
	c.ids.mu.Lock()
	if int(c.ids.paid.Load()) > len(c.ids.ids) {
		c.ids.paid.Store(int64(len(c.ids.ids)))
	}
	unpaid := len(c.ids.ids) - int(c.ids.paid.Load())
	c.ids.mu.Unlock()
	n := paymentsNeeded(scenario, c.last, d, c.o.concurrency) - unpaid
	if n <= 0 {
		return nil
	}
	var made atomic.Int64
	create := c.l.createTargeter("/v1/orders", true)
	tr := func(t *vegeta.Target) error {
		if made.Add(1) > int64(n) {
			return vegeta.ErrNoTargets
		}
		return create(t)
	}
	var out outcome
	err := c.l.checkRows(ctx, "orders to pay", countOrders, func() (int, error) {
		var err error
		out, err = c.l.attack("orders to pay", c.o.concurrency, 0, tr, status(http.StatusCreated, false), true)
		return out.ok, err
	})
	if err != nil {
		return err
	}
	return c.ids.add(out.bodies)
}

// capacitySeries are one scenario's figures, one entry per round.
type capacitySeries struct {
	rps, tps, tpsPerVCPU, rpsPerVCPU, perRequest, busy, p50, p95, p99 series
	requests, creates, replays, payments                              int
	ranOut                                                            bool
}

// summarize gathers the samples by scenario.
func summarize(samples []capacitySample) map[string]*capacitySeries {
	out := map[string]*capacitySeries{}
	for _, s := range samples {
		c := out[s.scenario]
		if c == nil {
			c = &capacitySeries{}
			out[s.scenario] = c
		}
		f := s.figures()
		c.rps, c.tps = append(c.rps, f.rps), append(c.tps, f.tps)
		c.tpsPerVCPU, c.rpsPerVCPU = append(c.tpsPerVCPU, f.tpsPerVCPU), append(c.rpsPerVCPU, f.rpsPerVCPU)
		c.perRequest, c.busy = append(c.perRequest, f.commitsPerRequest), append(c.busy, f.busy)
		c.p50, c.p95, c.p99 = append(c.p50, s.lat.p50), append(c.p95, s.lat.p95), append(c.p99, s.lat.p99)
		c.requests += s.requests
		c.creates += s.creates
		c.replays += s.replays
		c.payments += s.payments
		c.ranOut = c.ranOut || s.ranOut
	}
	return out
}

// capacityReport writes the table, the checks and the summary line.
func capacityReport(w io.Writer, o options, samples []capacitySample) {
	sum := summarize(samples)
	fmt.Fprintf(w, "\ncapacity at c=%d, median (range) over %d rounds of %s; per vCPU = per second of PostgreSQL's CPU:\n", o.concurrency, o.rounds, o.duration)
	fmt.Fprintf(w, "  %-8s %-18s %-18s %-18s %-18s %-18s %-18s %-16s %-16s %s\n",
		"", "requests/s", "commits/s", "commits/request", "commits/s/vCPU", "requests/s/vCPU", "PostgreSQL busy", "p50 ms", "p95 ms", "p99 ms")
	for _, name := range capacityScenarios {
		c := sum[name]
		if c == nil {
			continue
		}
		fmt.Fprintf(w, "  %-8s %-18s %-18s %-18s %-18s %-18s %-18s %-16s %-16s %s\n", name,
			c.rps.format(0), c.tps.format(0), c.perRequest.format(2), c.tpsPerVCPU.format(0), c.rpsPerVCPU.format(0),
			c.busy.format(2), c.p50.format(1), c.p95.format(1), c.p99.format(1))
	}
	fmt.Fprintln(w, "  (commits: the payments database's xact_commit, the API's background jobs included; PostgreSQL busy: its CPU seconds per wall second)")
	for _, name := range capacityScenarios {
		if c := sum[name]; c != nil && c.ranOut {
			fmt.Fprintf(w, "  (%s ran out of unpaid orders before its time in some round; its rates are over the time it ran)\n", name)
		}
	}
	var creates, replays, payments int
	for _, c := range sum {
		creates, replays, payments = creates+c.creates, replays+c.replays, payments+c.payments
	}
	fmt.Fprintf(w, "checked: %d creates executed, %d orders written; %d replays, none written; %d payments succeeded, as many charges executed at the processor\n",
		creates, creates, replays, payments)
	fields := []string{
		fmt.Sprintf("cpus=%d", runtime.NumCPU()),
		fmt.Sprintf("sync_standby=%t", o.syncStandby),
		fmt.Sprintf("c=%d", o.concurrency),
		fmt.Sprintf("rounds=%d", o.rounds),
		fmt.Sprintf("duration_s=%g", o.duration.Seconds()),
	}
	for _, name := range capacityScenarios {
		if c := sum[name]; c != nil {
			fields = append(fields,
				fmt.Sprintf("%s_rps=%.0f", name, c.rps.median()),
				fmt.Sprintf("%s_tps=%.0f", name, c.tps.median()),
				fmt.Sprintf("%s_tps_per_vcpu=%.0f", name, c.tpsPerVCPU.median()),
				fmt.Sprintf("%s_rps_per_vcpu=%.0f", name, c.rpsPerVCPU.median()),
				fmt.Sprintf("%s_commits_per_request=%.2f", name, c.perRequest.median()),
				fmt.Sprintf("%s_pg_busy=%.2f", name, c.busy.median()),
				fmt.Sprintf("%s_p99_ms=%.1f", name, c.p99.median()))
		}
	}
	fmt.Fprintf(w, "\ncapacity: %s\n", strings.Join(fields, " "))
}

// capacityFile is the JSON results file (the shape is described at the
// top of this file).
type capacityFile struct {
	System          string            `json:"system"`
	Date            string            `json:"date"`
	Instance        capacityInstance  `json:"instance"`
	Machine         string            `json:"machine"`
	ClusterSize     int               `json:"cluster_size"`
	Tuned           string            `json:"tuned"`
	Comment         string            `json:"comment"`
	PostgresVersion string            `json:"postgres_version"`
	Benchmark       capacityBenchmark `json:"benchmark"`
	Load            capacityLoad      `json:"load"`
	Results         []capacityResult  `json:"results"`
	Summary         []capacitySummary `json:"summary"`
}

type capacityInstance struct {
	Type            string `json:"type"`
	VCPUs           int    `json:"vcpus"`
	RAMGB           int    `json:"ram_gb"`
	InstanceStorage string `json:"instance_storage"`
	PrimaryStorage  string `json:"primary_storage"`
}

type capacityBenchmark struct {
	Tool                    string  `json:"tool"`
	Workload                string  `json:"workload"`
	Clients                 int     `json:"clients"`
	Threads                 int     `json:"threads"`
	Duration                float64 `json:"duration"`
	QueryMode               string  `json:"query_mode"`
	Pool                    int     `json:"pool"`
	Rounds                  int     `json:"rounds"`
	SyncStandby             string  `json:"sync_standby"`
	Fsync                   string  `json:"fsync"`
	SynchronousCommit       string  `json:"synchronous_commit"`
	SynchronousStandbyNames string  `json:"synchronous_standby_names"`
	SettleSeconds           float64 `json:"settle_seconds"`
	IdleCommitsPerSecond    float64 `json:"idle_commits_per_second"`
	IdleCPUPerSecond        float64 `json:"idle_cpu_per_second"`
}

type capacityLoad struct {
	LoadTimeSeconds float64 `json:"load_time_seconds"`
}

type capacityResult struct {
	Run                int     `json:"run"`
	Scenario           string  `json:"scenario"`
	TPS                float64 `json:"tps"`
	Transactions       float64 `json:"transactions"`
	FailedTransactions float64 `json:"failed_transactions"`
	LatencyAvgMs       float64 `json:"latency_avg_ms"`
	LatencyStddevMs    float64 `json:"latency_stddev_ms"`
	LatencyP50Ms       float64 `json:"latency_p50_ms"`
	LatencyP95Ms       float64 `json:"latency_p95_ms"`
	LatencyP99Ms       float64 `json:"latency_p99_ms"`
	Requests           int     `json:"requests"`
	Creates            int     `json:"creates"`
	Replays            int     `json:"replays"`
	Payments           int     `json:"payments"`
	RPS                float64 `json:"rps"`
	WallSeconds        float64 `json:"wall_seconds"`
	PostgresCPUSeconds float64 `json:"postgres_cpu_seconds"`
	PostgresBusy       float64 `json:"postgres_busy"`
	TPSPerVCPU         float64 `json:"tps_per_vcpu"`
	RPSPerVCPU         float64 `json:"rps_per_vcpu"`
	CommitsPerRequest  float64 `json:"commits_per_request"`
}

type capacitySummary struct {
	Scenario          string  `json:"scenario"`
	Runs              int     `json:"runs"`
	TPS               float64 `json:"tps"`
	RPS               float64 `json:"rps"`
	TPSPerVCPU        float64 `json:"tps_per_vcpu"`
	RPSPerVCPU        float64 `json:"rps_per_vcpu"`
	CommitsPerRequest float64 `json:"commits_per_request"`
	PostgresBusy      float64 `json:"postgres_busy"`
	LatencyP50Ms      float64 `json:"latency_p50_ms"`
	LatencyP95Ms      float64 `json:"latency_p95_ms"`
	LatencyP99Ms      float64 `json:"latency_p99_ms"`
}

// r3 rounds to 3 decimals, as the results files write their figures.
func r3(v float64) float64 { return math.Round(v*1000) / 1000 }

// capacityResults are the samples as the file's results and summary.
func capacityResults(samples []capacitySample) ([]capacityResult, []capacitySummary) {
	var results []capacityResult
	for _, s := range samples {
		f := s.figures()
		results = append(results, capacityResult{
			Run: s.round, Scenario: s.scenario, TPS: r3(f.tps), Transactions: math.Round(s.commits), FailedTransactions: s.rollbacks,
			LatencyAvgMs: r3(s.lat.avg), LatencyStddevMs: r3(s.lat.stddev),
			LatencyP50Ms: r3(s.lat.p50), LatencyP95Ms: r3(s.lat.p95), LatencyP99Ms: r3(s.lat.p99),
			Requests: s.requests, Creates: s.creates, Replays: s.replays, Payments: s.payments,
			RPS: r3(f.rps), WallSeconds: r3(s.wall.Seconds()), PostgresCPUSeconds: r3(s.cpu), PostgresBusy: r3(f.busy),
			TPSPerVCPU: r3(f.tpsPerVCPU), RPSPerVCPU: r3(f.rpsPerVCPU), CommitsPerRequest: r3(f.commitsPerRequest),
		})
	}
	sum := summarize(samples)
	var summary []capacitySummary
	for _, name := range capacityScenarios {
		c := sum[name]
		if c == nil {
			continue
		}
		summary = append(summary, capacitySummary{
			Scenario: name, Runs: len(c.rps), TPS: r3(c.tps.median()), RPS: r3(c.rps.median()),
			TPSPerVCPU: r3(c.tpsPerVCPU.median()), RPSPerVCPU: r3(c.rpsPerVCPU.median()),
			CommitsPerRequest: r3(c.perRequest.median()), PostgresBusy: r3(c.busy.median()),
			LatencyP50Ms: r3(c.p50.median()), LatencyP95Ms: r3(c.p95.median()), LatencyP99Ms: r3(c.p99.median()),
		})
	}
	return results, summary
}

// result is the run as the JSON results file.
func (c *capacityRun) result(samples []capacitySample) capacityFile {
	vcpus, ram := runtime.NumCPU(), memTotalGB()
	mode := c.o.execMode
	if mode == "" {
		mode = "cache_statement"
	}
	f := capacityFile{
		System:   "idemref payments API (Go, pgx) on PostgreSQL",
		Date:     time.Now().Format(time.DateOnly),
		Instance: capacityInstance{Type: cpuModel(), VCPUs: vcpus, RAMGB: ram, PrimaryStorage: c.storage + " (local)"},
		Machine:  fmt.Sprintf("%dvCPU, %dGB RAM", vcpus, ram),
		Tuned:    "no", ClusterSize: 1,
		Comment: "the API, the load generator and PostgreSQL share the machine; tps is the payments database's commits per second, " +
			"per vCPU per second of PostgreSQL's CPU (the postmaster and its children); failed_transactions are its rollbacks",
		PostgresVersion: c.settings["server_version"],
		Benchmark: capacityBenchmark{
			Tool: "loadtest -capacity", Workload: "create, payment, mix " + mixShare + " over HTTP (vegeta), each run checked",
			Clients: c.o.concurrency, Threads: vcpus, Duration: c.o.duration.Seconds(), QueryMode: mode,
			Pool: c.o.pool, Rounds: c.o.rounds, SyncStandby: "no",
			Fsync: c.settings["fsync"], SynchronousCommit: c.settings["synchronous_commit"],
			SynchronousStandbyNames: c.settings["synchronous_standby_names"], SettleSeconds: capacitySettle.Seconds(),
			IdleCommitsPerSecond: r3(c.idle.commits), IdleCPUPerSecond: math.Round(c.idle.cpu*1e6) / 1e6,
		},
		Load: capacityLoad{LoadTimeSeconds: r3(c.setup.Seconds())},
	}
	if c.o.syncStandby {
		f.ClusterSize, f.Benchmark.SyncStandby = 2, "yes"
	}
	f.Results, f.Summary = capacityResults(samples)
	return f
}

// writeCapacityJSON writes f to path, making its directory.
func writeCapacityJSON(path string, f capacityFile) error {
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// memTotalGB is the machine's memory, in GB, rounded (/proc/meminfo).
func memTotalGB() int {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return int(math.Round(kb / (1 << 20)))
		}
	}
	return 0
}

// cpuModel is the first CPU's model name (/proc/cpuinfo).
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if name, value, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(name) == "model name" {
			return strings.TrimSpace(value)
		}
	}
	return runtime.GOARCH
}

// fileSystem names the file system dir is on: on tmpfs an fsync costs
// nothing, and the figures would not be a durable server's.
func fileSystem(dir string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return "an unknown file system"
	}
	names := map[int64]string{0xEF53: "ext4", 0x58465342: "xfs", 0x9123683E: "btrfs", 0x01021994: "tmpfs (no real fsync)", 0x794C7630: "overlayfs", 0x2FC12FC1: "zfs"}
	if name, ok := names[int64(st.Type)]; ok {
		return name
	}
	return fmt.Sprintf("file system 0x%x", st.Type)
}
