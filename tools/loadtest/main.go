// Command loadtest is the service's load benchmark (make loadtest): it
// starts a private PostgreSQL with its durability defaults, the real API
// binary (built with -tags loadtest, which adds the baseline route without
// idempotency) and the processor simulator as separate processes, and
// drives the API over HTTP with vegeta at a fixed concurrency:
//
//	create    POST /v1/orders under fresh keys (executions)
//	baseline  POST /v1/_baseline/orders, the same create without the key
//	replay    POST /v1/orders under keys already used (replays)
//	get       GET /v1/orders/{id}
//	payment   POST /v1/payments on fresh orders, fresh keys
//	storm     N identical requests under one key at once
//
// in interleaved rounds, and prints each figure as its median and range
// over the rounds, the ratios the service is held to, the round trips and
// statements of single requests (counted at the wire by internal/tooling/pgwire),
// and the API process's memory. It checks its own traffic: a create must
// be an execution and write one order, a replay must be a replay and write
// nothing, a storm must execute once; anything else fails the run.
//
// Its last line is machine-readable, one name=value per figure:
//
//	loadtest: p1=0.83 p3=0.52 p4=2.4 p5_p99_ms=70 ... rss_mb=25
//
// Usage:
//
//	loadtest [-rounds 5] [-duration 4s] [-c 32] [-pool 4] [-storm 200] [-exec-mode M] [-short]
//	loadtest -stored-keys 20000000 [-rounds 5] [-duration 4s] [-c 32] [-pool 4] [-short]
//	loadtest -capacity [-sync-standby] [-capacity-json PATH] [-rounds 3] [-duration 20s] [-c 32] [-pool 4] [-short]
//
// -capacity measures commits per second per vCPU of the primary and
// commits per request (capacity.go).
//
// -short (or LOADTEST_SHORT=1) is the smoke test CI runs: 2 short rounds,
// which proves the benchmark works and says nothing about speed.
//
// -stored-keys N measures instead what a full key table costs a create
// (storedkeys.go): a second database in the same cluster gets N key rows,
// a second API process (the same binary and settings) serves it, and each
// round runs the create scenario, under random UUID keys, against the
// empty database and the full one, alternating which goes first. The
// other scenarios, the probe and the ratios P1 to P5 are skipped, so that
// the two sides differ only by the table. The N rows are what a service
// that receives N keys per IDEMPOTENCY_KEY_RETENTION holds: a third
// completed with the recorded response of an order (copied from a real
// create), two thirds tombstones; random UUID keys, spread over the
// benchmark's tenants (N/500,000 of them, so that none reaches the default
// key budget), created_at spread over the retention, oldest first, and no
// row due for the reaper during the run. Only the key table is filled, not
// the orders those keys created. 20 million rows take about 8 minutes to
// fill on 2 cores, and 10 GB of disk. It prints the create rate on each
// side, full / empty per round, and the full table's sizes (heap, TOAST,
// each index) and rows, and ends with:
//
//	loadtest: stored_keys=20000000 tenants=40 create_full_rps=921 create_empty_rps=1015 full_over_empty=0.91 ... table_mb=7891 toast_mb=0 indexes_mb=2394 fill_s=494
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/idemref/payments/internal/tooling/harness"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadtest: FAILED:", err)
		os.Exit(1)
	}
}

