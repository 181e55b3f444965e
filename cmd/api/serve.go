package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	apispec "github.com/idemref/payments"
	"github.com/idemref/payments/internal/config"
	"github.com/idemref/payments/internal/connlimit"
	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/dbmigrate"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/messaging"
	"github.com/idemref/payments/internal/opscli"
	"github.com/idemref/payments/internal/orders"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/processor/simproc"
	"github.com/idemref/payments/internal/processor/stripeproc"
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

// serve runs the HTTP server until ctx is cancelled (SIGTERM, SIGINT),
// then drains, in this order:
//
//  1. /readyz answers 503, so that the load balancer takes the process out
//     of its pool, and every answer from now on says Connection: close, so
//     that clients on keep-alive connections come back through the
//     balancer;
//  2. for SHUTDOWN_GRACE the listener still accepts and serves whatever
//     comes: the balancer may send until it has taken the process out;
//  3. the listener closes and the requests in flight finish, for at most
//     SHUTDOWN_TIMEOUT (http.Server.Shutdown); what still runs then is cut
//     as a crash would cut it, and its retry recovers it the same way;
//  4. the workers beside the server (the completer, the reaper, the outbox
//     relay, the consumer) stop at a safe point, for at most
//     SHUTDOWN_TIMEOUT again: the relay hands its claimed batch back, the
//     consumer finishes the message in hand or hands back one it held
//     through a database outage, the completer releases its key at its
//     recovery point, the reaper rolls back its batch;
//  5. the pool closes, unless something was cut in step 3 or 4: Close
//     would wait for the connections still held, and the process exits
//     instead, as a crash would.
//
// The workers run until step 4, not only until the signal: the requests
// of the grace write events that the relay publishes.
//
// The admin listener (ADMIN_ADDR: /metrics, pprof) serves through all of
// it, so that the drain can be watched, and closes last.
//
// ready, when set, is called with the bound addresses once the listeners
// are open (admin "" when ADMIN_ADDR is unset).
func serve(ctx context.Context, cfg config.Config, logger *slog.Logger, ready func(addr, admin string)) error {
	s := &apiServer{cfg: cfg, logger: logger, draining: make(chan struct{}), served: make(chan error, 1)}
	defer s.close()
	if err := s.start(ctx); err != nil {
		return err
	}
	if ready != nil {
		ready(s.ln.Addr().String(), s.adminAddr)
	}
	go func() { s.served <- s.http.Serve(s.ln) }()
	select {
	case err := <-s.served:
		return err
	case <-ctx.Done():
	}
	return s.drain(ctx)
}

// apiServer is what serve runs: the pool, the HTTP server on its listener,
// the workers beside it and the admin listener.
type apiServer struct {
	cfg    config.Config
	logger *slog.Logger
	pool   *pgxpool.Pool
	// cut: something was cut in the drain, so the pool is left open (step 5).
	cut  bool
	http *http.Server
	ln   net.Listener
	// draining is closed when the drain begins: /readyz answers 503 from
	// then on.
	draining chan struct{}
	// served receives what http.Server.Serve returned.
	served    chan error
	workers   workers
	admin     *adminServer
	adminAddr string // as bound, "" without an admin listener
}

// start opens the pool, checks the schema, builds the handler, listens,
// starts the workers and then the admin listener: what serve needs before
// it serves.
func (s *apiServer) start(ctx context.Context) error {
	// The contract's rules of keys are enforced as declared (F5), or not at all.
	if err := httpapi.CheckContract(apispec.OpenAPI); err != nil {
		return err
	}
	pool, err := db.Open(ctx, s.cfg.DatabaseURL)
	if err != nil {
		return err
	}
	s.pool = pool
	// A binary whose migrations are not all applied would fail at its
	// first query of a new column; it refuses to start instead, saying
	// what to run (G8). A newer schema is fine: see dbmigrate.Up.
	if err := checkSchema(ctx, pool, s.logger); err != nil {
		return err
	}
	// Pool statistics and the key gauges, served at /metrics (X1).
	if err := db.RegisterPoolMetrics(pool); err != nil {
		return fmt.Errorf("register pool metrics: %w", err)
	}
	if err := idem.RegisterKeyStats(pool, s.logger); err != nil {
		return fmt.Errorf("register idempotency key metrics: %w", err)
	}
	store, paymentsSvc := services(pool, s.cfg, s.logger)
	// Whether events flow, for /readyz, when this process runs the relay
	// and the consumers.
	var eventsState *messaging.State
	if s.cfg.EventWorkers {
		eventsState = messaging.NewState()
	}
	s.http = newHTTPServer(s.cfg, s.logger, s.handler(store, paymentsSvc, eventsState))
	if err := s.listen(); err != nil {
		return err
	}
	if err := s.startWorkers(ctx, paymentsSvc, eventsState); err != nil {
		return err
	}
	return s.listenAdmin()
}

