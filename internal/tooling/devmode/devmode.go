// Package devmode is api dev (make run) up to serving and once listening:
// it starts what DATABASE_URL, NATS_URL and PROCESSOR_URL do not name (a
// private PostgreSQL in .dev/postgres, an embedded NATS server, the
// processor simulator) on the ports kept in .dev/ports, migrates, keeps a
// demo tenant's key and prints the banner of curl commands. cmd/api's
// dev.go, built only without -tags nodev, is its one importer, so a
// deployment's binary links none of it (docs/deployment.md).
package devmode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemref/payments/internal/config"
	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/dbmigrate"
	"github.com/idemref/payments/internal/events"
	"github.com/idemref/payments/internal/messaging"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/natstmp"
	"github.com/idemref/payments/internal/tooling/pgtmp"
	"github.com/idemref/payments/internal/tooling/processorsim"
	"github.com/idemref/payments/internal/tracing"
	"github.com/idemref/payments/internal/webhook"
)

// devDataDir holds the private development cluster (git-ignored).
const devDataDir = ".dev/postgres"

// devNatsDir holds the embedded NATS server's JetStream storage (git-ignored).
const devNatsDir = ".dev/nats"

// devKeyFile keeps the demo tenant's API key between runs (git-ignored):
// keys are stored hashed, so a key not kept here could never be shown again.
const devKeyFile = ".dev/demo-api-key"

// PortsFile keeps the ports of the private PostgreSQL, the embedded NATS
// and the simulator between runs (git-ignored), so that the psql and nats
// lines a banner printed stay right, and make psql finds the database.
const PortsFile = ".dev/ports"

// devWebhookSecret signs the simulator's webhooks in development mode.
const devWebhookSecret = "whsec_dev"

// devStandardWebhookSecret is the development secret under
// WEBHOOK_SCHEME=standard, in the whsec_<base64> form that scheme needs.
const devStandardWebhookSecret = "whsec_ZGV2ZWxvcG1lbnQtb25seS13ZWJob29rLXNlY3JldA=="

// Env is what development mode started for one run of api dev: the private
// PostgreSQL, the embedded NATS server and the simulator unless their
// variables named others, the demo tenant's key and the ports kept in
// PortsFile. Stop stops them.
type Env struct {
	cfg      config.Config
	logger   *slog.Logger
	ports    Ports
	sim      *processorsim.Server
	psql     string // the private cluster's URL for the banner; "" when DATABASE_URL named one
	key      string
	created  bool
	exported bool
	stops    []func() // in the order started; Stop runs them backwards
}

// Start is `make run` up to serving: it needs nothing set up. Without
// DATABASE_URL it starts a private PostgreSQL from the machine's server
// binaries (initdb the first time only), without NATS_URL an embedded NATS
// server, without PROCESSOR_URL the simulator, and points cfg at them.
// Then it migrates and creates a demo tenant. The caller serves with cfg,
// calls Ready once listening and Stop on exit.
func Start(ctx context.Context, cfg *config.Config, logger *slog.Logger) (_ *Env, err error) {
	// A busy port is found before PostgreSQL, NATS and the simulator are
	// started for nothing: serve listens on the same address later.
	if err := addrFree(cfg.Addr); err != nil {
		return nil, err
	}
	e := &Env{logger: logger, ports: ReadPorts()}
	defer func() {
		if err != nil {
			e.Stop()
		}
	}()
	if cfg.DatabaseURL == "" {
		stop, err := startDevPostgres(ctx, cfg, &e.ports, logger)
		if err != nil {
			return nil, err
		}
		e.stops = append(e.stops, stop)
		// Only the private cluster's URL: one given in DATABASE_URL may
		// carry a password.
		e.psql = cfg.DatabaseURL
	}
	if cfg.NatsURL == "" {
		stop, err := startDevNATS(cfg, &e.ports, logger)
		if err != nil {
			return nil, err
		}
		e.stops = append(e.stops, stop)
	}
	if nc := logEvents(ctx, cfg.NatsURL, logger); nc != nil {
		e.stops = append(e.stops, nc.Close)
	}
	sim, stopSim, err := startDevSimulator(ctx, cfg, &e.ports, logger)
	if err != nil {
		return nil, err
	}
	e.sim = sim
	e.stops = append(e.stops, stopSim)
	if err := e.ports.write(); err != nil {
		return nil, err
	}
	if e.key, e.created, err = migrateForDemo(ctx, cfg.DatabaseURL); err != nil {
		return nil, err
	}
	if cfg.AdminAddr == "" {
		// Metrics and the profiler for the developer, on this machine only.
		cfg.AdminAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(portIfFree(e.ports.Admin)))
	}
	exported, restoreTracing := devTracing(ctx)
	e.exported = exported
	e.stops = append(e.stops, restoreTracing)
	e.cfg = *cfg
	return e, nil
}

