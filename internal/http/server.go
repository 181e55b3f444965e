package httpapi

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/apidocs"
	"github.com/idemref/payments/internal/clientaddr"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/webhook"
)

// Config is what the HTTP layer needs.
type Config struct {
	Pool *pgxpool.Pool
	Idem *idem.Store
	// Payments runs payments and refunds (built with Renderer{}).
	Payments *payments.Service
	Logger   *slog.Logger
	// RequestTimeout bounds every request's context, database work
	// included. A request that runs out of time is rolled back: 503.
	RequestTimeout time.Duration
	// OpenAPI is served at /openapi.yaml when set.
	OpenAPI []byte
	// RateLimit bounds each tenant's requests under /v1 (R1); a zero Rate
	// turns it off.
	RateLimit RateLimit
	// AuthCacheTTL is how long a key that authenticated is trusted without
	// a database lookup, and a key that did not is refused without one
	// (see tenants.Cache); 0 looks every request up.
	AuthCacheTTL time.Duration
	// AuthLookups bounds, per client, the database lookups of API keys that
	// found no tenant, so a flood of made-up keys costs no query each (R5);
	// past it, 429 before any query. A zero Rate takes DefaultAuthLookups.
	AuthLookups RateLimit
	// AuthLookupsTotal bounds the same lookups from every client together
	// (see lookupBudget); a zero Rate takes DefaultAuthLookupsTotal.
	AuthLookupsTotal RateLimit
	// ClientShare is how many requests one client (as Clients names it)
	// may have in flight at once; past it, 429 at once and the connection
	// closed (clientShare). Zero turns it off.
	ClientShare int
	// Clients tells who a request comes from, behind the proxies it
	// trusts (TRUSTED_PROXIES); nil: the TCP peer.
	Clients *clientaddr.Resolver
	// WebhookSecrets verify processor webhooks; during a rotation, the old
	// and the new. None: every webhook is rejected.
	WebhookSecrets []string
	// WebhookTolerance is how far a webhook's signature time may be from
	// now; zero means webhook.DefaultTolerance (5 minutes).
	WebhookTolerance time.Duration
	// WebhookScheme is how the processor signs webhooks: Processor-Signature
	// (the zero value) or Standard Webhooks, whose secrets are whsec_....
	WebhookScheme webhook.Scheme
	// Events, when set, reports whether this process's events flow (the
	// broker reached, the outbox relayed, events consumed) and, when they
	// do not, why; /readyz shows it.
	Events func() (flowing bool, detail string)
	// lookupClients bounds the clients the lookup budget remembers; zero:
	// DefaultLookupClients. Tests lower it (export_test.go).
	lookupClients int
	// BrokerRefused, when set, says why the broker is one this process
	// refuses (too old for its configuration), nil while it is not: a
	// deployment's mistake that no retry mends, so /readyz answers 503
	// with it, unlike an outage of the broker.
	BrokerRefused func() error
	// Draining, when closed, says the process is shutting down (G4):
	// /readyz answers 503 from then on, so that the load balancer stops
	// sending, while every other route is still served. Nil: never.
	Draining <-chan struct{}
	// PreferWait bounds the duplicates that wait for their key's first
	// attempt under Prefer: wait (L7); a zero Max honours no wait.
	PreferWait idem.WaitLimits
	// ProblemBaseURL prefixes every problem's type ("": the default,
	// DefaultProblemBaseURL). It is the process's: the last handler built
	// sets it.
	ProblemBaseURL string
}

type api struct {
	pool     *pgxpool.Pool
	idem     *idem.Store
	payments *payments.Service
	limiter  *limiter[uuid.UUID] // nil: no rate limit
	auth     *tenants.Cache
	// authLookups is the budget of failed key lookups (R5).
	authLookups *lookupBudget
	clients     *clientaddr.Resolver

	webhookSecrets   []string
	webhookTolerance time.Duration
	webhookScheme    webhook.Scheme
	events           func() (flowing bool, detail string)
	brokerRefused    func() error
	draining         <-chan struct{}

	// waiters keeps the duplicates that wait (L7); contract is what
	// openapi.yaml declares of each keyed endpoint (F5), rules the
	// document of both (L8).
	waiters  *idem.Waiters
	contract map[string]contractRules
	rules    rulesDocument
}