// handler is the API's handler, with the services and events' state.
func (s *apiServer) handler(store *idem.Store, paymentsSvc *payments.Service, eventsState *messaging.State) http.Handler {
	var events func() (bool, string)
	var brokerRefused func() error
	if eventsState != nil {
		events, brokerRefused = eventsState.Status, eventsState.Refused
	}
	return httpapi.NewHandler(httpapi.Config{
		Pool:           s.pool,
		Idem:           store,
		Payments:       paymentsSvc,
		Logger:         s.logger,
		RequestTimeout: s.cfg.RequestTimeout,
		RateLimit:      s.cfg.RateLimit,
		AuthCacheTTL:   s.cfg.AuthCacheTTL,
		Clients:        s.cfg.Clients,
		// A client's share of the requests in flight is its share of the
		// connections: a direct client can hold no more anyway, and a
		// client behind a trusted proxy (exempt from the listener's share)
		// no more than one direct client could.
		ClientShare:      connlimit.Share(s.cfg.MaxConnections),
		OpenAPI:          apispec.OpenAPI,
		WebhookSecrets:   s.cfg.WebhookSecrets,
		WebhookTolerance: s.cfg.WebhookTolerance,
		WebhookScheme:    s.cfg.WebhookScheme,
		Events:           events,
		BrokerRefused:    brokerRefused,
		Draining:         s.draining,
		PreferWait:       s.cfg.PreferWait,
		ProblemBaseURL:   s.cfg.ProblemBaseURL,
	})
}

// newHTTPServer is the public server: the timeouts of cfg, and the bounds
// on the header block.
func newHTTPServer(cfg config.Config, logger *slog.Logger, handler http.Handler) *http.Server {
	return &http.Server{
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
}

// listen opens the public listener.
func (s *apiServer) listen() error {
	// Listen synchronously: a port already in use is an error, not a log line.
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("ADDR %s cannot be listened on (%w): stop what uses it, or set ADDR to another address, such as ADDR=:8081", s.cfg.Addr, err)
	}
	// At the limit silent and idle connections give way, and no client
	// address but a trusted proxy holds more than its share (R4): see
	// connlimit.Listener.
	conns := connlimit.New(ln, s.cfg.MaxConnections, connlimit.Options{Proxies: s.cfg.Clients})
	s.http.ConnState = conns.Track
	s.ln = conns
	return nil
}

// startWorkers starts what runs beside the server until the drain stops
// it (step 4), under a context of its own: the signal does not reach it.
func (s *apiServer) startWorkers(ctx context.Context, paymentsSvc *payments.Service, eventsState *messaging.State) error {
	workersCtx := context.WithoutCancel(ctx)
	// The relay and the consumers run beside the server, unless
	// EVENT_WORKERS leaves them to other processes. They connect to the
	// broker in the background: the server does not wait for it.
	if s.cfg.EventWorkers {
		listenPool, closeListenPool, err := directPool(ctx, s.pool, s.cfg)
		if err != nil {
			return err
		}
		s.workers.add(messaging.Start(workersCtx, messaging.Config{
			Pool: s.pool, ListenPool: listenPool, NatsURL: s.cfg.NatsURL, Broker: s.cfg.Broker, OutboxClaimHold: s.cfg.OutboxClaimHold,
			Consumer: messaging.Consumer{Name: orders.ConsumerName, Subjects: orders.Subjects, Apply: orders.ApplyEvent},
			Logger:   s.logger, State: eventsState,
		}), closeListenPool)
	}
	// So does the completer.
	if s.cfg.CompleterInterval > 0 {
		s.workers.add(beside(workersCtx, payments.NewCompleter(paymentsSvc, s.cfg.CompleterInterval).Run), nil)
	}
	// And the reaper (E1, E3), when enabled.
	if s.cfg.ReaperInterval > 0 {
		s.workers.add(beside(workersCtx, opscli.NewReaper(s.pool, s.cfg, s.logger).Run), nil)
	}
	return nil
}

