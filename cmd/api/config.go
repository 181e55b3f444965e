package main

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemref/payments/internal/broker"
	"github.com/idemref/payments/internal/clientaddr"
	"github.com/idemref/payments/internal/outbox"
	"github.com/idemref/payments/internal/webhook"

	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/inbox"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/reaper"
)

// config is read from the environment: every variable is a row of
// settings, with its default (docs/configuration.md shows the same table).
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
	// WebhookRetrySpan is how long the processor retries a webhook: the
	// inbox keeps webhook ids longer (M3).
	WebhookRetrySpan time.Duration
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
	// Clients resolves the client of a request behind the trusted proxies
	// (TRUSTED_PROXIES, TRUSTED_PROXY_HEADER); it trusts none by default.
	Clients *clientaddr.Resolver

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

// defaultProcessorURL is where `go run ./tools/processor` listens: the
// processor of serve and completer when PROCESSOR_URL is unset (dev starts
// its own simulator instead).
const defaultProcessorURL = "http://localhost:8090"

// setting is one environment variable the configuration reads.
type setting struct {
	name string
	// def is the value loadConfig uses when the variable is unset or
	// empty, written as the variable would be set to it; "" for none.
	def string
	// unset says what happens without a value where def does not say it
	// all: in parentheses after def, or instead of it when def is "".
	unset string
	// about says what the variable does. Backticks mark code, as in the
	// docs; `api help` prints the text without them.
	about string
}