type options struct {
	rounds      int
	duration    time.Duration // of each scenario in each round
	concurrency int
	pool        int // the API's pool_max_conns
	storm       int
	replayKeys  int
	samples     int // single requests measured at the wire, per kind
	short       bool
	keep        bool   // keep the temporary directories (logs, data)
	pgbench     bool   // measure PostgreSQL's CPU per create with pgbench instead (pgbench.go)
	storedKeys  int64  // > 0: creates against an empty key table and one holding this many keys instead (storedkeys.go)
	execMode    string // pgx's default_query_exec_mode for the APIs; "" keeps pgx's default (cache_statement)
	crashTrials int    // crashes per party in the crash test (crash.go)
	pgMemory    int64  // > 0: PostgreSQL runs in a memory cgroup of this many bytes (memlimit.go)
	keyOrder    string // -stored-keys: "random" (version 4) or "time" (version 7) keys

	capacity     bool   // commits per second per vCPU of the primary instead (capacity.go)
	syncStandby  bool   // -capacity with a synchronous standby
	capacityJSON string // -capacity's results file, if any

	soak         time.Duration // > 0: the soak instead (soak.go)
	soakInterval time.Duration // between the soak's rows
	soakPlot     string        // the soak's PNG; its CSV beside it
	soakRate     int           // > 0: the soak's requests arrive at this rate (open loop) rather than from -c clients
}