// Ready is called once the API listens on addr and its admin listener on
// admin: it keeps the admin port, sends the simulator's webhooks to the
// API and prints the banner to stdout.
func (env *Env) Ready(addr, admin string, stdout io.Writer) {
	env.ports.Admin = urlPort("http://" + admin)
	if err := env.ports.write(); err != nil {
		env.logger.Warn("keep the admin port in "+PortsFile, slog.Any("error", err))
	}
	cfg := env.cfg
	if env.sim != nil {
		// The simulator's webhooks go to this API, signed with its secret.
		env.sim.Simulator.SetWebhooks(processorsim.WebhookConfig{URL: "http://" + loopback(addr) + "/v1/webhooks/processor", Secrets: cfg.WebhookSecrets, Scheme: cfg.WebhookScheme})
	}
	// A NATS_URL given by the developer may carry credentials (R8).
	fmt.Fprint(stdout, devBanner(addr, admin, env.key, env.created, env.psql, processorBanner(cfg), messaging.RedactURL(cfg.NatsURL), env.exported))
}

// Stop stops what Start started, the last started first.
func (env *Env) Stop() {
	for _, stop := range slices.Backward(env.stops) {
		stop()
	}
}

// startDevPostgres starts the private PostgreSQL in devDataDir, on the
// port of the last run when it is free, and points cfg at its payments
// database; stop stops it.
func startDevPostgres(ctx context.Context, cfg *config.Config, ports *Ports, logger *slog.Logger) (stop func(), err error) {
	if _, err := pgtmp.FindBinDir(); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(devDataDir)
	if err != nil {
		return nil, err
	}
	cluster, err := pgtmp.Start(ctx, pgtmp.Options{Dir: dir, Port: portIfFree(ports.Postgres), Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("start the development PostgreSQL in %s: %w", devDataDir, err)
	}
	stop = func() {
		if err := cluster.Stop(); err != nil {
			logger.Error("stop the development PostgreSQL", slog.Any("error", err))
		}
	}
	if err := ensureDatabase(ctx, cluster.URL("postgres"), "payments"); err != nil {
		stop()
		return nil, err
	}
	cfg.DatabaseURL = cluster.URL("payments")
	ports.Postgres = cluster.Port()
	logger.Info("development PostgreSQL running", slog.String("data_dir", devDataDir), slog.Int("port", cluster.Port()))
	return stop, nil
}

// startDevNATS starts NATS with JetStream, in this process, storing in
// devNatsDir, and points cfg at it; stop shuts it down.
func startDevNATS(cfg *config.Config, ports *Ports, logger *slog.Logger) (stop func(), err error) {
	dir, err := filepath.Abs(devNatsDir)
	if err != nil {
		return nil, err
	}
	ns, err := natstmp.StartOn(dir, portIfFree(ports.NATS))
	if err != nil {
		return nil, err
	}
	cfg.NatsURL = ns.URL()
	ports.NATS = ns.Port()
	logger.Info("embedded NATS running", slog.String("url", cfg.NatsURL), slog.String("store_dir", devNatsDir))
	return ns.Shutdown, nil
}

// logEvents: development mode also logs every event published, so a
// payment can be watched flowing to its order; the line carries the
// trace_id of the request that wrote the event (the message's
// traceparent). The caller closes the connection; nil when there is none.
func logEvents(ctx context.Context, natsURL string, logger *slog.Logger) *nats.Conn {
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return nil
	}
	_, _ = nc.Subscribe(events.SubjectPrefix+">", func(m *nats.Msg) {
		logger.InfoContext(tracing.ExtractNATS(ctx, m.Header), "event on the stream", slog.String("subject", m.Subject), slog.String("nats_msg_id", m.Header.Get("Nats-Msg-Id")), slog.String("data", string(m.Data)))
	})
	return nc
}