// settings is every environment variable the configuration reads, with its
// default and meaning: the one source of the defaults (loadConfig applies
// def), of `api help`'s configuration text and of the table in
// docs/configuration.md, which TestConfigurationTableInDocs holds to it.
var settings = []setting{
	{"DATABASE_URL", "", "none: `serve` requires it; `make run` starts its own",
		"`postgres://user:pass@host:5432/db?sslmode=...`; pool settings such as `pool_max_conns` go in the URL"},
	{"DATABASE_DIRECT_URL", "", "the value of `DATABASE_URL`",
		"PostgreSQL without a pooler in transaction mode, for what needs a session: the outbox relay's `LISTEN` and the migrations' advisory lock; set it when `DATABASE_URL` goes through PgBouncer (see `docs/deployment.md`)"},
	{"ADDR", ":8080", "", "listen address"},
	{"REQUEST_TIMEOUT", "20s", "",
		"deadline of each request, database work and the processor call included (expired: rolled back or released, 503); must exceed `PROCESSOR_TIMEOUT`"},
	{"IDEMPOTENCY_LOCK_TIMEOUT", duration(idem.DefaultLockTimeout), "",
		"longest wait of a duplicate behind an uncommitted claim before its 409"},
	{"IDEMPOTENCY_TTL", duration(idem.DefaultTTL), "", "how long a key's exact response is replayed"},
	{"IDEMPOTENCY_KEY_RETENTION", duration(idem.DefaultKeyRetention), "",
		"how long the key's tombstone is kept after that (from creation; at least the TTL)"},
	{"REAPER_INTERVAL", duration(reaper.DefaultInterval), "",
		"how often `serve` prunes and deletes expired records; `0` turns it off (`api reap` runs it alone)"},
	{"REAPER_BATCH", strconv.Itoa(reaper.DefaultBatch), "", "rows per reaper batch"},
	{"REAPER_DUTY", strconv.FormatFloat(reaper.DefaultDuty, 'f', -1, 64), "",
		"the largest share of its time the reaper spends in batches: higher reaps faster and costs live traffic more"},
	{"PROCESSOR_URL", "", "`serve` and `completer`: `" + defaultProcessorURL + "`; `make run`: its own simulator",
		"the payment processor (`go run ./tools/processor` serves the simulator at `" + defaultProcessorURL + "`)"},
	{"PROCESSOR_TIMEOUT", duration(processor.DefaultTimeout), "", "timeout of one processor call"},
	{"PROCESSOR_WEBHOOK_RETRY_SPAN", duration(processor.DefaultWebhookRetrySpan), "",
		"how long the processor keeps retrying a webhook, by its own schedule (Stripe's: 3 days; the simulator's: under 2 h); `MESSAGE_RETENTION` must exceed it"},
	{"PROCESSOR_SETTLE_WINDOW", duration(payments.DefaultSettleWindow), "",
		"how long after a processor call it may still land (the processor's longest execution, with room to spare; the simulator's is 30 s); no call is resent and nothing recorded as final until it has passed with nothing found; must exceed `PROCESSOR_TIMEOUT`"},
	{"PAYMENT_LEASE", duration(idem.DefaultLease), "",
		"how long a payment attempt owns its key before a retry or the completer may take over; must exceed `PROCESSOR_TIMEOUT`"},
	{"COMPLETER_INTERVAL", "5s", "",
		"how often `serve` looks for abandoned payments and runs the reconciliation sweep; `0` turns the in-process completer off (`api completer` runs it alone)"},
	{"READ_HEADER_TIMEOUT", "5s", "", "`http.Server.ReadHeaderTimeout`"},
	{"READ_TIMEOUT", "15s", "", "`http.Server.ReadTimeout`"},
	{"WRITE_TIMEOUT", "30s", "", "`http.Server.WriteTimeout`"},
	{"IDLE_TIMEOUT", "120s", "", "`http.Server.IdleTimeout`"},
	{"SHUTDOWN_TIMEOUT", "15s", "", "how long SIGINT/SIGTERM waits for in-flight requests"},
	{"RATE_LIMIT_RPS", strconv.FormatFloat(httpapi.DefaultRateLimit, 'f', -1, 64), "",
		"requests per second per tenant and process; `0` turns the limit off"},
	{"RATE_LIMIT_BURST", strconv.Itoa(httpapi.DefaultRateBurst), "", "requests a tenant may send at once"},
	{"IDEMPOTENCY_KEY_BUDGET", strconv.Itoa(idem.DefaultKeyBudget), "",
		"how many live idempotency keys one tenant may hold (R6); past it a request with a new key is `429 idempotency_key_budget_exceeded`; `0` turns the budget off"},
	{"AUTH_CACHE_TTL", "10s", "",
		"how long an API key that authenticated is trusted without a lookup; `0` looks up every request"},
	{"MAX_CONNECTIONS", "1024", "", "open connections one process accepts at a time; one client address holds at most a quarter of them, a trusted proxy any number"},
	{"TRUSTED_PROXIES", "", "none: every client is its TCP peer",
		"comma-separated addresses or CIDR ranges of the proxies or load balancers in front of the API (such as `10.0.0.0/8`); from these peers only, the client is read from `TRUSTED_PROXY_HEADER` for the per-client budgets, and they are not held to one address's share of `MAX_CONNECTIONS` (see `docs/deployment.md`)"},
	{"TRUSTED_PROXY_HEADER", string(clientaddr.XForwardedFor), "",
		"the header the trusted proxies write the client's address into: `X-Forwarded-For` or `Forwarded` (RFC 7239); read from the right, past every trusted proxy, so what a client wrote there itself is ignored"},
	{"EVENT_WORKERS", "true", "",
		"`serve` runs the outbox relay and the orders consumer; `false` leaves them to the other API processes (the load benchmark's probe uses it)"},
	{"NATS_URL", "", "none: `serve` requires it; `make run` starts an embedded server",
		"NATS server with JetStream; `serve` requires it set, not reachable: it starts without the broker and connects when it comes (see `/readyz`)"},
	{"EVENTS_DUPLICATE_WINDOW", duration(broker.DefaultDuplicateWindow), "",
		"the events stream's duplicates window: longer than `OUTBOX_CLAIM_HOLD` plus the 5 s publish timeout, so a relay's republish after a crash is dropped by the stream"},
	{"EVENTS_ACK_WAIT", duration(broker.DefaultAckWait), "",
		"how long a delivery may stay unacknowledged; the backoff doubles it per delivery"},
	{"EVENTS_MAX_DELIVER", strconv.Itoa(broker.DefaultMaxDeliver), "", "deliveries before a message is dead-lettered"},
	{"EVENTS_REPLICAS", "1", "",
		"how many NATS servers keep each stream: `3` in a cluster of three, so losing one server loses no acknowledged event (see `docs/deployment.md`)"},
	{"OUTBOX_CLAIM_HOLD", duration(outbox.DefaultClaimHold), "",
		"how long a relay's claim on outbox rows lasts; a dead relay's rows are published by another after it, and a batch publishes for at most four fifths of it"},
	{"MESSAGE_RETENTION", duration(DefaultMessageRetention), "",
		"how long processed message ids and published outbox rows are kept; must exceed the broker's redelivery horizon and the processor's webhook retry span"},
	{"WEBHOOK_SECRETS", "", "none; `make run`: a development secret",
		"comma-separated processor webhook secrets (two during a rotation); none rejects every webhook"},
	{"WEBHOOK_SCHEME", string(webhook.SchemeProcessor), "",
		"how the processor signs webhooks: `processor` (`Processor-Signature: t=...,v1=<hex>`, Stripe's form) or `standard` (Standard Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64>`, with `whsec_<base64>` secrets, checked at start)"},
	{"WEBHOOK_TOLERANCE", duration(webhook.DefaultTolerance), "",
		"how far a webhook signature's timestamp may be from now"},
	{"LOG_LEVEL", "info", "", "`debug`, `info`, `warn`, `error` (JSON logs on stderr)"},
}

