package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/jackc/pgx/v5"
	"io"
	"log/slog"
	"net"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	apispec "github.com/idemref/payments"
	"github.com/idemref/payments/internal/connlimit"
	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/dbmigrate"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/messaging"
	"github.com/idemref/payments/internal/orders"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/reaper"
	"github.com/idemref/payments/internal/tenants"
)

// maxHeaderBytes bounds a request's header block (R3): the request line,
// the header lines and the empty line that ends them. Past it the handler
// answers a 431 problem (httpapi.MaxHeaderBytes). net/http itself stops
// reading only at httpapi.ServerHeaderBytes, and answers 431 in plain text
// (docs/contract.md): it reads up to its MaxHeaderBytes plus 4096 bytes
// (bufio slack) before it gives up, so the server is given that much less.
const (
	maxHeaderBytes     = httpapi.MaxHeaderBytes
	netHTTPHeaderSlack = 4096
)

// serve runs the HTTP server until ctx is cancelled, then shuts down
// gracefully: stop accepting, let in-flight requests finish (bounded by
// SHUTDOWN_TIMEOUT), close the pool. ready, when set, is called with the
// bound address once the listener is open.
func serve(ctx context.Context, cfg config, logger *slog.Logger, ready func(addr string)) error {
	pool, err := db.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Pool statistics and the key gauges, served at /metrics (X1).
	if err := db.RegisterPoolMetrics(pool); err != nil {
		return fmt.Errorf("register pool metrics: %w", err)
	}
	if err := idem.RegisterKeyStats(pool, logger); err != nil {
		return fmt.Errorf("register idempotency key metrics: %w", err)
	}

	store, paymentsSvc := services(pool, cfg, logger)
	// Whether events flow, for /readyz, when this process runs the relay
	// and the consumers.
	var events func() (bool, string)
	var eventsState *messaging.State
	if cfg.EventWorkers {
		eventsState = messaging.NewState()
		events = eventsState.Status
	}
	handler := httpapi.NewHandler(httpapi.Config{
		Pool:             pool,
		Idem:             store,
		Payments:         paymentsSvc,
		Logger:           logger,
		RequestTimeout:   cfg.RequestTimeout,
		RateLimit:        cfg.RateLimit,
		AuthCacheTTL:     cfg.AuthCacheTTL,
		Clients:          cfg.Clients,
		OpenAPI:          apispec.OpenAPI,
		WebhookSecrets:   cfg.WebhookSecrets,
		WebhookTolerance: cfg.WebhookTolerance,
		WebhookScheme:    cfg.WebhookScheme,
		Events:           events,
	})
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    httpapi.ServerHeaderBytes - netHTTPHeaderSlack,
		// Never before the handler's bound on header lines, so that its
		// refusal is a problem (httpapi.MaxHeaderLines).
		MaxHeaderValueCount: httpapi.ServerHeaderLines,
		// OPTIONS * goes to the handler, which answers every request with
		// its X-Content-Type-Options, and this one with a problem.
		DisableGeneralOptionsHandler: true,
		ErrorLog:                     slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}

	// Listen synchronously: a port already in use is an error, not a log line.
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("ADDR %s cannot be listened on (%w): stop what uses it, or set ADDR to another address, such as ADDR=:8081", cfg.Addr, err)
	}
	// At the limit silent and idle connections give way, and no client
	// address but a trusted proxy holds more than its share (R4): see
	// connlimit.Listener.
	conns := connlimit.New(ln, cfg.MaxConnections, connlimit.Options{Proxies: cfg.Clients})
	srv.ConnState = conns.Track
	ln = conns
	logger.Info("listening", slog.String("addr", ln.Addr().String()), slog.Int("max_connections", cfg.MaxConnections),
		slog.String("database", databaseTarget(cfg.DatabaseURL)), slog.String("processor", cfg.ProcessorURL),
		slog.String("nats", messaging.RedactURL(cfg.NatsURL)))
	if ready != nil {
		ready(ln.Addr().String())
	}

	// The relay and the consumers run beside the server and stop with it,
	// unless EVENT_WORKERS leaves them to other processes. They connect to
	// the broker in the background: the server does not wait for it.
	if cfg.EventWorkers {
		listenPool, closeListenPool, err := directPool(ctx, pool, cfg)
		if err != nil {
			return err
		}
		defer closeListenPool()
		defer messaging.Start(ctx, messaging.Config{
			Pool: pool, ListenPool: listenPool, NatsURL: cfg.NatsURL, Broker: cfg.Broker, OutboxClaimHold: cfg.OutboxClaimHold,
			Consumer: messaging.Consumer{Name: orders.ConsumerName, Subjects: orders.Subjects, Apply: orders.ApplyEvent},
			Logger:   logger, State: eventsState,
		})()
	}

	// The completer runs beside the server and stops with it.
	if cfg.CompleterInterval > 0 {
		defer beside(ctx, payments.NewCompleter(paymentsSvc, cfg.CompleterInterval).Run)()
	}
	// So does the reaper (E1, E3), when enabled.
	if cfg.ReaperInterval > 0 {
		defer beside(ctx, newReaper(pool, cfg, logger).Run)()
	}

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	logger.Info("shutting down", slog.Duration("timeout", cfg.ShutdownTimeout))
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	logger.Info("stopped")
	return nil
}