// startDevSimulator starts the processor simulator, in this process but
// over real HTTP, and points cfg at it, with a development webhook secret
// unless WEBHOOK_SECRETS names one; stop shuts it down. None (nil) when
// PROCESSOR_URL is set or PROCESSOR is not the simulator.
func startDevSimulator(ctx context.Context, cfg *config.Config, ports *Ports, logger *slog.Logger) (sim *processorsim.Server, stop func(), err error) {
	if cfg.ProcessorURL != "" || cfg.Processor != config.ProcessorSimulator {
		return nil, func() {}, nil
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(portIfFree(ports.Simulator)))
	sim, err = processorsim.Start(addr, processorsim.Config{Logger: logger})
	if err != nil {
		return nil, nil, fmt.Errorf("start the processor simulator: %w", err)
	}
	cfg.ProcessorURL = sim.URL()
	ports.Simulator = urlPort(cfg.ProcessorURL)
	logger.Info("processor simulator running", slog.String("url", cfg.ProcessorURL))
	if len(cfg.WebhookSecrets) == 0 {
		cfg.WebhookSecrets = []string{devWebhookSecret}
		if cfg.WebhookScheme == webhook.SchemeStandard {
			cfg.WebhookSecrets = []string{devStandardWebhookSecret}
		}
	}
	return sim, func() { _ = sim.Shutdown(context.WithoutCancel(ctx)) }, nil
}

// migrateForDemo applies the migrations and returns the demo tenant's key
// (demoKey).
func migrateForDemo(ctx context.Context, databaseURL string) (key string, created bool, err error) {
	if err := dbmigrate.Up(ctx, databaseURL); err != nil {
		return "", false, err
	}
	pool, err := db.Open(ctx, databaseURL)
	if err != nil {
		return "", false, err
	}
	defer pool.Close()
	return demoKey(ctx, pool)
}

// devTracing: every request is traced in development mode, collector or
// not. run installed a provider when OpenTelemetry's variables name one
// (tracing.Setup: exported); otherwise a provider without an exporter
// samples every span and sends it nowhere, which costs little and gives
// each request's log lines a trace_id (and the outbox row and the event
// its traceparent), so a payment can be followed through the log. restore
// puts the previous provider back.
func devTracing(ctx context.Context) (exported bool, restore func()) {
	if _, exported := otel.GetTracerProvider().(*sdktrace.TracerProvider); exported {
		return true, func() {}
	}
	prev, tp := otel.GetTracerProvider(), sdktrace.NewTracerProvider()
	otel.SetTracerProvider(tp)
	return false, func() {
		otel.SetTracerProvider(prev)
		_ = tp.Shutdown(context.WithoutCancel(ctx))
	}
}

