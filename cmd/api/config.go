package main

import (
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/idemref/payments/internal/broker"
	"github.com/idemref/payments/internal/outbox"
	"github.com/idemref/payments/internal/processorsim"
	"github.com/idemref/payments/internal/webhook"

	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/reaper"
)

// config is read from the environment. Every variable has a documented
// default (README, "Configuration") except DATABASE_URL for serve.
type config struct {
	DatabaseURL string
	// DatabaseDirectURL reaches PostgreSQL without a pooler in
	// transaction mode, for what needs a session of its own (D3): the
	// outbox relay's LISTEN and the migrations' advisory lock. Read it
	// through directURL, which falls back to DatabaseURL.
	DatabaseDirectURL string
	Addr              string
	RequestTimeout    time.Duration
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration
	ShutdownTimeout   time.Duration
	LockTimeout       time.Duration
	IdempotencyTTL    time.Duration
	// KeyRetention is how long a key's tombstone is kept (E3); at least
	// IdempotencyTTL.
	KeyRetention time.Duration
	// KeyBudget is how many live idempotency keys one tenant may hold
	// (R6); negative: no budget.
	KeyBudget        int64
	PaymentLease     time.Duration
	ProcessorURL     string
	ProcessorTimeout time.Duration
	// SettleWindow is how long a processor call may still land after it
	// was sent (S6); see docs/payments.md.
	SettleWindow time.Duration
	// AuthCacheTTL is how long an API key that authenticated is trusted
	// without a lookup; 0 looks every request up.
	AuthCacheTTL time.Duration
	// CompleterInterval is how often the completer looks for abandoned
	// payments; 0 disables it in this process.
	CompleterInterval time.Duration
	// ReaperInterval is how often the reaper prunes and deletes expired
	// idempotency keys; 0 disables it in this process.
	ReaperInterval time.Duration
	// ReaperBatch is the most rows one reaper transaction touches.
	ReaperBatch int
	// ReaperDuty is the largest share of its time the reaper spends in
	// batches.
	ReaperDuty float64
	LogLevel   slog.Level

	// EventWorkers: serve runs the outbox relay and the orders consumer.
	// Off, it leaves them to the other API processes (they split the work
	// through PostgreSQL and the durable consumer).
	EventWorkers bool

	// NatsURL is the NATS server with JetStream the outbox relay publishes
	// to and the consumers read from. serve requires it; dev starts an
	// embedded server when it is unset.
	NatsURL string
	// Broker is the streams' and consumers' configuration (M2, M3).
	Broker broker.Config
	// OutboxClaimHold is how long a relay's claim on outbox rows lasts.
	OutboxClaimHold time.Duration
	// MessageRetention is how long inbox ids and published outbox rows
	// are kept before the reaper deletes them (M3).
	MessageRetention time.Duration
	// WebhookSecrets verify processor webhooks (comma-separated in
	// WEBHOOK_SECRETS; two during a rotation).
	WebhookSecrets []string
	// WebhookScheme is how the processor signs its webhooks.
	WebhookScheme webhook.Scheme
	// WebhookTolerance bounds a webhook signature's age.
	WebhookTolerance time.Duration
	// MaxConnections bounds the connections one process holds open (R3).
	MaxConnections int
	// RateLimit bounds each tenant's requests per process (R1).
	RateLimit httpapi.RateLimit
}

// DefaultMessageRetention is MESSAGE_RETENTION's default: a week, far
// beyond the broker's redelivery horizon (30 s doubling over 5 deliveries:
// 15.5 min) and the processor's webhook retries (about 1 h 45 min); a real
// processor such as Stripe retries for up to 3 days, which a week covers
// too.
const DefaultMessageRetention = 7 * 24 * time.Hour

// defaultMaxConnections bounds the open connections of one process.
const defaultMaxConnections = 1024

// defaultProcessorURL is where `go run ./cmd/processor` listens.
const defaultProcessorURL = "http://localhost:8090"

// directURL is DATABASE_DIRECT_URL, or DATABASE_URL when that is unset.
func (c config) directURL() string {
	if c.DatabaseDirectURL != "" {
		return c.DatabaseDirectURL
	}
	return c.DatabaseURL
}

