package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/tooling/harness"
	"github.com/idemref/payments/internal/tooling/natstmp"
	"github.com/idemref/payments/internal/tooling/pgtmp"
	"github.com/idemref/payments/internal/tooling/pgwire"
)

// environment is everything the benchmark started.
type environment struct {
	settings map[string]string
	cluster  *pgtmp.Cluster
	memGroup *memoryGroup // with -pg-memory: the cgroup PostgreSQL runs in (memlimit.go)

	timeOrderedKeys bool     // -key-order time (storedkeys.go)
	dirs            []string // temporary directories to remove
	keep            bool
	processor       *harness.Process
	loadAPI         *harness.Process // the API under load, straight to PostgreSQL
	probeAPI        *harness.Process // the API measured at the wire, through the proxy
	tracedAPI       *harness.Process // the load API's twin with tracing on (tracing.go)
	sink            *spanSink        // where the traced API exports its spans
	proxy           *pgwire.Proxy
	db              *pgxpool.Pool   // straight to PostgreSQL, for the checks
	nats            *natstmp.Server // the events broker both APIs publish to

	processorURL      string
	loadURL, probeURL string // the two APIs, http://host:port
	tracedURL         string // the traced API, http://host:port
	apiKey            string
	unusedKeys        [2]string // for the probe's authentication cache miss
	runID             string

	// With -stored-keys (storedkeys.go) there is no probe; instead a
	// second database, filled with key rows, and its own API process,
	// started after the fill with the load API's binary and settings.
	// tenants names the benchmark's tenants, the same in both databases;
	// apiKeys and fullKeys are their API keys there (apiKeys[0] is apiKey).
	tenants           []string
	apiKeys, fullKeys []string
	templateKey       string // the API key of the tenant whose create the fill copies
	fullDBURL         string
	fullDB            *pgxpool.Pool
	fullAPI           *harness.Process
	fullURL           string
	dataDir           string
	apiBin, workDir   string
	apiEnv            []string // the environment both APIs run with, but DATABASE_URL

	// The peers (peers.go) and the crash test (crash.go).
	redis       *redisServer
	fiber       *harness.Process
	fiberURL    string
	fiberBin    string
	crashAPIBin string // the API built with -tags "loadtest failpoints"
	tenantID    string // the benchmark's tenant, whose API key is apiKey
	apiDBURL    string // DATABASE_URL of the load API (its pool size)
}

// start builds and starts everything; on error, what it started is in the
// returned environment for stop.
func start(ctx context.Context, o options) (*environment, error) {
	env := &environment{keep: o.keep, runID: randomHex(4), timeOrderedKeys: o.keyOrder == "time"}
	root, err := harness.ModuleRoot()
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "loadtest-")
	if err != nil {
		return nil, err
	}
	env.dirs = append(env.dirs, work)
	// The data directory is its own temporary directory: when we are root,
	// PostgreSQL runs as another user, who must be able to reach it.
	dataDir, err := os.MkdirTemp("", "loadtest-pg-")
	if err != nil {
		return env, err
	}
	env.dirs = append(env.dirs, dataDir)
	env.dataDir = dataDir

	apiBin, err := harness.Build(root, work, "api", "./cmd/api", "loadtest")
	if err != nil {
		return env, err
	}
	processorBin, err := harness.Build(root, work, "processor", "./tools/processor", "")
	if err != nil {
		return env, err
	}

	dbURL, err := env.prepareDatabase(ctx, apiBin, dataDir, o.pgMemory)
	if err != nil {
		return env, err
	}
	if err := env.startBrokerAndProcessor(ctx, work, processorBin); err != nil {
		return env, err
	}

	// Both APIs run as `api serve` with its defaults, except that the
	// per-tenant rate limit is off (the benchmark is one tenant sending as
	// fast as it can) and the pool size is fixed.
	apiURL := dbURL + "&pool_max_conns=" + strconv.Itoa(o.pool)
	if o.execMode != "" {
		apiURL += "&default_query_exec_mode=" + o.execMode
	}
	// No balancer in front: SHUTDOWN_GRACE=0 stops the processes at once.
	common := []string{"ADDR=127.0.0.1:0", "PROCESSOR_URL=" + env.processorURL, "RATE_LIMIT_RPS=0", "NATS_URL=" + env.nats.URL(), "SHUTDOWN_GRACE=0"}
	common = append(common, untracedEnv...)
	var addr string
	loadEnv := append(slices.Clip(common), "DATABASE_URL="+apiURL)
	if o.soak > 0 {
		// The soak's API alone runs with its horizons scaled (soak.go).
		loadEnv = append(loadEnv, soakEnv(soakFactor)...)
	}
	env.loadAPI, addr, err = harness.StartProcess(ctx, work, "api-load", apiBin, []string{"serve"}, loadEnv, "listening")
	if err != nil {
		return env, err
	}
	env.loadURL = "http://" + addr
	env.apiBin, env.workDir, env.apiEnv, env.apiDBURL = apiBin, work, common, apiURL
	if o.storedKeys > 0 {
		return env, setupStoredKeys(ctx, o, env)
	}
	if o.capacity || o.soak > 0 {
		return env, nil // the load API alone (capacity.go, soak.go)
	}
	if err := startPeers(ctx, env, root); err != nil {
		return env, err
	}
	return env, env.startObservedAPIs(ctx)
}