func parseOptions(args []string, getenv func(string) string) (options, error) {
	var o options
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.IntVar(&o.rounds, "rounds", 5, "interleaved rounds")
	fs.DurationVar(&o.duration, "duration", 4*time.Second, "duration of each scenario in each round")
	fs.IntVar(&o.concurrency, "c", 32, "concurrent clients")
	fs.IntVar(&o.pool, "pool", 4, "the API's database pool size (pool_max_conns)")
	fs.IntVar(&o.storm, "storm", 200, "simultaneous duplicates in the storm")
	fs.IntVar(&o.replayKeys, "replay-keys", 100, "keys the replay scenario cycles through")
	fs.IntVar(&o.crashTrials, "crash-trials", 3, "crashes per party (ours and each peer) in the crash test")
	fs.IntVar(&o.samples, "samples", 7, "single requests measured at the wire, per kind")
	fs.BoolVar(&o.short, "short", getenv("LOADTEST_SHORT") == "1", "smoke test: 2 rounds of 1s (also LOADTEST_SHORT=1)")
	fs.BoolVar(&o.keep, "keep", false, "keep the temporary directories (logs, database) and print where they are")
	fs.BoolVar(&o.pgbench, "pgbench", false, "instead: PostgreSQL's CPU per transaction for the create's statements and variants without each piece, driven by pgbench")
	fs.StringVar(&o.execMode, "exec-mode", "", "pgx's default_query_exec_mode for the APIs' pool (cache_statement, cache_describe, describe_exec, exec, simple_protocol); empty keeps pgx's default, cache_statement")
	fs.Int64Var(&o.storedKeys, "stored-keys", 0, "instead: create throughput against a key table holding this many random keys (a third completed, two thirds tombstones) versus an empty one, in interleaved rounds, with the full table's sizes; only the create scenario runs (0: off)")
	fs.StringVar(&o.keyOrder, "key-order", "random", "with -stored-keys: the keys stored and sent, random (version 4 UUIDs) or time (time-ordered, as version 7 UUIDs)")
	pgMemory := fs.String("pg-memory", "", "hold PostgreSQL, its backends and the page cache they read through to this much memory (e.g. 1GiB) in a memory cgroup, so that a key table larger than it is past memory (needs root or a delegated cgroup; empty: no limit)")
	fs.BoolVar(&o.capacity, "capacity", false, "instead: commits and requests per second per vCPU of PostgreSQL, and commits per request, for create, payment and a mix (3 rounds of 20s unless given; -short: 1 of 2s)")
	fs.BoolVar(&o.syncStandby, "sync-standby", false, "-capacity with a streaming standby in synchronous_standby_names (synchronous_commit on)")
	fs.StringVar(&o.capacityJSON, "capacity-json", "", "-capacity: write the results to this JSON file (PostgresBench's shape)")
	fs.DurationVar(&o.soak, "soak", 0, "instead: a day of churn in this long, the API's horizons divided by 432, c=8 unless -c is given; a row every -soak-interval, judged at the end (soak.go; 0: off)")
	fs.DurationVar(&o.soakInterval, "soak-interval", time.Minute, "with -soak: the time between rows")
	fs.StringVar(&o.soakPlot, "soak-plot", "", "with -soak: write the rows' plot to this PNG, and the rows as CSV beside it")
	fs.IntVar(&o.soakRate, "soak-rate", 0, "with -soak: requests arrive at this many a second whatever the answers' latency (open loop, at most 64 in flight) instead of from -c closed-loop clients; 0: closed loop")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if *pgMemory != "" {
		var err error
		if o.pgMemory, err = parseBytes(*pgMemory); err != nil {
			return o, fmt.Errorf("-pg-memory %w", err)
		}
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.short {
		// Flags given explicitly win over the short defaults.
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["rounds"] {
			o.rounds = 2
		}
		if !set["duration"] {
			o.duration = time.Second
		}
		if !set["samples"] {
			o.samples = 3
		}
		if !set["replay-keys"] {
			o.replayKeys = 20
		}
		if !set["crash-trials"] {
			o.crashTrials = 1
		}
	}
	if err := capacityOptions(&o, fs); err != nil {
		return o, err
	}
	if o.rounds < 1 || o.duration <= 0 || o.concurrency < 1 || o.pool < 1 || o.storm < 2 || o.replayKeys < 1 || o.samples < 1 || o.crashTrials < 1 {
		return o, fmt.Errorf("every count and duration must be positive (storm at least 2)")
	}
	switch o.execMode {
	case "", "cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol":
	default:
		return o, fmt.Errorf("-exec-mode %q: want one of pgx's query exec modes (cache_statement, cache_describe, describe_exec, exec, simple_protocol)", o.execMode)
	}
	if o.storedKeys < 0 {
		return o, fmt.Errorf("-stored-keys %d: want how many key rows to store, or 0 for the default benchmark", o.storedKeys)
	}
	if o.keyOrder != "random" && o.keyOrder != "time" {
		return o, fmt.Errorf("-key-order %q: want random or time", o.keyOrder)
	}
	if o.pgMemory > 0 && o.pgbench {
		return o, fmt.Errorf("-pg-memory applies to the HTTP benchmarks; -pgbench runs its own server unlimited")
	}
	if err := soakDefaults(fs, &o); err != nil {
		return o, err
	}
	if o.storedKeys > 0 && o.pgbench {
		return o, fmt.Errorf("-stored-keys and -pgbench are separate benchmarks; give one")
	}
	return o, nil
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	o, err := parseOptions(args, getenv)
	if err != nil {
		return err
	}
	if o.pgbench {
		return runPgbench(ctx, o, stdout)
	}
	if o.capacity {
		return runCapacity(ctx, o, stdout)
	}
	env, err := start(ctx, o)
	if env != nil {
		defer env.stop()
	}
	if err != nil {
		return err
	}
	if o.storedKeys > 0 {
		return runStoredKeys(ctx, o, env, stdout)
	}
	if o.soak > 0 {
		return runSoak(ctx, o, env, stdout)
	}
	mode := o.execMode
	if mode == "" {
		mode = "cache_statement"
	}
	fmt.Fprintf(stdout, "loadtest: PostgreSQL %s (fsync=%s synchronous_commit=%s full_page_writes=%s), %d CPUs, c=%d, pool=%d (%s), %d rounds of %s per scenario, storm of %d\n",
		env.settings["server_version"], env.settings["fsync"], env.settings["synchronous_commit"], env.settings["full_page_writes"],
		runtime.NumCPU(), o.concurrency, o.pool, mode, o.rounds, o.duration, o.storm)
	res, err := measureAll(ctx, o, env, stdout)
	if err != nil {
		for _, p := range []*harness.Process{env.loadAPI, env.probeAPI} {
			if lines := harness.ErrorLines(p.LogPath, 10); len(lines) > 0 {
				fmt.Fprintf(os.Stderr, "loadtest: the last errors %s logged:\n%s\n", p.Name, strings.Join(lines, "\n"))
			}
		}
		return err
	}
	report(stdout, o, res)
	return nil
}