// duration writes d as a variable would be set to it: 24h, 2m, 30s.
func duration(d time.Duration) string {
	for _, u := range []struct {
		unit time.Duration
		name string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}} {
		if d%u.unit == 0 {
			return strconv.FormatInt(int64(d/u.unit), 10) + u.name
		}
	}
	return d.String()
}

// defaultText is what the documentation says of a setting's default.
// Backticks mark code.
func (s setting) defaultText() string {
	switch {
	case s.def == "" && s.unset == "":
		return "none"
	case s.def == "":
		return s.unset
	case s.unset == "":
		return "`" + s.def + "`"
	}
	return "`" + s.def + "` (" + s.unset + ")"
}

// configurationHelp is settings as api help prints it, in plain text: each
// variable and its default on one line, its meaning wrapped below.
func configurationHelp() string {
	width := len("VARIABLE")
	for _, s := range settings {
		width = max(width, len(s.name))
	}
	plain := strings.NewReplacer("`", "").Replace
	var b strings.Builder
	b.WriteString("Configuration comes from the environment; a variable unset or empty takes its\n" +
		"default. Durations use Go's syntax (500ms, 2s, 24h).\n\n")
	fmt.Fprintf(&b, "  %-*s  %s\n", width, "VARIABLE", "DEFAULT")
	for _, s := range settings {
		for i, line := range wrap(plain(s.defaultText()), max(20, 76-width)) {
			name := s.name
			if i > 0 {
				name = ""
			}
			fmt.Fprintf(&b, "  %-*s  %s\n", width, name, line)
		}
		for _, line := range wrap(plain(s.about), 72) {
			b.WriteString("      " + line + "\n")
		}
	}
	return b.String()
}

// wrap breaks text into lines of at most width columns, between words (a
// word longer than width gets a line of its own).
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		switch {
		case line == "":
			line = word
		case utf8.RuneCountInString(line)+1+utf8.RuneCountInString(word) <= width:
			line += " " + word
		default:
			lines = append(lines, line)
			line = word
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}