// listenAdmin opens the admin listener once the workers have started, so
// that the first scrape finds every series the alerts name (the
// consumer's are made by messaging.Start); then the public listener is
// announced.
func (s *apiServer) listenAdmin() error {
	if s.cfg.AdminAddr != "" {
		admin, err := listenAdmin(s.cfg.AdminAddr, s.logger)
		if err != nil {
			_ = s.ln.Close()
			return err
		}
		s.admin, s.adminAddr = admin, admin.addr
		s.logger.Info("admin listening: /metrics and /debug/pprof/", slog.String("addr", s.adminAddr))
	} else {
		s.logger.Info("no admin listener: /metrics and pprof are not served (set ADMIN_ADDR)")
	}
	s.logger.Info("listening", slog.String("addr", s.ln.Addr().String()), slog.Int("max_connections", s.cfg.MaxConnections),
		slog.String("database", databaseTarget(s.cfg.DatabaseURL)), slog.String("processor", processorTarget(s.cfg)),
		slog.String("nats", messaging.RedactURL(s.cfg.NatsURL)))
	return nil
}

// drain runs steps 1 to 4 once ctx is cancelled; step 5 is close's.
func (s *apiServer) drain(ctx context.Context) error {
	// Steps 1 and 2: not ready, and still serving.
	start := time.Now()
	s.logger.Info("draining: /readyz answers 503; still serving until the grace ends",
		slog.Duration("grace", s.cfg.ShutdownGrace), slog.Duration("timeout", s.cfg.ShutdownTimeout))
	s.http.SetKeepAlivesEnabled(false) // before the first 503: every answer after it says Connection: close
	close(s.draining)
	if s.cfg.ShutdownGrace > 0 {
		select {
		case <-time.After(s.cfg.ShutdownGrace):
		case err := <-s.served:
			return err
		}
	}

	// Step 3: the listener closes; the requests in flight finish.
	s.logger.Info("shutting down: the listener is closed; waiting for the requests in flight", slog.Duration("timeout", s.cfg.ShutdownTimeout))
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	var shutdownErr error
	if err := s.http.Shutdown(shutdownCtx); err != nil {
		// Their connections are closed unanswered: a client sees a
		// connection closed before the answer, and its retry with the same
		// key replays what committed or runs what did not.
		shutdownErr = fmt.Errorf("shutdown: requests still running after SHUTDOWN_TIMEOUT (%s) were cut: %w", s.cfg.ShutdownTimeout, err)
		_ = s.http.Close()
	}
	if err := <-s.served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}

	// Step 4: the workers stop at a safe point.
	s.logger.Info("stopping the workers", slog.Duration("timeout", s.cfg.ShutdownTimeout))
	if !s.workers.stop(s.cfg.ShutdownTimeout) {
		shutdownErr = errors.Join(shutdownErr, fmt.Errorf("shutdown: the workers did not stop within SHUTDOWN_TIMEOUT (%s); what they held is recovered as after a crash", s.cfg.ShutdownTimeout))
	}
	if shutdownErr != nil {
		s.cut = true
		return shutdownErr
	}
	s.logger.Info("stopped", slog.Duration("took", time.Since(start)))
	return nil
}

// close releases what start opened, after a drain or an early return:
// the admin listener (it served the drain to the end), the workers (after
// a drain, a no-op), then the pool, unless something was cut (step 5).
func (s *apiServer) close() {
	if s.admin != nil {
		_ = s.admin.Close()
	}
	s.workers.stop(0)
	if s.pool != nil && !s.cut {
		s.pool.Close()
	}
}

// adminServer is the admin listener's server.
type adminServer struct {
	*http.Server
	addr string // as bound: ADMIN_ADDR with its port 0 resolved
}

// listenAdmin serves httpapi.NewAdminHandler on addr: synchronously
// bound, so that a port in use is an error naming ADMIN_ADDR. No write
// timeout: a CPU profile or trace streams for as long as it was asked to
// (?seconds=30).
func listenAdmin(addr string, logger *slog.Logger) (*adminServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("ADMIN_ADDR %s cannot be listened on (%w): stop what uses it, or set ADMIN_ADDR to another address, such as ADMIN_ADDR=127.0.0.1:9091", addr, err)
	}
	srv := &http.Server{
		Handler:           httpapi.NewAdminHandler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	go func() { _ = srv.Serve(ln) }()
	return &adminServer{Server: srv, addr: ln.Addr().String()}, nil
}