// loadtestRoutes is the one seam through which the load benchmark's routes
// enter the product: files with the loadtest build tag append to it in
// init, and v1Routes adds what they appended under /v1, behind its
// authentication and rate limit. In -tags loadtest builds it holds the
// baselines without a key (baseline_loadtest.go) and the claim-first peer
// (claimfirst_loadtest.go); in the normal build nothing appends, and
// TestLoadtestRoutesAreNotInTheNormalBuild finds none of their paths.
var loadtestRoutes []func(a *api, r chi.Router)

// NewHandler returns the service's HTTP handler.
func NewHandler(cfg Config) http.Handler {
	cfg = cfg.withDefaults()
	problemBase.Store(&cfg.ProblemBaseURL)
	a := newAPI(cfg)
	idem.InitEndpointMetrics(slices.Sorted(maps.Keys(idempotentEndpoints))...)
	r := chi.NewRouter()
	r.Use(requestContext(cfg.Logger, cfg.RequestTimeout))
	r.Use(requestFraming)
	r.Use(newClientShare(cfg.Clients, cfg.ClientShare).middleware)
	r.Use(headAsGet)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) { writeError(w, r, errRouteNotFound) })
	var allow *chi.Mux // built from the finished router, below
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		// RFC 9110 section 15.5.6: a 405 lists the methods the target has.
		w.Header().Set("Allow", allowedMethods(allow, req.URL.Path))
		writeError(w, req, errMethodNotAllowed)
	})

	r.Get("/healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	r.Get("/readyz", a.ready)
	// /metrics and the profiler are on the admin listener only
	// (NewAdminHandler): here they are 404 like any unknown path.
	if cfg.OpenAPI != nil {
		docsRoutes(r, cfg.OpenAPI)
	}
	// Every problem's type links here (DefaultProblemBaseURL).
	r.Get("/docs/problems", serveProblems)
	r.Route("/v1", a.v1Routes)
	allow = routeIndex(r)
	initRouteMetrics(r)
	return traced(r)
}

// withDefaults fills in what cfg leaves zero.
func (cfg Config) withDefaults() Config {
	if cfg.WebhookTolerance <= 0 {
		cfg.WebhookTolerance = webhook.DefaultTolerance
	}
	if cfg.AuthLookups.Rate <= 0 {
		cfg.AuthLookups = DefaultAuthLookups
	}
	if cfg.AuthLookupsTotal.Rate <= 0 {
		cfg.AuthLookupsTotal = DefaultAuthLookupsTotal
	}
	if cfg.lookupClients <= 0 {
		cfg.lookupClients = DefaultLookupClients
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 30 * time.Second
	}
	if cfg.ProblemBaseURL == "" {
		cfg.ProblemBaseURL = DefaultProblemBaseURL
	}
	return cfg
}

// newAPI builds the handlers' shared state from a cfg with its defaults.
func newAPI(cfg Config) *api {
	a := &api{pool: cfg.Pool, idem: cfg.Idem, payments: cfg.Payments, auth: tenants.NewCache(cfg.Pool, cfg.AuthCacheTTL),
		webhookSecrets: cfg.WebhookSecrets, webhookTolerance: cfg.WebhookTolerance, webhookScheme: cfg.WebhookScheme, events: cfg.Events,
		brokerRefused: cfg.BrokerRefused, draining: cfg.Draining}
	a.authLookups = newLookupBudget(cfg.AuthLookups, cfg.AuthLookupsTotal, cfg.lookupClients)
	a.clients = cfg.Clients
	if cfg.RateLimit.Rate > 0 {
		a.limiter = newLimiter[uuid.UUID](cfg.RateLimit)
	}
	a.waiters = idem.NewWaiters(cfg.Idem, cfg.PreferWait)
	if cfg.OpenAPI != nil {
		// The document is embedded at build time, so a contract the
		// server cannot enforce is a build that must not serve:
		// CheckContract tells serve why before it gets here.
		contract, err := readContract(cfg.OpenAPI)
		if err != nil {
			panic(err)
		}
		a.contract = contract
	}
	if cfg.Idem != nil {
		a.rules = newRulesDocument(rulesTable(a.contract, cfg.Idem.Config(), cfg.PreferWait))
	}
	return a
}

// CheckContract reports why the OpenAPI document spec declares rules of
// keys the server must not enforce (a fingerprint that would ignore an
// amount, say), or nil: serve refuses to start on it (F5).
func CheckContract(spec []byte) error {
	_, err := readContract(spec)
	return err
}

// docsRoutes serves the OpenAPI document and the reference page rendered
// from it.
func docsRoutes(r chi.Router, spec []byte) {
	r.Get("/openapi.yaml", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(spec)
	})
	r.Get("/docs", apidocs.Page)
	r.Get(apidocs.BundlePath, apidocs.Bundle)
}

