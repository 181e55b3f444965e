// Command processor runs the payment processor simulator on its own, as a
// separate process the API calls over HTTP (requirement S5).
//
// Usage:
//
//	processor
//
// Environment:
//
//	PROCESSOR_ADDR                      listen address (default :8090)
//	PROCESSOR_IGNORE_IDEMPOTENCY_KEYS   true: execute every call, never
//	                                    deduplicate (requirement S4)
//	                                    (default false)
//	PROCESSOR_LATENCY                   added to every call, e.g. 200ms
//	                                    (default 0, at most 30s: see
//	                                    processorsim.MaxExecution)
//	PROCESSOR_WEBHOOK_URL               where events are delivered, e.g.
//	                                    http://localhost:8080/v1/webhooks/processor
//	                                    (default: none, no webhooks)
//	PROCESSOR_WEBHOOK_SECRETS           comma-separated signing secrets
//	PROCESSOR_WEBHOOK_SCHEME            processor (default) or standard
//
// State is kept in memory: it survives restarts of the API, because this
// is a separate process, and is lost when this process stops.
//
// It logs JSON to stderr and stops gracefully on SIGINT or SIGTERM. The
// HTTP API, including the /_sim endpoints that queue faults and switch
// modes at run time, is described in internal/tooling/processorsim. For example:
//
//	curl -X POST localhost:8090/_sim/faults -d '{"path":"/v1/charges","kind":"lost_response"}'
//	curl -X POST localhost:8090/_sim/faults -d '{"path":"/v1/charges","kind":"late_execution","latency_ms":5000}'
//	curl -X POST localhost:8090/_sim/faults -d '{"path":"/v1/charges","kind":"status","status":429,"retry_after_ms":2000}'
//	curl localhost:8090/_sim/idle
//	curl localhost:8090/_sim/calls
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemref/payments/internal/logging"
	"github.com/idemref/payments/internal/tooling/processorsim"
	"github.com/idemref/payments/internal/webhook"
)

const usage = `usage: processor

Runs the payment processor simulator. Environment:
  PROCESSOR_ADDR                      listen address (default :8090)
  PROCESSOR_IGNORE_IDEMPOTENCY_KEYS   true: execute every call, never deduplicate (default false)
  PROCESSOR_LATENCY                   added to every call, e.g. 200ms (default 0, at most 30s)
  PROCESSOR_WEBHOOK_URL               deliver signed events there (default: no webhooks)
  PROCESSOR_WEBHOOK_SECRETS           comma-separated signing secrets
  PROCESSOR_WEBHOOK_SCHEME            processor (Processor-Signature, default) or standard (Standard Webhooks)

State is in memory: it survives restarts of the API, not of this process.
Faults and modes can be changed at run time through /_sim/faults and /_sim/mode.
`

// shutdownTimeout bounds the wait for calls in flight on SIGINT/SIGTERM.
const shutdownTimeout = 10 * time.Second

func main() {
	if len(os.Args) > 1 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Getenv, os.Stderr, nil)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "processor:", err)
		os.Exit(1)
	}
}

// config is read from the environment; see the package documentation.
type config struct {
	Addr                  string
	IgnoreIdempotencyKeys bool
	Latency               time.Duration
	Webhooks              processorsim.WebhookConfig
}

func loadConfig(getenv func(string) string) (config, error) {
	cfg := config{Addr: getenv("PROCESSOR_ADDR")}
	cfg.Webhooks.URL = getenv("PROCESSOR_WEBHOOK_URL")
	for sec := range strings.SplitSeq(getenv("PROCESSOR_WEBHOOK_SECRETS"), ",") {
		if sec = strings.TrimSpace(sec); sec != "" {
			cfg.Webhooks.Secrets = append(cfg.Webhooks.Secrets, sec)
		}
	}
	switch scheme := getenv("PROCESSOR_WEBHOOK_SCHEME"); scheme {
	case "", string(webhook.SchemeProcessor):
	case string(webhook.SchemeStandard):
		cfg.Webhooks.Scheme = webhook.SchemeStandard
		for _, sec := range cfg.Webhooks.Secrets {
			if _, err := webhook.StandardKey(sec); err != nil {
				return config{}, fmt.Errorf("PROCESSOR_WEBHOOK_SECRETS: with PROCESSOR_WEBHOOK_SCHEME=standard each secret is whsec_ followed by the base64 of at least 16 bytes")
			}
		}
	default:
		return config{}, fmt.Errorf("PROCESSOR_WEBHOOK_SCHEME=%q: want processor (Processor-Signature, the default) or standard (Standard Webhooks)", scheme)
	}
	if cfg.Addr == "" {
		cfg.Addr = ":8090"
	}
	if s := getenv("PROCESSOR_IGNORE_IDEMPOTENCY_KEYS"); s != "" {
		v, err := strconv.ParseBool(s)
		if err != nil {
			return config{}, fmt.Errorf("PROCESSOR_IGNORE_IDEMPOTENCY_KEYS=%q: want true or false", s)
		}
		cfg.IgnoreIdempotencyKeys = v
	}
	if s := getenv("PROCESSOR_LATENCY"); s != "" {
		v, err := time.ParseDuration(s)
		// Above MaxExecution every call would be dropped unexecuted, which
		// is the timeout fault, not a latency.
		if err != nil || v < 0 || v > processorsim.MaxExecution {
			return config{}, fmt.Errorf("PROCESSOR_LATENCY=%q: want a duration from 0 to %s, such as 200ms", s, processorsim.MaxExecution)
		}
		cfg.Latency = v
	}
	return cfg, nil
}

// run serves until ctx is cancelled, then shuts down gracefully. ready,
// when set, is called with the base URL once the listener is open.
func run(ctx context.Context, getenv func(string) string, stderr io.Writer, ready func(url string)) error {
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	logger := logging.New(stderr, slog.LevelInfo)
	srv, err := processorsim.Start(cfg.Addr, processorsim.Config{
		Logger:                logger,
		IgnoreIdempotencyKeys: cfg.IgnoreIdempotencyKeys,
		Latency:               cfg.Latency,
		Webhooks:              cfg.Webhooks,
	})
	if err != nil {
		return err
	}
	logger.Info("mode",
		slog.Bool("ignore_idempotency_keys", cfg.IgnoreIdempotencyKeys),
		slog.Duration("latency", cfg.Latency),
		slog.String("state", "in memory; lost when this process stops"))
	if ready != nil {
		ready(srv.URL())
	}

	select {
	case <-srv.Done():
		return srv.Err()
	case <-ctx.Done():
	}
	logger.Info("shutting down", slog.Duration("timeout", shutdownTimeout))
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	return srv.Shutdown(shutdownCtx)
}
