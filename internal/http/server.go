package httpapi

import (
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/idem"
)

// Config is what the HTTP layer needs.
type Config struct {
	Pool   *pgxpool.Pool
	Idem   *idem.Store
	Logger *slog.Logger
	// RequestTimeout bounds every request's context, database work
	// included. A request that runs out of time is rolled back: 503.
	RequestTimeout time.Duration
	// OpenAPI is served at /openapi.yaml when set.
	OpenAPI []byte
}

type api struct {
	pool *pgxpool.Pool
	idem *idem.Store
}

// NewHandler returns the service's HTTP handler.
func NewHandler(cfg Config) http.Handler {
	a := &api{pool: cfg.Pool, idem: cfg.Idem}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 30 * time.Second
	}
	r := chi.NewRouter()
	r.Use(requestContext(cfg.Logger, cfg.RequestTimeout))
	r.NotFound(func(w http.ResponseWriter, r *http.Request) { writeError(w, r, errRouteNotFound) })
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) { writeError(w, r, errMethodNotAllowed) })

	r.Get("/healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	r.Get("/readyz", a.ready)
	if cfg.OpenAPI != nil {
		r.Get("/openapi.yaml", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/yaml")
			_, _ = w.Write(cfg.OpenAPI)
		})
	}

	r.Route("/v1", func(r chi.Router) {
		r.Use(a.authenticate)
		r.Route("/orders", func(r chi.Router) {
			r.Post("/", idempotent[createOrderRequest](a, createOrder))
			r.Get("/", a.listOrders)
			r.Get("/{id}", a.getOrder)
		})
	})
	return r
}

func (a *api) ready(w http.ResponseWriter, r *http.Request) {
	if err := a.pool.Ping(r.Context()); err != nil {
		writeError(w, r, errors.Join(errUnavailable, err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// readError maps a failed read: transient database errors are 503.
func readError(err error) error {
	if db.IsTransient(err) {
		return errors.Join(errUnavailable, err)
	}
	return err
}