// v1Routes is the API under /v1: the processor's webhooks, and the rest
// behind authentication and the rate limit.
func (a *api) v1Routes(r chi.Router) {
	r.Use(noStore)
	// The processor authenticates with its signature, not an API key,
	// and deduplicates with its event id, not an Idempotency-Key.
	r.Post("/webhooks/processor", a.processorWebhook)
	r.Group(func(r chi.Router) {
		r.Use(a.authenticate, a.rateLimit)
		r.Route("/orders", func(r chi.Router) {
			r.Post("/", idempotent[createOrderRequest](a, createOrderEndpoint, createOrder))
			r.Get("/", a.listOrders)
			r.Get("/{id}", a.getOrder)
			r.Patch("/{id}", a.updateOrder)
		})
		r.Route("/customers", func(r chi.Router) {
			r.Put("/{id}", a.putCustomer)
			r.Get("/{id}", a.getCustomer)
		})
		r.Get("/idempotency-keys/{key}", a.getKeyStatus)
		r.Get("/idempotency", a.rules.serveRules)
		r.Route("/payments", func(r chi.Router) {
			r.Post("/", multiStep[createPaymentRequest](a, payments.CreatePayment, a.createPayment))
			r.Get("/", a.listPayments)
			r.Get("/{id}", a.getPayment)
			r.Post("/{id}/refunds", a.createRefund)
			r.Get("/{id}/refunds/{refund_id}", a.getRefund)
		})
		// The load benchmark's routes, in -tags loadtest builds only.
		for _, add := range loadtestRoutes {
			add(a, r)
		}
	})
}

// ready is /readyz: 503 while the database does not answer, since then
// nothing can be served. The broker is deliberately not part of it: every
// request is served without it (a payment's events wait in the outbox until
// the relay reaches the broker again), and a probe that failed with it
// would take every process out of the load balancer for a broker outage.
// The answer says whether events flow instead, for a person to read; the
// payments_events_broker_connected gauge is what to alert on. A broker
// the process refuses (too old for its configuration) is no outage but a
// deployment's mistake, and answers 503. A process that is shutting down
// answers 503 too, first of all.
func (a *api) ready(w http.ResponseWriter, r *http.Request) {
	select {
	case <-a.draining:
		writeError(w, r, errDraining)
		return
	default:
	}
	if err := a.pool.Ping(r.Context()); err != nil {
		writeError(w, r, errors.Join(errNotReady, err))
		return
	}
	if a.brokerRefused != nil {
		if err := a.brokerRefused(); err != nil {
			writeError(w, r, fmt.Errorf("%w: %w", errBrokerRefused, err))
			return
		}
	}
	body := map[string]string{"status": "ready"}
	if a.events != nil {
		body["events"] = "flowing"
		if flowing, detail := a.events(); !flowing {
			body["events"] = "not flowing: " + detail
		}
	}
	writeJSON(w, http.StatusOK, body)
}

// headAsGet answers HEAD on every GET route (RFC 9110 section 9.3.2): the
// request is routed as the GET it stands for, so it gets the same status
// and headers, through the same authentication and rate limit, and
// net/http drops the body, since the request it answers is a HEAD. It runs
// after requestContext, so logs and metrics still say HEAD.
func headAsGet(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			get := r.Clone(r.Context())
			get.Method = http.MethodGet
			r = get
		}
		next.ServeHTTP(w, r)
	})
}

// routeIndex copies routes into one flat router, every route also without
// its trailing slash. chi's own list of allowed methods is not exposed to a
// custom 405 handler, and Match on the nested router cannot tell a mounted
// subrouter's path apart from its routes.
func routeIndex(routes chi.Routes) *chi.Mux {
	idx := chi.NewRouter()
	noop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	_ = chi.Walk(routes, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		methods := []string{method}
		if method == http.MethodGet {
			methods = append(methods, http.MethodHead) // headAsGet serves it
		}
		for _, m := range methods {
			idx.Method(m, route, noop)
			if trimmed := strings.TrimSuffix(route, "/"); trimmed != "" && trimmed != route {
				idx.Method(m, trimmed, noop)
			}
		}
		return nil
	})
	return idx
}

// allowedMethods lists the methods idx serves at path, for a 405's Allow.
func allowedMethods(idx *chi.Mux, path string) string {
	var allowed []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		if idx.Match(chi.NewRouteContext(), m, path) {
			allowed = append(allowed, m)
		}
	}
	return strings.Join(allowed, ", ")
}
