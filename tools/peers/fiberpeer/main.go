// Command fiberpeer is the load benchmark's published peer (P8,
// tools/loadtest): a Fiber app that creates the benchmark's orders in the
// same PostgreSQL table with the same insert as POST /v1/orders, twice
// routed:
//
//	POST /idem/orders   behind Fiber's middleware/idempotency, its
//	                    responses stored in Redis by
//	                    github.com/gofiber/storage/redis/v3
//	POST /plain/orders  the same handler without the middleware
//
// The middleware is used as its documentation shows (idempotency.New with
// a Config): only KeyHeader is set to the header the IETF draft and this
// project use (Idempotency-Key; Fiber's default is X-Idempotency-Key),
// Lifetime to the 24 hours our records are replayed, and Storage to the
// Redis storage; the key validation (36 characters, a UUID), the
// in-process lock and "keep every response header" are Fiber's defaults.
// The middleware runs the handler under its lock and then stores the
// response: the order commits in PostgreSQL first, the response in Redis
// second.
//
// The handler checks the bearer token against PEER_API_KEY (the tenant is
// PEER_TENANT_ID), decodes the JSON body, checks the fields the table's
// constraints check, and inserts the order in one statement (autocommit),
// answering 201 with the order. A response the middleware replayed carries
// Idempotent-Replayed: true (set from idempotency.IsFromCache), so the
// benchmark can tell an execution from a replay, as it does for ours.
//
// PEER_FAILPOINT=after-commit makes the handler kill its own process
// (SIGKILL) once the order has committed, before it returns: before the
// middleware can store the response. The benchmark's crash test arms it.
//
// It is a module of its own (tools/peers/go.mod), so that Fiber, fasthttp
// and go-redis are in no build of the server and in none of its go.mod.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/idempotency"
	"github.com/gofiber/storage/redis/v3"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func main() {
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(logger); err != nil {
		logger.Error("fiberpeer", "err", err)
		os.Exit(1)
	}
}

// config is read from the environment; every variable is required but
// PEER_ADDR (default 127.0.0.1:0) and PEER_FAILPOINT.
type config struct {
	addr, databaseURL, redisAddr, apiKey, failpoint string
	tenant                                          uuid.UUID
}

func loadConfig() (config, error) {
	c := config{
		addr:        os.Getenv("PEER_ADDR"),
		databaseURL: os.Getenv("DATABASE_URL"),
		redisAddr:   os.Getenv("REDIS_ADDR"),
		apiKey:      os.Getenv("PEER_API_KEY"),
		failpoint:   os.Getenv("PEER_FAILPOINT"),
	}
	if c.addr == "" {
		c.addr = "127.0.0.1:0"
	}
	for name, v := range map[string]string{"DATABASE_URL": c.databaseURL, "REDIS_ADDR": c.redisAddr, "PEER_API_KEY": c.apiKey} {
		if v == "" {
			return c, fmt.Errorf("%s is not set", name)
		}
	}
	var err error
	if c.tenant, err = uuid.Parse(os.Getenv("PEER_TENANT_ID")); err != nil {
		return c, fmt.Errorf("PEER_TENANT_ID: %w", err)
	}
	if c.failpoint != "" && c.failpoint != "after-commit" {
		return c, fmt.Errorf("PEER_FAILPOINT=%q: want after-commit or nothing", c.failpoint)
	}
	return c, nil
}