func loadConfig(getenv func(string) string) (config, error) {
	cfg := config{
		DatabaseURL:       getenv("DATABASE_URL"),
		DatabaseDirectURL: getenv("DATABASE_DIRECT_URL"),
		Addr:              getenv("ADDR"),
		ProcessorURL:      getenv("PROCESSOR_URL"),
		NatsURL:           getenv("NATS_URL"),
	}
	for sec := range strings.SplitSeq(getenv("WEBHOOK_SECRETS"), ",") {
		if sec = strings.TrimSpace(sec); sec != "" {
			cfg.WebhookSecrets = append(cfg.WebhookSecrets, sec)
		}
	}
	cfg.WebhookScheme = webhook.SchemeProcessor
	switch s := getenv("WEBHOOK_SCHEME"); s {
	case "", string(webhook.SchemeProcessor):
	case string(webhook.SchemeStandard):
		cfg.WebhookScheme = webhook.SchemeStandard
		for _, sec := range cfg.WebhookSecrets {
			if _, err := webhook.StandardKey(sec); err != nil {
				return config{}, fmt.Errorf("WEBHOOK_SECRETS: with WEBHOOK_SCHEME=standard each secret is whsec_ followed by the base64 of at least 16 bytes, as the processor shows it")
			}
		}
	default:
		return config{}, fmt.Errorf("WEBHOOK_SCHEME=%q: want processor (Processor-Signature, the default) or standard (Standard Webhooks)", s)
	}
	if cfg.Addr == "" {
		cfg.Addr = ":8080"
	}

	durations := []struct {
		name string
		dst  *time.Duration
		def  time.Duration
	}{
		{"REQUEST_TIMEOUT", &cfg.RequestTimeout, 20 * time.Second},
		{"READ_HEADER_TIMEOUT", &cfg.ReadHeaderTimeout, 5 * time.Second},
		{"READ_TIMEOUT", &cfg.ReadTimeout, 15 * time.Second},
		{"WRITE_TIMEOUT", &cfg.WriteTimeout, 30 * time.Second},
		{"IDLE_TIMEOUT", &cfg.IdleTimeout, 120 * time.Second},
		{"SHUTDOWN_TIMEOUT", &cfg.ShutdownTimeout, 15 * time.Second},
		{"IDEMPOTENCY_LOCK_TIMEOUT", &cfg.LockTimeout, idem.DefaultLockTimeout},
		{"IDEMPOTENCY_TTL", &cfg.IdempotencyTTL, idem.DefaultTTL},
		{"IDEMPOTENCY_KEY_RETENTION", &cfg.KeyRetention, idem.DefaultKeyRetention},
		{"PAYMENT_LEASE", &cfg.PaymentLease, idem.DefaultLease},
		{"PROCESSOR_TIMEOUT", &cfg.ProcessorTimeout, processor.DefaultTimeout},
		{"PROCESSOR_SETTLE_WINDOW", &cfg.SettleWindow, payments.DefaultSettleWindow},
		{"COMPLETER_INTERVAL", &cfg.CompleterInterval, 5 * time.Second},
		{"REAPER_INTERVAL", &cfg.ReaperInterval, reaper.DefaultInterval},
		{"AUTH_CACHE_TTL", &cfg.AuthCacheTTL, 10 * time.Second},
		{"EVENTS_DUPLICATE_WINDOW", &cfg.Broker.DuplicateWindow, broker.DefaultDuplicateWindow},
		{"EVENTS_ACK_WAIT", &cfg.Broker.AckWait, broker.DefaultAckWait},
		{"OUTBOX_CLAIM_HOLD", &cfg.OutboxClaimHold, outbox.DefaultClaimHold},
		{"MESSAGE_RETENTION", &cfg.MessageRetention, DefaultMessageRetention},
		{"WEBHOOK_TOLERANCE", &cfg.WebhookTolerance, webhook.DefaultTolerance},
	}
	for _, d := range durations {
		*d.dst = d.def
		if s := getenv(d.name); s != "" {
			v, err := time.ParseDuration(s)
			if err != nil || v < 0 || (v == 0 && d.name != "COMPLETER_INTERVAL" && d.name != "REAPER_INTERVAL" && d.name != "AUTH_CACHE_TTL") {
				return config{}, fmt.Errorf("%s=%q: want a positive duration such as 2s or 24h", d.name, s)
			}
			*d.dst = v
		}
	}
	// A tombstone outlives the result it replaces, never the other way
	// round (the schema checks retain_until >= expires_at too).
	if cfg.KeyRetention < cfg.IdempotencyTTL {
		return config{}, fmt.Errorf("IDEMPOTENCY_KEY_RETENTION (%s) must be at least IDEMPOTENCY_TTL (%s)", cfg.KeyRetention, cfg.IdempotencyTTL)
	}
	// The lease must outlast one step, the processor call included, or a
	// healthy attempt would be taken over while it waits for the answer.
	// A payment request makes one processor call; it needs time for it.
	if cfg.ProcessorTimeout >= cfg.RequestTimeout {
		return config{}, fmt.Errorf("PROCESSOR_TIMEOUT (%s) must be shorter than REQUEST_TIMEOUT (%s)", cfg.ProcessorTimeout, cfg.RequestTimeout)
	}
	if cfg.PaymentLease <= cfg.ProcessorTimeout {
		return config{}, fmt.Errorf("PAYMENT_LEASE (%s) must be longer than PROCESSOR_TIMEOUT (%s)", cfg.PaymentLease, cfg.ProcessorTimeout)
	}
	// A call can land after we stopped waiting for it, never before.
	if cfg.SettleWindow <= cfg.ProcessorTimeout {
		return config{}, fmt.Errorf("PROCESSOR_SETTLE_WINDOW (%s) must be longer than PROCESSOR_TIMEOUT (%s)", cfg.SettleWindow, cfg.ProcessorTimeout)
	}
	cfg.Broker.Replicas = 1
	if s := getenv("EVENTS_REPLICAS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > broker.MaxReplicas {
			return config{}, fmt.Errorf("EVENTS_REPLICAS=%q: want the number of NATS servers that keep each stream, 1 to %d (3 in a cluster of three)", s, broker.MaxReplicas)
		}
		cfg.Broker.Replicas = v
	}
	cfg.Broker.MaxDeliver = broker.DefaultMaxDeliver
	if s := getenv("EVENTS_MAX_DELIVER"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			return config{}, fmt.Errorf("EVENTS_MAX_DELIVER=%q: want a positive number of deliveries, such as 5", s)
		}
		cfg.Broker.MaxDeliver = v
	}
	// An inbox id pruned while its message can still be redelivered would
	// let the redelivery apply the effect twice (M3).
	if horizon := max(cfg.Broker.RedeliveryHorizon(), processorsim.WebhookRetrySpan()); cfg.MessageRetention <= horizon {
		return config{}, fmt.Errorf("MESSAGE_RETENTION (%s) must be longer than the longest redelivery horizon (%s: the broker's backoff over EVENTS_MAX_DELIVER deliveries, and the processor's webhook retries)",
			cfg.MessageRetention, horizon)
	}
	cfg.RateLimit = httpapi.RateLimit{Rate: httpapi.DefaultRateLimit, Burst: httpapi.DefaultRateBurst}
	if s := getenv("RATE_LIMIT_RPS"); s != "" {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			return config{}, fmt.Errorf("RATE_LIMIT_RPS=%q: want requests per second and tenant, such as 100 (0 turns the limit off)", s)
		}
		cfg.RateLimit.Rate = v
	}
	if s := getenv("RATE_LIMIT_BURST"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			return config{}, fmt.Errorf("RATE_LIMIT_BURST=%q: want a positive number of requests, such as 200", s)
		}
		cfg.RateLimit.Burst = v
	}
	cfg.KeyBudget = idem.DefaultKeyBudget
	if s := getenv("IDEMPOTENCY_KEY_BUDGET"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 0 {
			return config{}, fmt.Errorf("IDEMPOTENCY_KEY_BUDGET=%q: want how many live keys a tenant may hold, such as 1000000 (0 turns the budget off)", s)
		}
		cfg.KeyBudget = v
		if v == 0 {
			cfg.KeyBudget = -1
		}
	}
	cfg.ReaperBatch = reaper.DefaultBatch
	if s := getenv("REAPER_BATCH"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			return config{}, fmt.Errorf("REAPER_BATCH=%q: want a positive number of rows, such as 500", s)
		}
		cfg.ReaperBatch = v
	}
	cfg.EventWorkers = true
	if s := getenv("EVENT_WORKERS"); s != "" {
		v, err := strconv.ParseBool(s)
		if err != nil {
			return config{}, fmt.Errorf("EVENT_WORKERS=%q: want true or false", s)
		}
		cfg.EventWorkers = v
	}
	cfg.ReaperDuty = reaper.DefaultDuty
	if s := getenv("REAPER_DUTY"); s != "" {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v <= 0 || v > 1 {
			return config{}, fmt.Errorf("REAPER_DUTY=%q: want a share of time above 0 and at most 1, such as 0.05", s)
		}
		cfg.ReaperDuty = v
	}
	cfg.MaxConnections = defaultMaxConnections
	if s := getenv("MAX_CONNECTIONS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			return config{}, fmt.Errorf("MAX_CONNECTIONS=%q: want a positive number, such as 1024", s)
		}
		cfg.MaxConnections = v
	}
	if s := getenv("LOG_LEVEL"); s != "" {
		if err := cfg.LogLevel.UnmarshalText([]byte(s)); err != nil {
			return config{}, fmt.Errorf("LOG_LEVEL=%q: want debug, info, warn or error", s)
		}
	}
	return cfg, nil
}