// workers are the stop functions of what runs beside the server, each with
// what to release once it stopped.
type workers struct {
	stops []func()
}

// add records stop, and release (nil: nothing) to call after it.
func (w *workers) add(stop, release func()) {
	w.stops = append(w.stops, func() {
		stop()
		if release != nil {
			release()
		}
	})
}

// stop stops every worker at once and waits for all of them, for at most
// timeout (0: without a bound). It reports whether they all stopped; a
// second call has nothing left to stop.
func (w *workers) stop(timeout time.Duration) bool {
	stops := w.stops
	w.stops = nil
	var wg sync.WaitGroup
	for _, stop := range stops {
		wg.Go(stop)
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	if timeout <= 0 {
		<-done
		return true
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
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
// direct URL, as small as the one connection needs, which release
// closes.
func directPool(ctx context.Context, pool *pgxpool.Pool, cfg config.Config) (direct *pgxpool.Pool, release func(), err error) {
	if cfg.DirectURL() == cfg.DatabaseURL {
		return pool, func() {}, nil
	}
	direct, err = db.Open(ctx, cfg.DirectURL(), db.MaxConns(2))
	if err != nil {
		return nil, nil, fmt.Errorf("DATABASE_DIRECT_URL: %w", err)
	}
	return direct, direct.Close, nil
}

// processorTarget says which processor the process calls, for its log:
// the URL without its credentials (R8).
func processorTarget(cfg config.Config) string {
	if cfg.Processor == config.ProcessorStripe {
		return "stripe " + messaging.RedactURL(cfg.StripeURL)
	}
	return messaging.RedactURL(cfg.ProcessorURL)
}

// newProcessor is the adapter PROCESSOR names.
func newProcessor(cfg config.Config) processor.Processor {
	if cfg.Processor == config.ProcessorStripe {
		return stripeproc.New(stripeproc.Config{APIKey: cfg.StripeAPIKey, URL: cfg.StripeURL, Timeout: cfg.ProcessorTimeout, SearchLag: cfg.StripeSearchLag})
	}
	return simproc.NewClient(cfg.ProcessorURL, cfg.ProcessorTimeout)
}

// services builds the idempotency store and the payments service from cfg.
func services(pool *pgxpool.Pool, cfg config.Config, logger *slog.Logger) (*idem.Store, *payments.Service) {
	store := idem.NewStore(pool, idem.Config{
		LockTimeout: cfg.LockTimeout, TTL: cfg.IdempotencyTTL, KeyRetention: cfg.KeyRetention, Lease: cfg.PaymentLease,
		KeyBudget: cfg.KeyBudget,
	})
	return store, payments.NewService(pool, store, newProcessor(cfg), httpapi.Renderer{}, logger, payments.Config{SettleWindow: cfg.SettleWindow})
}

// runCompleter runs the completer alone, without the HTTP server, until ctx
// is cancelled.
func runCompleter(ctx context.Context, cfg config.Config, logger *slog.Logger) error {
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

// databaseTarget is where DATABASE_URL points, for the startup log: host,
// port and database, never the user's password.
func databaseTarget(databaseURL string) string {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return "(unparsable DATABASE_URL)"
	}
	return fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database)
}

// schemaCheckRetry is how often serve asks again for the schema version
// while the database cannot answer.
const schemaCheckRetry = time.Second

// checkSchema runs dbmigrate.CheckApplied, and while the database cannot
// answer (down, or failing over: no host accepts writes yet) asks again
// every schemaCheckRetry instead of exiting. A process started during a
// failover, as a pod rescheduled with its node or an API restarted by a
// crash is, would otherwise exit and be restarted with a growing backoff,
// which outlasts the failover. A schema that is behind still stops it.
func checkSchema(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	for waited := false; ; waited = true {
		err := dbmigrate.CheckApplied(ctx, pool)
		if err == nil && waited {
			logger.Info("the database answers: schema version checked")
		}
		if err == nil || !db.IsTransient(err) {
			return err
		}
		if !waited {
			logger.Warn("the database does not answer: waiting for it before serving", "error", err)
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(schemaCheckRetry):
		}
	}
}