// demoKey returns the demo tenant's API key: the one kept in devKeyFile
// while it still authenticates, or a new tenant's (created reports which).
func demoKey(ctx context.Context, pool *pgxpool.Pool) (key string, created bool, err error) {
	if b, err := os.ReadFile(devKeyFile); err == nil {
		key = strings.TrimSpace(string(b))
		if _, err := tenants.Authenticate(ctx, pool, key); err == nil {
			return key, false, nil
		}
	}
	// No kept key, or one for a database that was reset: a new tenant. Its
	// name is unique, so the first free "demo", "demo 2", ...
	name := "demo"
	for i := 2; ; i++ {
		_, key, err = tenants.Create(ctx, pool, name)
		if !errors.Is(err, tenants.ErrNameTaken) {
			break
		}
		name = fmt.Sprintf("demo %d", i)
	}
	if err != nil {
		return "", false, err
	}
	if err := os.MkdirAll(filepath.Dir(devKeyFile), 0o700); err != nil {
		return "", false, err
	}
	if err := os.WriteFile(devKeyFile, []byte(key+"\n"), 0o600); err != nil {
		return "", false, err
	}
	return key, true, nil
}

// tracesLine says where a request's trace is seen (docs/operations.md,
// "Traces").
func tracesLine(exported bool) string {
	if exported {
		return "Traces: every request is traced and exported over OTLP as the OTEL_EXPORTER_OTLP_* variables say; each request's log line carries its trace_id."
	}
	return "Traces: each request's log line carries its trace_id; with a trace viewer: OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 make run"
}

func tenantLine(created bool) string {
	if created {
		return "A demo tenant was created (its key is kept in " + devKeyFile + "; make reset starts over). Paste these lines first:"
	}
	return "The demo tenant of earlier runs (its key is kept in " + devKeyFile + "; make reset starts over). Paste these lines first:"
}

func psqlLine(url string) string {
	if url == "" {
		return "Look at the rows: psql \"$DATABASE_URL\""
	}
	return "Look at the rows: psql '" + url + "'   (e.g. SELECT idem_key, state, response_status FROM idempotency_keys;)"
}

// ensureDatabase creates database name unless it exists.
func ensureDatabase(ctx context.Context, adminURL, name string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database
		return nil
	}
	return err
}

// loopback turns a listening address into one to dial.
func loopback(addr string) string {
	host, port, _ := net.SplitHostPort(addr)
	if host == "" || host == "::" || host == "0.0.0.0" {
		host = "localhost"
	}
	return net.JoinHostPort(host, port)
}

// bannerProcessor is what the banner says of the processor: a line on
// where it is, an export line for the shell ("": none), and where its
// webhooks come from.
type bannerProcessor struct{ about, export, webhooks string }

// processorBanner is the simulator's lines, with its calls and faults
// under $SIM/_sim, or Stripe's, which has no such thing and whose webhooks
// reach this API through the Stripe CLI. URLs are shown without their
// credentials (R8).
func processorBanner(cfg config.Config) bannerProcessor {
	if cfg.Processor == config.ProcessorStripe {
		return bannerProcessor{
			about:    "Processor: Stripe at " + messaging.RedactURL(cfg.StripeURL) + " with STRIPE_API_KEY, " + stripeMode(cfg),
			webhooks: "Stripe's webhooks reach $API/v1/webhooks/processor through stripe listen --forward-to $API/v1/webhooks/processor, with WEBHOOK_SECRETS set to the whsec_ secret it prints",
		}
	}
	sim := messaging.RedactURL(cfg.ProcessorURL)
	return bannerProcessor{
		about:    "Processor simulator on " + sim + " (see its calls: curl " + sim + "/_sim/calls)",
		export:   "  export SIM=" + sim + "   # the processor (its faults and calls under /_sim)",
		webhooks: "The processor's signed webhooks arrive at $API/v1/webhooks/processor",
	}
}

// stripeMode says what the Stripe processor will charge: Stripe's test or
// live mode by the key's prefix, or, at another URL, a mock, whose fixed
// answers (stripe-mock's PaymentIntent stays requires_payment_method)
// decline every payment: a 402 there is the mock, not the adapter.
func stripeMode(cfg config.Config) string {
	if strings.TrimSuffix(cfg.StripeURL, "/") != "https://api.stripe.com" {
		return "not Stripe's servers: a mock such as stripe-mock, whose fixed answers decline every payment, pm_card_visa too (402; docs/payments.md)"
	}
	switch {
	case strings.HasPrefix(cfg.StripeAPIKey, "sk_test_"), strings.HasPrefix(cfg.StripeAPIKey, "rk_test_"):
		return "test mode (its payments show in the Stripe Dashboard's test data)"
	case strings.HasPrefix(cfg.StripeAPIKey, "sk_live_"), strings.HasPrefix(cfg.StripeAPIKey, "rk_live_"):
		return "LIVE mode: real cards are charged"
	}
	return "a key that is neither sk_test_ nor sk_live_"
}