// prepareDatabase starts PostgreSQL in dataDir, migrates it with apiBin,
// creates the benchmark's tenants and opens env.db; it returns the
// database's URL.
func (env *environment) prepareDatabase(ctx context.Context, apiBin, dataDir string, memLimit int64) (string, error) {
	var err error
	env.cluster, env.settings, err = startDatabase(ctx, dataDir)
	if err != nil {
		return "", err
	}
	if memLimit > 0 {
		if env.memGroup, err = newMemoryGroup("loadtest-pg-"+env.runID, memLimit); err != nil {
			return "", err
		}
		if err := env.memGroup.join(env.cluster.Pid()); err != nil {
			return "", err
		}
	}
	dbURL := env.cluster.URL("payments")
	migrate := exec.CommandContext(ctx, apiBin, "migrate", "up")
	migrate.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
	if out, err := migrate.CombinedOutput(); err != nil {
		return "", fmt.Errorf("api migrate up: %w\n%s", err, out)
	}
	if env.apiKey, err = harness.CreateTenant(apiBin, dbURL, "loadtest"); err != nil {
		return "", err
	}
	for i := range env.unusedKeys {
		if env.unusedKeys[i], err = harness.CreateTenant(apiBin, dbURL, "loadtest-unused-"+strconv.Itoa(i)); err != nil {
			return "", err
		}
	}
	if env.db, err = pgxpool.New(ctx, dbURL); err != nil {
		return "", err
	}
	return dbURL, nil
}

// startBrokerAndProcessor starts NATS and the processor simulator.
func (env *environment) startBrokerAndProcessor(ctx context.Context, work, processorBin string) error {
	// The broker: serve publishes every payment's event through it (the
	// outbox relay), so it is part of what a payment costs.
	natsDir, err := os.MkdirTemp("", "loadtest-nats-")
	if err != nil {
		return err
	}
	env.dirs = append(env.dirs, natsDir)
	if env.nats, err = natstmp.Start(natsDir); err != nil {
		return err
	}
	var addr string
	env.processor, addr, err = harness.StartProcess(ctx, work, "processor", processorBin, nil,
		[]string{"PROCESSOR_ADDR=127.0.0.1:0"}, "processor simulator listening")
	if err != nil {
		return err
	}
	env.processorURL = "http://" + addr
	return nil
}

// startObservedAPIs starts the probe's API, behind the round-trip counting
// proxy, and the traced API, each with the load API's settings.
func (env *environment) startObservedAPIs(ctx context.Context) error {
	work, apiBin, common, apiURL := env.workDir, env.apiBin, env.apiEnv, env.apiDBURL
	var err error
	if env.proxy, err = pgwire.Listen(net.JoinHostPort("127.0.0.1", strconv.Itoa(env.cluster.Port()))); err != nil {
		return err
	}
	proxied, err := env.proxy.URL(apiURL)
	if err != nil {
		return err
	}
	// The probe's background jobs (completer, reaper, outbox relay, orders
	// consumer) are off, so that every round trip the proxy counts belongs
	// to the request being measured; the load API relays its events.
	var addr string
	env.probeAPI, addr, err = harness.StartProcess(ctx, work, "api-probe", apiBin, []string{"serve"},
		append(common, "DATABASE_URL="+proxied, "COMPLETER_INTERVAL=0", "REAPER_INTERVAL=0", "EVENT_WORKERS=false"), "listening")
	if err != nil {
		return err
	}
	env.probeURL = "http://" + addr

	// The traced API: the load API's settings with tracing on, every
	// request sampled, exporting to the sink (tracing.go). Its background
	// jobs are off, as the probe's are, so that the load API alone relays
	// and consumes the payments' events and those figures stay as they
	// were; during a create run the load API's jobs are idle either way.
	if env.sink, err = startSpanSink(); err != nil {
		return err
	}
	env.tracedAPI, addr, err = harness.StartProcess(ctx, work, "api-traced", apiBin, []string{"serve"},
		slices.Concat(common, []string{"DATABASE_URL=" + apiURL, "COMPLETER_INTERVAL=0", "REAPER_INTERVAL=0", "EVENT_WORKERS=false"}, tracedEnv(env.sink.url)), "listening")
	if err != nil {
		return err
	}
	env.tracedURL = "http://" + addr
	return nil
}

// stop ends every process, the proxy and PostgreSQL, and removes the
// temporary directories (unless -keep).
func (env *environment) stop() {
	for _, p := range []*harness.Process{env.fiber, env.tracedAPI, env.probeAPI, env.fullAPI, env.loadAPI, env.processor} {
		if p != nil {
			p.Stop()
		}
	}
	if env.redis != nil {
		env.redis.stop()
	}
	if env.sink != nil {
		env.sink.close()
	}
	if env.proxy != nil {
		_ = env.proxy.Close()
	}
	if env.nats != nil {
		env.nats.Shutdown()
	}
	if env.db != nil {
		env.db.Close()
	}
	if env.fullDB != nil {
		env.fullDB.Close()
	}
	if env.cluster != nil {
		if err := env.cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "loadtest: stop PostgreSQL:", err)
		}
	}
	if env.memGroup != nil {
		if err := env.memGroup.remove(); err != nil {
			fmt.Fprintln(os.Stderr, "loadtest: remove PostgreSQL's memory cgroup:", err)
		}
	}
	for _, d := range env.dirs {
		if env.keep {
			fmt.Fprintln(os.Stderr, "loadtest: kept", d)
			continue
		}
		_ = os.RemoveAll(d)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