func run(logger *slog.Logger) error {
	cfg, err := loadConfig()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, cfg.databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	host, portText, err := net.SplitHostPort(cfg.redisAddr)
	if err != nil {
		return fmt.Errorf("REDIS_ADDR: %w", err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return fmt.Errorf("REDIS_ADDR: %w", err)
	}
	storage := redis.New(redis.Config{Host: host, Port: port})
	defer storage.Close()

	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	h := &handler{pool: pool, tenant: cfg.tenant, apiKey: cfg.apiKey, crash: cfg.failpoint == "after-commit"}
	app.Post("/plain/orders", h.createOrder)
	app.Post("/idem/orders", markReplayed, idempotency.New(idempotency.Config{
		KeyHeader: "Idempotency-Key",
		Lifetime:  24 * time.Hour,
		Storage:   storage,
	}), h.createOrder)

	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return err
	}
	logger.Info("listening", "addr", ln.Addr().String())
	done := make(chan error, 1)
	go func() { done <- app.Listener(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return app.ShutdownWithTimeout(5 * time.Second)
	}
}

// markReplayed runs outside the idempotency middleware and marks the
// responses it answered from storage.
func markReplayed(c *fiber.Ctx) error {
	err := c.Next()
	if idempotency.IsFromCache(c) {
		c.Set("Idempotent-Replayed", "true")
	}
	return err
}

type handler struct {
	pool   *pgxpool.Pool
	tenant uuid.UUID
	apiKey string
	crash  bool
}

type orderRequest struct {
	Reference   string          `json:"reference"`
	CustomerID  string          `json:"customer_id"`
	Amount      int64           `json:"amount"`
	Currency    string          `json:"currency"`
	Description string          `json:"description"`
	Metadata    json.RawMessage `json:"metadata"`
}

type order struct {
	ID             uuid.UUID       `json:"id"`
	Reference      string          `json:"reference"`
	CustomerID     string          `json:"customer_id"`
	Amount         int64           `json:"amount"`
	Currency       string          `json:"currency"`
	Description    string          `json:"description"`
	Metadata       json.RawMessage `json:"metadata"`
	Status         string          `json:"status"`
	AmountPaid     int64           `json:"amount_paid"`
	AmountRefunded int64           `json:"amount_refunded"`
	CreatedAt      time.Time       `json:"created_at"`
}

var currency = regexp.MustCompile(`^[A-Z]{3}$`)

// insertOrder is db/queries/orders.sql's OrderCreate: the same statement
// on the same table, its natural key included.
const insertOrder = `INSERT INTO orders (tenant_id, id, reference, customer_id, amount, currency, description, metadata)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT ON CONSTRAINT orders_tenant_reference_key DO NOTHING
RETURNING id, reference, customer_id, amount, currency, description, metadata, status, amount_paid, amount_refunded, created_at`

func problem(c *fiber.Ctx, status int, code string) error {
	return c.Status(status).JSON(fiber.Map{"status": status, "code": code})
}

func (h *handler) createOrder(c *fiber.Ctx) error {
	if c.Get(fiber.HeaderAuthorization) != "Bearer "+h.apiKey {
		return problem(c, fiber.StatusUnauthorized, "unauthenticated")
	}
	var req orderRequest
	if err := c.BodyParser(&req); err != nil {
		return problem(c, fiber.StatusBadRequest, "malformed_body")
	}
	if len(req.Metadata) == 0 {
		req.Metadata = json.RawMessage(`{}`)
	}
	if n := len(req.Reference); n < 1 || n > 128 {
		return problem(c, fiber.StatusBadRequest, "validation_failed")
	}
	if n := len(req.CustomerID); n < 1 || n > 128 {
		return problem(c, fiber.StatusBadRequest, "validation_failed")
	}
	if req.Amount < 1 || req.Amount > 99999999 || !currency.MatchString(req.Currency) {
		return problem(c, fiber.StatusBadRequest, "validation_failed")
	}
	var o order
	err := h.pool.QueryRow(c.UserContext(), insertOrder, h.tenant, uuid.New(), req.Reference, req.CustomerID,
		req.Amount, req.Currency, req.Description, req.Metadata).Scan(
		&o.ID, &o.Reference, &o.CustomerID, &o.Amount, &o.Currency, &o.Description, &o.Metadata, &o.Status,
		&o.AmountPaid, &o.AmountRefunded, &o.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return problem(c, fiber.StatusConflict, "order_reference_exists")
	}
	if err != nil {
		return err
	}
	if h.crash {
		// The order has committed; the middleware has not stored the
		// response yet. A crash here is the window the crash test opens.
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	c.Location("/orders/" + o.ID.String())
	return c.Status(fiber.StatusCreated).JSON(o)
}