// curlAuth is the headers of the banner's curl commands.
const curlAuth = `-H "Authorization: Bearer $API_KEY" -H 'Content-Type: application/json'`

// curlPost is a curl command of the banner: body POSTed to path under key.
func curlPost(path, key, body string) string {
	return fmt.Sprintf("curl -i -X POST $API%s %s -H 'Idempotency-Key: %s' -d %s", path, curlAuth, key, body)
}

// idOf is curlPost that captures the "id" of the created resource (the first
// member of every body this API returns) in the shell variable name.
func idOf(name, path, key, body string) string {
	return fmt.Sprintf(`%s=$(curl -s -X POST $API%s %s -H 'Idempotency-Key: %s' -d %s | sed -E 's/^\{"id":"([^"]+)".*/\1/'); echo $%s`, name, path, curlAuth, key, body, name)
}

// payBody is the body of a payment of the order in the shell variable order.
func payBody(order, method string) string {
	return `"{\"order_id\":\"$` + order + `\",\"amount\":2500,\"currency\":\"EUR\",\"payment_method\":\"` + method + `\"}"`
}

func devBanner(addr, admin, key string, created bool, psql string, processor bannerProcessor, natsURL string, tracesExported bool) string {
	base := "http://" + loopback(addr)
	adminBase := "http://" + loopback(admin)
	order := `'{"reference":"order-1001","customer_id":"cus_42","amount":2500,"currency":"EUR"}'`
	lines := []string{
		"",
		"Payments API (development mode) on " + base,
		"API reference in your browser: " + base + "/docs (the contract itself: " + base + "/openapi.yaml)",
		processor.about,
		tenantLine(created),
		"",
		"  export API=" + base,
		"  export API_KEY=" + key,
	}
	if processor.export != "" {
		lines = append(lines, processor.export)
	}
	rest := []string{
		"",
		psqlLine(psql),
		"Create an order (201 Created):",
		"  " + curlPost("/v1/orders", "demo-create-1", order),
		"Send the same request again: the stored 201 is replayed byte for byte, with Idempotent-Replayed: true:",
		"  " + curlPost("/v1/orders", "demo-create-1", order),
		"Reuse the key for a different body (422 idempotency_key_reused):",
		"  " + curlPost("/v1/orders", "demo-create-1", `'{"reference":"order-1001","customer_id":"cus_42","amount":9999,"currency":"EUR"}'`),
		"Same order under a new key: the reference backstop answers 409 order_reference_exists with the order's id:",
		"  " + curlPost("/v1/orders", "demo-create-2", order),
		"",
		"Pay an order (201; the processor is charged once, with a key derived from yours):",
		"  " + idOf("ORDER_ID", "/v1/orders", "demo-order-2", `'{"reference":"order-1002","customer_id":"cus_42","amount":2500,"currency":"EUR"}'`),
		"  " + curlPost("/v1/payments", "demo-pay-1", payBody("ORDER_ID", "pm_card_visa")),
		"A declined card (402 card_declined, recorded: the same key replays the decline):",
		"  " + idOf("ORDER2_ID", "/v1/orders", "demo-order-3", `'{"reference":"order-1003","customer_id":"cus_42","amount":2500,"currency":"EUR"}'`),
		"  " + curlPost("/v1/payments", "demo-pay-2", payBody("ORDER2_ID", "pm_card_chargeDeclined")),
		"Refund part of the first payment (201; replaying demo-pay-1 gives its id):",
		"  " + idOf("PAYMENT_ID", "/v1/payments", "demo-pay-1", payBody("ORDER_ID", "pm_card_visa")),
		"  " + curlPost("/v1/payments/$PAYMENT_ID/refunds", "demo-refund-1", `'{"amount":1000}'`),
		"",
		"List the orders:",
		`  curl -s $API/v1/orders -H "Authorization: Bearer $API_KEY"`,
		"",
		"Watch the events: each payment's final transaction writes payment.succeeded (or payment.failed) to the",
		"outbox; the relay publishes it to NATS JetStream (" + natsURL + ", stream PAYMENTS_EVENTS) and the",
		"orders consumer applies it to the order, so ORDER_ID shows status paid and amount_paid a moment after the 201.",
		"This process logs every event (\"event on the stream\"); with the nats CLI:",
		"  nats --server " + natsURL + " sub 'payments.events.>'",
		processor.webhooks + "; the order as the consumer left it:",
		`  curl -s $API/v1/orders/$ORDER_ID -H "Authorization: Bearer $API_KEY"`,
		"Relay and consumer metrics, on the admin listener (ADMIN_ADDR; the profiler is there too, at /debug/pprof/):",
		"  curl -s " + adminBase + "/metrics | grep -E '^(outbox|consumer)_'",
		"",
		tracesLine(tracesExported),
		"",
		"Press Ctrl-C to stop.",
		"",
	}
	return strings.Join(append(lines, rest...), "\n")
}

