package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/tooling/harness"
)

// binaries are the module's commands the deployment runs, built once.
type binaries struct {
	api, processor string
}

// buildBinaries compiles cmd/api and tools/processor into dir.
func buildBinaries(dir string) (binaries, error) {
	root, err := harness.ModuleRoot()
	if err != nil {
		return binaries{}, err
	}
	api, err := harness.Build(root, dir, "api", "./cmd/api", "")
	if err != nil {
		return binaries{}, err
	}
	processor, err := harness.Build(root, dir, "processor", "./tools/processor", "")
	if err != nil {
		return binaries{}, err
	}
	return binaries{api: api, processor: processor}, nil
}

// deployOptions shapes one scenario's deployment.
type deployOptions struct {
	// Async runs Patroni without synchronous_mode: the standby streams
	// without the leader waiting for it, the negative control's
	// misconfiguration.
	Async bool
	// APIs is how many API processes serve the load.
	APIs int
	Log  *slog.Logger
}

// The API processes' settings: the production defaults, except the
// clocks that decide how soon an abandoned payment is finished and an
// unacknowledged event redelivered, shortened so that a scenario settles
// in seconds rather than minutes. Their ratios keep the rules config.go
// enforces (lease > processor timeout, settle window > processor timeout,
// duplicates window > claim hold + publish timeout).
var apiSettings = []string{
	"RATE_LIMIT_RPS=0",
	"PROCESSOR_TIMEOUT=2s",
	"PAYMENT_LEASE=4s",
	"PROCESSOR_SETTLE_WINDOW=4s",
	"COMPLETER_INTERVAL=500ms",
	"EVENTS_ACK_WAIT=3s",
	"OUTBOX_CLAIM_HOLD=5s",
	"EVENTS_DUPLICATE_WINDOW=2m",
	"EVENTS_REPLICAS=3",
	"LOG_LEVEL=info",
	// No balancer to wait for: a teardown's SIGTERM closes the listener
	// at once instead of serving for the grace.
	"SHUTDOWN_GRACE=0",
}

// deployment is one scenario's running system.
type deployment struct {
	work   string
	bins   binaries
	log    *slog.Logger
	faults *faults
	pg     *pgCluster
	nats   *natsCluster

	// The faultable links: the database (API→PgBouncer, one per node),
	// the processor and NATS (one per node). The links inside the
	// PostgreSQL cluster are its own (pgCluster.Isolate).
	dbLinks   [pgMembers]*link
	procLink  *link
	natsLinks []*link

	processor    *harness.Process
	processorURL string // the simulator, direct (its admin endpoints)

	apiEnv  []string
	mu      sync.Mutex
	apis    []*harness.Process
	apiURLs []string
	apiKey  string
	// adminAddrs are the API processes' admin listeners (/metrics), which
	// the monitor scrapes; a restarted process gets its own back.
	adminAddrs []string

	check *pgxpool.Pool // straight to the current primary, for the checker
}

// deploy starts a fresh deployment in a new directory under work.
func deploy(ctx context.Context, work string, bins binaries, o deployOptions) (d *deployment, err error) {
	dir, err := os.MkdirTemp(work, "deploy-")
	if err != nil {
		return nil, err
	}
	// The server account that runs PostgreSQL must reach its data.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	d = &deployment{work: dir, bins: bins, log: o.Log}
	defer func() {
		if err != nil {
			d.stop()
		}
	}()
	if d.faults, err = startFaults(); err != nil {
		return d, err
	}
	natsURLs, err := d.startBackends(ctx, dir, o)
	if err != nil {
		return d, err
	}
	pooled, direct := d.databaseURLs()
	d.apiEnv = append([]string{
		"DATABASE_URL=" + pooled,
		"DATABASE_DIRECT_URL=" + direct,
		"NATS_URL=" + strings.Join(natsURLs, ","),
		"PROCESSOR_URL=http://" + d.procLink.Addr(),
	}, apiSettings...)

	if err := d.apiCommand(ctx, "migrate", "up"); err != nil {
		return d, err
	}
	if d.apiKey, err = harness.CreateTenant(d.bins.api, pooled, "chaos"); err != nil {
		return d, err
	}
	if d.check, err = pgxpool.New(ctx, direct); err != nil {
		return d, err
	}
	for i := range o.APIs {
		a, err := freeAddr()
		if err != nil {
			return d, err
		}
		admin, err := freeAddr()
		if err != nil {
			return d, err
		}
		d.apiURLs = append(d.apiURLs, "http://"+a)
		d.adminAddrs = append(d.adminAddrs, admin)
		d.apis = append(d.apis, nil)
		if err := d.startAPI(ctx, i); err != nil {
			return d, err
		}
	}
	return d, waitEventsFlowing(ctx, d.apiURLs)
}