// withDefaults reads a variable from getenv, or its default from settings
// when it is unset or empty. Reading a variable that has no row in settings
// is a programming error, caught by any test that loads the configuration.
func withDefaults(getenv func(string) string) func(string) string {
	defs := make(map[string]string, len(settings))
	for _, s := range settings {
		defs[s.name] = s.def
	}
	return func(name string) string {
		def, ok := defs[name]
		if !ok {
			panic("config.go reads " + name + ", which has no row in settings: add one")
		}
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
}

// directURL is DATABASE_DIRECT_URL, or DATABASE_URL when that is unset.
func (c config) directURL() string {
	if c.DatabaseDirectURL != "" {
		return c.DatabaseDirectURL
	}
	return c.DatabaseURL
}

// loadConfig reads the configuration from getenv; a variable unset or
// empty takes its default from settings.
func loadConfig(getenv func(string) string) (config, error) {
	getenv = withDefaults(getenv)
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
	switch s := getenv("WEBHOOK_SCHEME"); s {
	case string(webhook.SchemeProcessor):
		cfg.WebhookScheme = webhook.SchemeProcessor
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

	// zeroOff: 0 turns the thing off; every other duration must be
	// positive.
	durations := []struct {
		name    string
		dst     *time.Duration
		zeroOff bool
	}{
		{"REQUEST_TIMEOUT", &cfg.RequestTimeout, false},
		{"READ_HEADER_TIMEOUT", &cfg.ReadHeaderTimeout, false},
		{"READ_TIMEOUT", &cfg.ReadTimeout, false},
		{"WRITE_TIMEOUT", &cfg.WriteTimeout, false},
		{"IDLE_TIMEOUT", &cfg.IdleTimeout, false},
		{"SHUTDOWN_TIMEOUT", &cfg.ShutdownTimeout, false},
		{"IDEMPOTENCY_LOCK_TIMEOUT", &cfg.LockTimeout, false},
		{"IDEMPOTENCY_TTL", &cfg.IdempotencyTTL, false},
		{"IDEMPOTENCY_KEY_RETENTION", &cfg.KeyRetention, false},
		{"PAYMENT_LEASE", &cfg.PaymentLease, false},
		{"PROCESSOR_TIMEOUT", &cfg.ProcessorTimeout, false},
		{"PROCESSOR_SETTLE_WINDOW", &cfg.SettleWindow, false},
		{"PROCESSOR_WEBHOOK_RETRY_SPAN", &cfg.WebhookRetrySpan, false},
		{"COMPLETER_INTERVAL", &cfg.CompleterInterval, true},
		{"REAPER_INTERVAL", &cfg.ReaperInterval, true},
		{"AUTH_CACHE_TTL", &cfg.AuthCacheTTL, true},
		{"EVENTS_DUPLICATE_WINDOW", &cfg.Broker.DuplicateWindow, false},
		{"EVENTS_ACK_WAIT", &cfg.Broker.AckWait, false},
		{"OUTBOX_CLAIM_HOLD", &cfg.OutboxClaimHold, false},
		{"MESSAGE_RETENTION", &cfg.MessageRetention, false},
		{"WEBHOOK_TOLERANCE", &cfg.WebhookTolerance, false},
	}
	for _, d := range durations {
		s := getenv(d.name)
		v, err := time.ParseDuration(s)
		if err != nil || v < 0 || (v == 0 && !d.zeroOff) {
			return config{}, fmt.Errorf("%s=%q: want a positive duration such as 2s or 24h", d.name, s)
		}
		*d.dst = v
	}
	// The cross-field rules belong to the packages that rely on them;
	// here they are only given the variables' names.
	if err := (idem.Config{TTL: cfg.IdempotencyTTL, KeyRetention: cfg.KeyRetention}).Check(); err != nil {
		return config{}, fmt.Errorf("IDEMPOTENCY_KEY_RETENTION (%s) must be at least IDEMPOTENCY_TTL (%s): %w", cfg.KeyRetention, cfg.IdempotencyTTL, err)
	}
	timings := payments.Timings{RequestTimeout: cfg.RequestTimeout, ProcessorTimeout: cfg.ProcessorTimeout, Lease: cfg.PaymentLease, SettleWindow: cfg.SettleWindow}
	switch err := timings.Check(); {
	case errors.Is(err, payments.ErrProcessorCallOutlastsRequest):
		return config{}, fmt.Errorf("PROCESSOR_TIMEOUT (%s) must be shorter than REQUEST_TIMEOUT (%s): %w", cfg.ProcessorTimeout, cfg.RequestTimeout, err)
	case errors.Is(err, payments.ErrLeaseWithinProcessorCall):
		return config{}, fmt.Errorf("PAYMENT_LEASE (%s) must be longer than PROCESSOR_TIMEOUT (%s): %w", cfg.PaymentLease, cfg.ProcessorTimeout, err)
	case errors.Is(err, payments.ErrSettleWithinProcessorCall):
		return config{}, fmt.Errorf("PROCESSOR_SETTLE_WINDOW (%s) must be longer than PROCESSOR_TIMEOUT (%s): %w", cfg.SettleWindow, cfg.ProcessorTimeout, err)
	case err != nil:
		return config{}, err
	}
	var err error
	if cfg.Broker.Replicas, err = atLeastOne("EVENTS_REPLICAS", getenv); err != nil || cfg.Broker.Replicas > broker.MaxReplicas {
		return config{}, fmt.Errorf("EVENTS_REPLICAS=%q: want the number of NATS servers that keep each stream, 1 to %d (3 in a cluster of three)", getenv("EVENTS_REPLICAS"), broker.MaxReplicas)
	}
	if cfg.Broker.MaxDeliver, err = atLeastOne("EVENTS_MAX_DELIVER", getenv); err != nil {
		return config{}, fmt.Errorf("%w: want a positive number of deliveries, such as 5", err)
	}
	if err := inbox.CheckRetention(cfg.MessageRetention, cfg.Broker.RedeliveryHorizon(), cfg.WebhookRetrySpan); err != nil {
		return config{}, fmt.Errorf("MESSAGE_RETENTION (%s) must be longer than the broker's redelivery horizon (%s: its backoff over EVENTS_MAX_DELIVER deliveries) and PROCESSOR_WEBHOOK_RETRY_SPAN (%s): %w",
			cfg.MessageRetention, cfg.Broker.RedeliveryHorizon(), cfg.WebhookRetrySpan, err)
	}
	s := getenv("RATE_LIMIT_RPS")
	if cfg.RateLimit.Rate, err = strconv.ParseFloat(s, 64); err != nil || cfg.RateLimit.Rate < 0 || math.IsInf(cfg.RateLimit.Rate, 0) || math.IsNaN(cfg.RateLimit.Rate) {
		return config{}, fmt.Errorf("RATE_LIMIT_RPS=%q: want requests per second and tenant, such as 100 (0 turns the limit off)", s)
	}
	if cfg.RateLimit.Burst, err = atLeastOne("RATE_LIMIT_BURST", getenv); err != nil {
		return config{}, fmt.Errorf("%w: want a positive number of requests, such as 200", err)
	}
	s = getenv("IDEMPOTENCY_KEY_BUDGET")
	if cfg.KeyBudget, err = strconv.ParseInt(s, 10, 64); err != nil || cfg.KeyBudget < 0 {
		return config{}, fmt.Errorf("IDEMPOTENCY_KEY_BUDGET=%q: want how many live keys a tenant may hold, such as 1000000 (0 turns the budget off)", s)
	}
	if cfg.KeyBudget == 0 {
		cfg.KeyBudget = -1
	}
	if cfg.ReaperBatch, err = atLeastOne("REAPER_BATCH", getenv); err != nil {
		return config{}, fmt.Errorf("%w: want a positive number of rows, such as 500", err)
	}
	s = getenv("EVENT_WORKERS")
	if cfg.EventWorkers, err = strconv.ParseBool(s); err != nil {
		return config{}, fmt.Errorf("EVENT_WORKERS=%q: want true or false", s)
	}
	s = getenv("REAPER_DUTY")
	if cfg.ReaperDuty, err = strconv.ParseFloat(s, 64); err != nil || cfg.ReaperDuty <= 0 || cfg.ReaperDuty > 1 {
		return config{}, fmt.Errorf("REAPER_DUTY=%q: want a share of time above 0 and at most 1, such as 0.05", s)
	}
	if cfg.MaxConnections, err = atLeastOne("MAX_CONNECTIONS", getenv); err != nil {
		return config{}, fmt.Errorf("%w: want a positive number, such as 1024", err)
	}
	if cfg.Clients, err = clientaddr.Parse(getenv("TRUSTED_PROXIES"), clientaddr.Header(getenv("TRUSTED_PROXY_HEADER"))); err != nil {
		return config{}, fmt.Errorf("TRUSTED_PROXIES=%q, TRUSTED_PROXY_HEADER=%q: %w", getenv("TRUSTED_PROXIES"), getenv("TRUSTED_PROXY_HEADER"), err)
	}
	s = getenv("LOG_LEVEL")
	if err := cfg.LogLevel.UnmarshalText([]byte(s)); err != nil {
		return config{}, fmt.Errorf("LOG_LEVEL=%q: want debug, info, warn or error", s)
	}
	return cfg, nil
}

// atLeastOne reads the variable name as a whole number of at least 1; its
// error starts with NAME="value".
func atLeastOne(name string, getenv func(string) string) (int, error) {
	s := getenv(name)
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		return 0, fmt.Errorf("%s=%q", name, s)
	}
	return v, nil
}