// addrFree reports, naming ADDR, when the address the API would listen on
// is taken.
func addrFree(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("ADDR %s cannot be listened on (%w): stop what uses it, or set ADDR to another address, such as ADDR=:8081", addr, err)
	}
	return ln.Close()
}

// Ports are the ports of what dev started; 0 is one it did not start
// (DATABASE_URL, NATS_URL or PROCESSOR_URL was set) or has not recorded.
type Ports struct{ Postgres, NATS, Simulator, Admin int }

// ReadPorts returns the ports kept in PortsFile: name=port lines, so
// that make psql can read them with sed. A missing or garbled file is no
// error: new ports are picked.
func ReadPorts() Ports {
	var p Ports
	b, err := os.ReadFile(PortsFile)
	if err != nil {
		return p
	}
	fields := map[string]*int{"postgres": &p.Postgres, "nats": &p.NATS, "simulator": &p.Simulator, "admin": &p.Admin}
	for line := range strings.Lines(string(b)) {
		name, value, _ := strings.Cut(strings.TrimSpace(line), "=")
		if field, ok := fields[name]; ok {
			*field, _ = strconv.Atoi(value)
		}
	}
	return p
}

// write keeps p in PortsFile, leaving out the ports dev did not start.
func (p Ports) write() error {
	var b strings.Builder
	for _, f := range []struct {
		name string
		port int
	}{{"postgres", p.Postgres}, {"nats", p.NATS}, {"simulator", p.Simulator}, {"admin", p.Admin}} {
		if f.port != 0 {
			fmt.Fprintf(&b, "%s=%d\n", f.name, f.port)
		}
	}
	if err := os.MkdirAll(filepath.Dir(PortsFile), 0o700); err != nil {
		return err
	}
	return os.WriteFile(PortsFile, []byte(b.String()), 0o600)
}

// portIfFree returns port when nothing listens on it at 127.0.0.1, and 0
// (pick a free one) when it is taken or was never recorded. Another
// program could take it between this check and the bind; dev then fails
// with the port in its error, and the next run picks another.
func portIfFree(port int) int {
	if port <= 0 || port > 65535 {
		return 0
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return 0
	}
	_ = ln.Close()
	return port
}

// urlPort is the port of a URL such as the simulator's http://127.0.0.1:port.
func urlPort(rawURL string) int {
	u, err := url.Parse(rawURL)
	if err != nil {
		return 0
	}
	port, _ := strconv.Atoi(u.Port())
	return port
}