// startBackends starts what the API depends on, each behind a faultable
// link: the PostgreSQL cluster and its PgBouncers, the NATS cluster, and
// the processor simulator. It returns the NATS URLs through the links.
func (d *deployment) startBackends(ctx context.Context, dir string, o deployOptions) (natsURLs []string, err error) {
	d.pg, err = startPGCluster(ctx, pgClusterOptions{Work: dir, Sync: !o.Async, Faults: d.faults, Log: o.Log})
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	bouncers := d.pg.BouncerAddrs()
	for i, addr := range bouncers {
		if d.dbLinks[i], err = d.faults.Link("db"+strconv.Itoa(i), addr); err != nil {
			return nil, err
		}
	}
	if d.nats, err = startNATSCluster(filepath.Join(dir, "nats"), d.faults); err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	for i, addr := range d.nats.ClientAddrs() {
		l, err := d.faults.Link("nats"+strconv.Itoa(i), addr)
		if err != nil {
			return nil, err
		}
		d.natsLinks = append(d.natsLinks, l)
		natsURLs = append(natsURLs, "nats://"+l.Addr())
	}

	var addr string
	d.processor, addr, err = harness.StartProcess(ctx, dir, "processor", d.bins.processor, nil,
		[]string{"PROCESSOR_ADDR=127.0.0.1:0"}, "processor simulator listening")
	if err != nil {
		return nil, err
	}
	d.processorURL = "http://" + addr
	if d.procLink, err = d.faults.Link("processor", addr); err != nil {
		return nil, err
	}
	return natsURLs, nil
}

// databaseURLs are the URLs the API reaches PostgreSQL by, the way a
// deployment does (D1, D3): the pooled URL lists both nodes' PgBouncers
// and asks for the one that accepts writes, in exec mode (PgBouncer 1.18
// in transaction mode keeps no prepared statement across transactions);
// the direct URL lists both nodes for LISTEN and the migrations. The pool
// is sized above what the load asks of one process (16 clients over two
// or three processes), as a deployment sizes it: a pool the load holds
// full is what DatabasePoolSaturated pages for, a false page in every
// scenario.
func (d *deployment) databaseURLs() (pooled, direct string) {
	user := d.pg.User()
	nodes := d.pg.NodeAddrs()
	pooled = fmt.Sprintf("postgres://%s@%s,%s/payments?sslmode=disable&target_session_attrs=read-write&default_query_exec_mode=exec&connect_timeout=3&pool_max_conns=16",
		user, d.dbLinks[0].Addr(), d.dbLinks[1].Addr())
	direct = fmt.Sprintf("postgres://%s@%s,%s/payments?sslmode=disable&target_session_attrs=read-write&connect_timeout=3",
		user, nodes[0], nodes[1])
	return pooled, direct
}

// apiCommand runs one api command to completion with the deployment's
// settings.
func (d *deployment) apiCommand(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, d.bins.api, args...)
	cmd.Env = append(os.Environ(), d.apiEnv...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("api %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// startAPI starts API process i on its address.
func (d *deployment) startAPI(ctx context.Context, i int) error {
	name := "api" + strconv.Itoa(i)
	env := append([]string{"ADDR=" + strings.TrimPrefix(d.apiURLs[i], "http://"), "ADMIN_ADDR=" + d.adminAddrs[i]}, d.apiEnv...)
	p, _, err := harness.StartProcess(ctx, d.work, name, d.bins.api, []string{"serve"}, env, "listening")
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.apis[i] = p
	d.mu.Unlock()
	return nil
}

// killAPI kills API process i (SIGKILL), as a crash would, and starts it
// again on the same address after pause.
func (d *deployment) killAPI(ctx context.Context, i int, pause time.Duration) error {
	d.mu.Lock()
	p := d.apis[i]
	d.mu.Unlock()
	p.Kill()
	select {
	case <-ctx.Done():
	case <-time.After(pause):
	}
	return d.startAPI(context.WithoutCancel(ctx), i)
}

// stop ends everything the deployment started; the directory stays
// until the run's work directory is removed.
func (d *deployment) stop() {
	d.mu.Lock()
	apis := d.apis
	d.mu.Unlock()
	for _, p := range apis {
		if p != nil {
			p.Stop()
		}
	}
	if d.processor != nil {
		d.processor.Stop()
	}
	if d.check != nil {
		d.check.Close()
	}
	if d.nats != nil {
		d.nats.Stop()
	}
	if d.pg != nil {
		d.pg.Stop()
	}
	if d.faults != nil {
		d.faults.Stop()
	}
}