// beside runs run in a goroutine until ctx is done or stop is called;
// stop returns once run has.
func beside(ctx context.Context, run func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// directPool is the pool for the relay's LISTEN connection: pool itself
// when DATABASE_DIRECT_URL is DATABASE_URL, else a pool of its own on the
// direct URL, as small as the one connection needs (D3), which release
// closes.
func directPool(ctx context.Context, pool *pgxpool.Pool, cfg config) (direct *pgxpool.Pool, release func(), err error) {
	if cfg.directURL() == cfg.DatabaseURL {
		return pool, func() {}, nil
	}
	direct, err = db.Open(ctx, cfg.directURL(), db.MaxConns(2))
	if err != nil {
		return nil, nil, fmt.Errorf("DATABASE_DIRECT_URL: %w", err)
	}
	return direct, direct.Close, nil
}

// services builds the idempotency store and the payments service from cfg.
func services(pool *pgxpool.Pool, cfg config, logger *slog.Logger) (*idem.Store, *payments.Service) {
	store := idem.NewStore(pool, idem.Config{
		LockTimeout: cfg.LockTimeout, TTL: cfg.IdempotencyTTL, KeyRetention: cfg.KeyRetention, Lease: cfg.PaymentLease,
		KeyBudget: cfg.KeyBudget,
	})
	proc := processor.NewClient(cfg.ProcessorURL, cfg.ProcessorTimeout)
	return store, payments.NewService(pool, store, proc, httpapi.Renderer{}, logger, payments.Config{SettleWindow: cfg.SettleWindow})
}

// runCompleter runs the completer alone, without the HTTP server, until ctx
// is cancelled.
func runCompleter(ctx context.Context, cfg config, logger *slog.Logger) error {
	if cfg.CompleterInterval <= 0 {
		return errors.New("COMPLETER_INTERVAL must be positive for the completer command")
	}
	pool, err := db.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	_, svc := services(pool, cfg, logger)
	logger.Info("completer running", slog.Duration("interval", cfg.CompleterInterval))
	payments.NewCompleter(svc, cfg.CompleterInterval).Run(ctx)
	return nil
}

// newReaper builds the reaper from cfg.
func newReaper(pool *pgxpool.Pool, cfg config, logger *slog.Logger) *reaper.Reaper {
	return reaper.New(pool, reaper.Config{Interval: cfg.ReaperInterval, Batch: cfg.ReaperBatch, Duty: cfg.ReaperDuty, MessageRetention: cfg.MessageRetention, Logger: logger})
}

// runReaper makes one reaper pass and prints its counts, or with loop runs
// the reaper every REAPER_INTERVAL until ctx is cancelled.
func runReaper(ctx context.Context, cfg config, logger *slog.Logger, loop bool, stdout io.Writer) error {
	if loop && cfg.ReaperInterval <= 0 {
		return errors.New("REAPER_INTERVAL must be positive for reap --loop")
	}
	pool, err := db.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	r := newReaper(pool, cfg, logger)
	if loop {
		logger.Info("reaper running", slog.Duration("interval", cfg.ReaperInterval), slog.Int("batch", cfg.ReaperBatch))
		r.Run(ctx)
		return nil
	}
	res, err := r.RunOnce(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "pruned %d\ndeleted %d\nmessages deleted %d\noutbox deleted %d\n", res.Pruned, res.Deleted, res.Messages, res.Outbox)
	return nil
}

// migrate applies every migration ("up"), or rolls back steps of them
// (steps > 0) or all of them (steps < 0, "down --all"). databaseURL must
// reach PostgreSQL directly: the migrations hold a session advisory lock,
// which a pooler in transaction mode would lose between statements.
func migrate(ctx context.Context, databaseURL, direction string, steps int, logger *slog.Logger) error {
	var err error
	switch {
	case direction == "up":
		err = dbmigrate.Up(ctx, databaseURL)
	case steps < 0:
		err = dbmigrate.Down(ctx, databaseURL)
	default:
		err = dbmigrate.DownSteps(ctx, databaseURL, steps)
	}
	if err != nil {
		return err
	}
	version, _, err := dbmigrate.Version(ctx, databaseURL)
	if err != nil {
		return err
	}
	logger.Info("migrated", slog.String("direction", direction), slog.Uint64("version", uint64(version)))
	return nil
}

// createTenant prints the new tenant's API key alone on the last line, so
// scripts can take it with `tail -n 1`.
func createTenant(ctx context.Context, databaseURL, name string, stdout io.Writer) error {
	pool, err := db.Open(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	id, key, err := tenants.Create(ctx, pool, name)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "tenant %s created (%s); its API key, shown only once:\n%s\n", name, id, key)
	return nil
}

// databaseTarget is where DATABASE_URL points, for the startup log: host,
// port and database, never the user's password.
func databaseTarget(databaseURL string) string {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return "(unparsable DATABASE_URL)"
	}
	return fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database)
}
