// Package config is the commands' configuration: the table of the
// environment variables they read (Settings), with each one's default,
// meaning and parser, and the rules between variables (Load). api help
// and docs/configuration.md are printed from the same table.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemref/payments/internal/broker"
	"github.com/idemref/payments/internal/clientaddr"
	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/outbox"
	"github.com/idemref/payments/internal/webhook"

	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/inbox"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/processor/stripeproc"
	"github.com/idemref/payments/internal/reaper"
)

// Config is read from the environment: every variable is a row of
// settings, with its default (docs/configuration.md shows the same table).
type Config struct {
	DatabaseURL string
	// DatabaseDirectURL reaches PostgreSQL without a pooler in
	// transaction mode, for what needs a session of its own (D3): the
	// outbox relay's LISTEN and the migrations' advisory lock. Read it
	// through DirectURL, which falls back to DatabaseURL.
	DatabaseDirectURL string
	Addr              string
	// AdminAddr is the admin listener's address (/metrics, pprof); ""
	// serves neither (G6).
	AdminAddr         string
	RequestTimeout    time.Duration
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration
	// ShutdownGrace is how long a SIGTERM keeps the listener serving
	// after /readyz turned 503, for the load balancer to notice.
	ShutdownGrace time.Duration
	// ShutdownTimeout bounds the wait for the requests in flight once the
	// listener closed, and then again the workers' stop.
	ShutdownTimeout time.Duration
	LockTimeout     time.Duration
	IdempotencyTTL  time.Duration
	// KeyRetention is how long a key's tombstone is kept (E3); at least
	// IdempotencyTTL.
	KeyRetention time.Duration
	// KeyBudget is how many live idempotency keys one tenant may hold
	// (R6); negative: no budget.
	KeyBudget    int64
	PaymentLease time.Duration
	// Processor names the processor adapter (S7): ProcessorSimulator
	// (ProcessorURL) or ProcessorStripe (the Stripe* fields).
	Processor    string
	ProcessorURL string
	// StripeAPIKey, StripeURL and StripeSearchLag configure the Stripe
	// adapter (internal/processor/stripeproc).
	StripeAPIKey     string
	StripeURL        string
	StripeSearchLag  time.Duration
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
	Clients        *clientaddr.Resolver
	trustedProxies string // TRUSTED_PROXIES as set, for TRUSTED_PROXY_HEADER's parser

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
	// PreferWait bounds the duplicates that wait for their key's first
	// attempt under Prefer: wait (L7).
	PreferWait idem.WaitLimits
	// ProblemBaseURL prefixes every problem type URI.
	ProblemBaseURL string
}

// DefaultMessageRetention is MESSAGE_RETENTION's default: a week, far
// beyond the broker's redelivery horizon (30 s doubling over 5 deliveries:
// 15.5 min) and the processor's webhook retries (about 1 h 45 min); a real
// processor such as Stripe retries for up to 3 days, which a week covers
// too.
const DefaultMessageRetention = 7 * 24 * time.Hour

// DefaultProcessorURL is where `go run ./tools/processor` listens: the
// processor of serve and completer when PROCESSOR_URL is unset (dev starts
// its own simulator instead).
const DefaultProcessorURL = "http://localhost:8090"

// The processor adapters PROCESSOR chooses from.
const (
	ProcessorSimulator = "simulator"
	ProcessorStripe    = "stripe"
)

// Setting is one environment variable the configuration reads.
type Setting struct {
	Name string
	// Default is the value Load uses when the variable is unset or
	// empty, written as the variable would be set to it; "" for none.
	Default string
	// unset says what happens without a value where Default does not say it
	// all: in parentheses after Default, or instead of it when Default is "".
	unset string
	// about says what the variable does. Backticks mark code, as in the
	// docs; `api help` prints the text without them.
	about string
	// parse reads the value into the configuration; its error says what
	// is wanted ("want a positive duration such as 2s").
	parse func(c *Config, value string) error
	// Secret: the value is a credential, or a URL that may carry one (its
	// password), so no error, log line or trace shows it (R8): an error
	// names the variable and what is wrong with the value (flaws), never
	// a character of it, and a log line shows a URL redacted.
	Secret bool
}

// The values of Setting.Secret, as the Settings table reads.
const (
	shown  = false
	hidden = true
)

// Settings is every environment variable the configuration reads, with its
// default and meaning: the one source of the defaults (Load applies
// Default), of `api help`'s configuration text and of the table in
// docs/configuration.md, which TestConfigurationTableInDocs holds to it.
var Settings = []Setting{
	{"DATABASE_URL", "", "none: `serve` requires it; `make run` starts its own",
		"`postgres://user:pass@host:5432/db?sslmode=...`; pool settings such as `pool_max_conns` go in the URL",
		postgresURL(func(c *Config) *string { return &c.DatabaseURL }), hidden},
	{"DATABASE_DIRECT_URL", "", "the value of `DATABASE_URL`",
		"PostgreSQL without a pooler in transaction mode, for what needs a session: the outbox relay's `LISTEN` and the migrations' advisory lock; set it when `DATABASE_URL` goes through PgBouncer (see `docs/deployment.md`)",
		postgresURL(func(c *Config) *string { return &c.DatabaseDirectURL }), hidden},
	{"ADDR", ":8080", "", "listen address",
		text(func(c *Config) *string { return &c.Addr }), shown},
	{"ADMIN_ADDR", "", "off: neither `/metrics` nor pprof is served; `make run` uses a port of 127.0.0.1",
		"the admin listener: `/metrics` for Prometheus and `/debug/pprof/`, unauthenticated, so only on the operator's network, such as `127.0.0.1:9090` or a port only the scraper reaches (the public listener serves neither)",
		hostPort(func(c *Config) *string { return &c.AdminAddr }), shown},
	{"REQUEST_TIMEOUT", "20s", "",
		"deadline of each request, database work and the processor call included (expired: rolled back or released, 503); must exceed `PROCESSOR_TIMEOUT`",
		positive(func(c *Config) *time.Duration { return &c.RequestTimeout }), shown},
	{"IDEMPOTENCY_LOCK_TIMEOUT", duration(idem.DefaultLockTimeout), "",
		"longest wait of a duplicate behind an uncommitted claim before its 409",
		positive(func(c *Config) *time.Duration { return &c.LockTimeout }), shown},
	{"IDEMPOTENCY_TTL", duration(idem.DefaultTTL), "", "how long a key's exact response is replayed",
		positive(func(c *Config) *time.Duration { return &c.IdempotencyTTL }), shown},
	{"IDEMPOTENCY_KEY_RETENTION", duration(idem.DefaultKeyRetention), "",
		"how long the key's tombstone is kept after that (from creation; at least the TTL)",
		positive(func(c *Config) *time.Duration { return &c.KeyRetention }), shown},
	{"REAPER_INTERVAL", duration(reaper.DefaultInterval), "",
		"how often `serve` prunes and deletes expired records; `0` turns it off (`api reap` runs it alone)",
		orOff(func(c *Config) *time.Duration { return &c.ReaperInterval }), shown},
	{"REAPER_BATCH", strconv.Itoa(reaper.DefaultBatch), "", "rows per reaper batch",
		atLeastOne(func(c *Config) *int { return &c.ReaperBatch }, "a positive number of rows, such as 500"), shown},
	{"REAPER_DUTY", strconv.FormatFloat(reaper.DefaultDuty, 'f', -1, 64), "",
		"the share of its time the reaper spends in batches: higher reaps faster and costs live traffic more; while batches keep coming back full it doubles it, up to 0.5, until one comes back short",
		parseReaperDuty, shown},
	{"PROCESSOR", ProcessorSimulator, "",
		"the payment processor's adapter: `simulator` (ours, at `PROCESSOR_URL`) or `stripe` (Stripe through stripe-go, with `STRIPE_API_KEY`; see `docs/payments.md`)",
		parseProcessor, shown},
	{"PROCESSOR_URL", "", "`serve` and `completer`: `" + DefaultProcessorURL + "`; `make run`: its own simulator",
		"the payment processor (`go run ./tools/processor` serves the simulator at `" + DefaultProcessorURL + "`)",
		parseProcessorURL, hidden},
	{"STRIPE_API_KEY", "", "none: `PROCESSOR=stripe` requires it",
		"Stripe's secret key (`sk_test_...` for test mode, `sk_live_...`, or a restricted `rk_...` key allowed to write PaymentIntents and Refunds); set only with `PROCESSOR=stripe`",
		parseStripeAPIKey, hidden},
	{"STRIPE_API_URL", stripeproc.DefaultURL, "",
		"Stripe's API base URL; tests point it at stripe-mock or at recorded answers",
		parseStripeURL, hidden},
	{"STRIPE_SEARCH_LAG", duration(stripeproc.DefaultSearchLag), "",
		"how long Stripe's Search API may not show a new PaymentIntent (Stripe documents under a minute); added to `PROCESSOR_SETTLE_WINDOW` for Stripe, since an empty search is no proof before it passed",
		positive(func(c *Config) *time.Duration { return &c.StripeSearchLag }), shown},
	{"PROCESSOR_TIMEOUT", duration(processor.DefaultTimeout), "", "timeout of one processor call",
		positive(func(c *Config) *time.Duration { return &c.ProcessorTimeout }), shown},
	{"PROCESSOR_WEBHOOK_RETRY_SPAN", duration(processor.DefaultWebhookRetrySpan), "",
		"how long the processor keeps retrying a webhook, by its own schedule (Stripe's: 3 days; the simulator's: under 2 h); `MESSAGE_RETENTION` must exceed it",
		positive(func(c *Config) *time.Duration { return &c.WebhookRetrySpan }), shown},
	{"PROCESSOR_SETTLE_WINDOW", duration(payments.DefaultSettleWindow), "",
		"how long after a processor call it may still land (the processor's longest execution, with room to spare; the simulator's is 30 s); no call is resent and nothing recorded as final until it has passed with nothing found; must exceed `PROCESSOR_TIMEOUT`",
		positive(func(c *Config) *time.Duration { return &c.SettleWindow }), shown},
	{"PAYMENT_LEASE", duration(idem.DefaultLease), "",
		"how long a payment attempt owns its key before a retry or the completer may take over; must exceed `PROCESSOR_TIMEOUT`",
		positive(func(c *Config) *time.Duration { return &c.PaymentLease }), shown},
	{"COMPLETER_INTERVAL", "5s", "",
		"how often `serve` looks for abandoned payments and runs the reconciliation sweep; `0` turns the in-process completer off (`api completer` runs it alone)",
		orOff(func(c *Config) *time.Duration { return &c.CompleterInterval }), shown},
	{"READ_HEADER_TIMEOUT", "5s", "", "`http.Server.ReadHeaderTimeout`",
		positive(func(c *Config) *time.Duration { return &c.ReadHeaderTimeout }), shown},
	{"READ_TIMEOUT", "15s", "", "`http.Server.ReadTimeout`",
		positive(func(c *Config) *time.Duration { return &c.ReadTimeout }), shown},
	{"WRITE_TIMEOUT", "30s", "", "`http.Server.WriteTimeout`",
		positive(func(c *Config) *time.Duration { return &c.WriteTimeout }), shown},
	{"IDLE_TIMEOUT", "120s", "", "`http.Server.IdleTimeout`",
		positive(func(c *Config) *time.Duration { return &c.IdleTimeout }), shown},
	{"SHUTDOWN_GRACE", "5s", "`make run`: `0`",
		"on SIGTERM (or SIGINT), how long the listener keeps serving after `/readyz` turned 503, so that the load balancer stops sending first: as long as it takes to stop (Kubernetes: a few seconds for a terminating pod to leave its Service; a balancer that learns from health checks: their interval times the failures it needs); `0` closes the listener at once (see `docs/deployment.md`)",
		orOff(func(c *Config) *time.Duration { return &c.ShutdownGrace }), shown},
	{"SHUTDOWN_TIMEOUT", "15s", "",
		"after the grace, how long the requests in flight may take to finish (what still runs then is cut, and its retry recovers it), and then again the longest the outbox relay, the consumer, the completer and the reaper may take to stop at a safe point",
		positive(func(c *Config) *time.Duration { return &c.ShutdownTimeout }), shown},
	{"RATE_LIMIT_RPS", strconv.FormatFloat(httpapi.DefaultRateLimit, 'f', -1, 64), "",
		"requests per second per tenant and process; `0` turns the limit off",
		parseRateLimit, shown},
	{"RATE_LIMIT_BURST", strconv.Itoa(httpapi.DefaultRateBurst), "", "requests a tenant may send at once",
		atLeastOne(func(c *Config) *int { return &c.RateLimit.Burst }, "a positive number of requests, such as 200"), shown},
	{"PREFER_WAIT_MAX", duration(httpapi.DefaultPreferWaitMax), "",
		"the longest a duplicate that sends `Prefer: wait=N` waits for its key's first attempt in flight before its `409` (a larger N is capped to it, and `Preference-Applied` says the wait given); less than `REQUEST_TIMEOUT`; `0` honours no wait",
		orOff(func(c *Config) *time.Duration { return &c.PreferWait.Max }), shown},
	{"PREFER_WAIT_PER_TENANT", strconv.Itoa(httpapi.DefaultPreferWaitPerTenant), "",
		"duplicates of one tenant that may wait at once in one process; past it the duplicate gets its `409` at once",
		atLeastOne(func(c *Config) *int { return &c.PreferWait.PerTenant }, "a positive number of requests, such as 64"), shown},
	{"PREFER_WAIT_PER_PROCESS", strconv.Itoa(httpapi.DefaultPreferWaitPerProcess), "",
		"duplicates that may wait at once in one process, all tenants together; past it the duplicate gets its `409` at once",
		atLeastOne(func(c *Config) *int { return &c.PreferWait.PerProcess }, "a positive number of requests, such as 256"), shown},
	{"PROBLEM_BASE_URL", httpapi.DefaultProblemBaseURL, "",
		"prefix of every problem's `type`, followed by its code with `-` for `_`; the default is this API's own page of problem types (`/docs/problems`), served by every process: set an absolute URL of it (`https://api.example.com/docs/problems#`) or of a deployment's own documentation",
		problemBase, shown},
	{"IDEMPOTENCY_KEY_BUDGET", strconv.Itoa(idem.DefaultKeyBudget), "",
		"how many live idempotency keys one tenant may hold (R6); past it a request with a new key is `429 idempotency_key_budget_exceeded`; `0` turns the budget off",
		parseKeyBudget, shown},
	{"AUTH_CACHE_TTL", "10s", "",
		"how long an API key that authenticated is trusted without a lookup, so also how long a revoked key keeps working in a process that cached it (see `docs/operations.md`); `0` looks up every request",
		orOff(func(c *Config) *time.Duration { return &c.AuthCacheTTL }), shown},
	{"MAX_CONNECTIONS", "1024", "", "open connections one process accepts at a time; one client address holds at most a quarter of them, a trusted proxy any number",
		atLeastOne(func(c *Config) *int { return &c.MaxConnections }, "a positive number, such as 1024"), shown},
	{"TRUSTED_PROXIES", "", "none: every client is its TCP peer",
		"comma-separated addresses or CIDR ranges of the proxies or load balancers in front of the API (such as `10.0.0.0/8`); from these peers only, the client is read from `TRUSTED_PROXY_HEADER` for the per-client budgets, and they are not held to one address's share of `MAX_CONNECTIONS` (see `docs/deployment.md`)",
		parseTrustedProxies, shown},
	{"TRUSTED_PROXY_HEADER", string(clientaddr.XForwardedFor), "",
		"the header the trusted proxies write the client's address into: `X-Forwarded-For` or `Forwarded` (RFC 7239); read from the right, past every trusted proxy, so what a client wrote there itself is ignored",
		parseTrustedProxyHeader, shown},
	{"EVENT_WORKERS", "true", "",
		"`serve` runs the outbox relay and the orders consumer; `false` leaves them to the other API processes (the load benchmark's probe uses it)",
		parseEventWorkers, shown},
	{"NATS_URL", "", "none: `serve` requires it; `make run` starts an embedded server",
		"NATS server with JetStream, `nats://host:4222` (a cluster's servers comma-separated; `tls://`, `ws://` and `wss://` too); `serve` requires it set, not reachable: it starts without the broker and connects when it comes (see `/readyz`)",
		parseNatsURL, hidden},
	{"EVENTS_DUPLICATE_WINDOW", duration(broker.DefaultDuplicateWindow), "",
		"the events stream's duplicates window: longer than `OUTBOX_CLAIM_HOLD` plus the 5 s publish timeout, so a relay's republish after a crash is dropped by the stream",
		positive(func(c *Config) *time.Duration { return &c.Broker.DuplicateWindow }), shown},
	{"EVENTS_ACK_WAIT", duration(broker.DefaultAckWait), "",
		"how long a delivery may stay unacknowledged; the backoff doubles it per delivery",
		positive(func(c *Config) *time.Duration { return &c.Broker.AckWait }), shown},
	{"EVENTS_MAX_DELIVER", strconv.Itoa(broker.DefaultMaxDeliver), "", "deliveries before a message is dead-lettered",
		atLeastOne(func(c *Config) *int { return &c.Broker.MaxDeliver }, "a positive number of deliveries, such as 5"), shown},
	{"EVENTS_REPLICAS", "1", "",
		"how many NATS servers keep each stream: `3` in a cluster of three, so losing one server loses no acknowledged event (see `docs/deployment.md`)",
		parseEventsReplicas, shown},
	{"OUTBOX_CLAIM_HOLD", duration(outbox.DefaultClaimHold), "",
		"how long a relay's claim on outbox rows lasts; a dead relay's rows are published by another after it, and a batch publishes for at most four fifths of it",
		positive(func(c *Config) *time.Duration { return &c.OutboxClaimHold }), shown},
	{"MESSAGE_RETENTION", duration(DefaultMessageRetention), "",
		"how long processed message ids and published outbox rows are kept; must exceed the broker's redelivery horizon and the processor's webhook retry span",
		positive(func(c *Config) *time.Duration { return &c.MessageRetention }), shown},
	{"WEBHOOK_SECRETS", "", "none; `make run`: a development secret",
		"comma-separated processor webhook secrets (two during a rotation); none rejects every webhook",
		parseWebhookSecrets, hidden},
	{"WEBHOOK_SCHEME", string(webhook.SchemeProcessor), "",
		"how the processor signs webhooks: `processor` (`Processor-Signature: t=...,v1=<hex>`, Stripe's form) or `standard` (Standard Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64>`, with `whsec_<base64>` secrets, checked at start)",
		parseWebhookScheme, shown},
	{"WEBHOOK_TOLERANCE", duration(webhook.DefaultTolerance), "",
		"how far a webhook signature's timestamp may be from now",
		positive(func(c *Config) *time.Duration { return &c.WebhookTolerance }), shown},
	{"LOG_LEVEL", "info", "", "`debug`, `info`, `warn`, `error` (JSON logs on stderr)",
		parseLogLevel, shown},
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

// DefaultText is what the documentation says of a setting's default.
// Backticks mark code.
func (s Setting) DefaultText() string {
	switch {
	case s.Default == "" && s.unset == "":
		return "none"
	case s.Default == "":
		return s.unset
	case s.unset == "":
		return "`" + s.Default + "`"
	}
	return "`" + s.Default + "` (" + s.unset + ")"
}

// Meaning is what the documentation says a setting does: about, and for
// a secret that it is never printed.
func (s Setting) Meaning() string {
	if s.Secret {
		return s.about + "; secret: never printed"
	}
	return s.about
}

// Help is Settings as api help prints it, in plain text: each
// variable and its default on one line, its meaning wrapped below.
func Help() string {
	width := len("VARIABLE")
	for _, s := range Settings {
		width = max(width, len(s.Name))
	}
	plain := strings.NewReplacer("`", "").Replace
	var b strings.Builder
	b.WriteString("Configuration comes from the environment; a variable unset or empty takes its\n" +
		"default. Durations use Go's syntax (500ms, 2s, 24h).\n\n")
	fmt.Fprintf(&b, "  %-*s  %s\n", width, "VARIABLE", "DEFAULT")
	for _, s := range Settings {
		for i, line := range wrap(plain(s.DefaultText()), max(20, 76-width)) {
			name := s.Name
			if i > 0 {
				name = ""
			}
			fmt.Fprintf(&b, "  %-*s  %s\n", width, name, line)
		}
		for _, line := range wrap(plain(s.Meaning()), 72) {
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

// DirectURL is DATABASE_DIRECT_URL, or DATABASE_URL when that is unset.
func (c Config) DirectURL() string {
	if c.DatabaseDirectURL != "" {
		return c.DatabaseDirectURL
	}
	return c.DatabaseURL
}

// Load reads the configuration from getenv: each variable in
// settings' order, unset or empty taking its default, parsed by its own
// row; then the rules between variables, each kept by the package that
// relies on it.
func Load(getenv func(string) string) (Config, error) {
	var cfg Config
	for _, s := range Settings {
		v := getenv(s.Name)
		if v == "" {
			v = s.Default
		}
		if err := s.parse(&cfg, v); err != nil {
			if s.Secret {
				return Config{}, fmt.Errorf("%s: %w%s", s.Name, err, flaws(v))
			}
			return Config{}, fmt.Errorf("%s=%q: %w", s.Name, v, err)
		}
	}
	return cfg, cfg.check()
}

// flaws says what is off in a secret's value without a character of it:
// the usual ways a value read from a file or pasted goes wrong. "" when
// none is seen.
func flaws(v string) string {
	var found []string
	trimmed := strings.TrimSpace(v)
	switch {
	case strings.HasSuffix(v, "\n"):
		found = append(found, "a trailing newline")
	case strings.TrimRightFunc(v, unicode.IsSpace) != v:
		found = append(found, "trailing white space")
	}
	if strings.TrimLeftFunc(v, unicode.IsSpace) != v {
		found = append(found, "leading white space")
	}
	if strings.ContainsFunc(trimmed, unicode.IsSpace) {
		found = append(found, "white space inside")
	}
	if len(trimmed) >= 2 && strings.ContainsRune(`"'`, rune(trimmed[0])) && trimmed[len(trimmed)-1] == trimmed[0] {
		found = append(found, "quotes around it")
	}
	if strings.ContainsFunc(v, func(r rune) bool { return unicode.IsControl(r) && !unicode.IsSpace(r) }) {
		found = append(found, "control characters")
	}
	if len(found) == 0 {
		return ""
	}
	return "; the value has " + strings.Join(found, " and ")
}

// check applies the rules between variables; here they are only given
// the variables' names.
func (cfg Config) check() error {
	if err := (idem.Config{TTL: cfg.IdempotencyTTL, KeyRetention: cfg.KeyRetention}).Check(); err != nil {
		return fmt.Errorf("IDEMPOTENCY_KEY_RETENTION (%s) must be at least IDEMPOTENCY_TTL (%s): %w", cfg.KeyRetention, cfg.IdempotencyTTL, err)
	}
	timings := payments.Timings{RequestTimeout: cfg.RequestTimeout, ProcessorTimeout: cfg.ProcessorTimeout, Lease: cfg.PaymentLease, SettleWindow: cfg.SettleWindow}
	switch err := timings.Check(); {
	case errors.Is(err, payments.ErrProcessorCallOutlastsRequest):
		return fmt.Errorf("PROCESSOR_TIMEOUT (%s) must be shorter than REQUEST_TIMEOUT (%s): %w", cfg.ProcessorTimeout, cfg.RequestTimeout, err)
	case errors.Is(err, payments.ErrLeaseWithinProcessorCall):
		return fmt.Errorf("PAYMENT_LEASE (%s) must be longer than PROCESSOR_TIMEOUT (%s): %w", cfg.PaymentLease, cfg.ProcessorTimeout, err)
	case errors.Is(err, payments.ErrSettleWithinProcessorCall):
		return fmt.Errorf("PROCESSOR_SETTLE_WINDOW (%s) must be longer than PROCESSOR_TIMEOUT (%s): %w", cfg.SettleWindow, cfg.ProcessorTimeout, err)
	case err != nil:
		return err
	}
	if err := cfg.checkProcessor(); err != nil {
		return err
	}
	if cfg.PreferWait.Max >= cfg.RequestTimeout {
		return fmt.Errorf("PREFER_WAIT_MAX (%s) must be shorter than REQUEST_TIMEOUT (%s): a wait must end before the request's deadline", cfg.PreferWait.Max, cfg.RequestTimeout)
	}
	if cfg.AdminAddr != "" && cfg.AdminAddr == cfg.Addr && !strings.HasSuffix(cfg.Addr, ":0") { // :0 is two free ports
		return fmt.Errorf("ADMIN_ADDR (%s) must differ from ADDR: the admin listener is a port of its own, off the public one", cfg.AdminAddr)
	}
	if err := inbox.CheckRetention(cfg.MessageRetention, cfg.Broker.RedeliveryHorizon(), cfg.WebhookRetrySpan); err != nil {
		return fmt.Errorf("MESSAGE_RETENTION (%s) must be longer than the broker's redelivery horizon (%s: its backoff over EVENTS_MAX_DELIVER deliveries) and PROCESSOR_WEBHOOK_RETRY_SPAN (%s): %w",
			cfg.MessageRetention, cfg.Broker.RedeliveryHorizon(), cfg.WebhookRetrySpan, err)
	}
	return nil
}

// checkProcessor holds the processor's settings together: each adapter
// gets what it needs, and no Stripe key is ever ignored.
func (cfg Config) checkProcessor() error {
	switch {
	case cfg.Processor == ProcessorStripe && cfg.StripeAPIKey == "":
		return errors.New("PROCESSOR=stripe needs STRIPE_API_KEY: set it to your Stripe secret key (sk_test_... for test mode)")
	case cfg.Processor == ProcessorSimulator && cfg.StripeAPIKey != "":
		return errors.New("STRIPE_API_KEY is set but PROCESSOR is simulator: set PROCESSOR=stripe to charge through Stripe, or unset STRIPE_API_KEY")
	case cfg.Processor == ProcessorStripe && cfg.WebhookScheme == webhook.SchemeStandard:
		return errors.New("PROCESSOR=stripe signs webhooks with Stripe-Signature: set WEBHOOK_SCHEME=processor (the default) and WEBHOOK_SECRETS to the endpoint's signing secret (whsec_...)")
	}
	return nil
}

// The parsers of settings: each reads one value into its field, or says
// what it wants.

func text(field func(*Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error {
		*field(c) = v
		return nil
	}
}

// postgresURL reads a PostgreSQL URL, or "" (unset), checked as pgx
// reads it, so that its error comes now, naming the variable, and says
// nothing of the URL (db.ParseConfig).
func postgresURL(field func(*Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error {
		if v != "" {
			if _, err := db.ParseConfig(v); err != nil {
				return err
			}
		}
		*field(c) = v
		return nil
	}
}

// hostPort reads a listen address such as 127.0.0.1:9090 or :9090, or
// "" (off).
func hostPort(field func(*Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error {
		if _, port, err := net.SplitHostPort(v); v != "" && (err != nil || port == "") {
			return errors.New("want a listen address host:port, such as 127.0.0.1:9090 or :9090")
		}
		*field(c) = v
		return nil
	}
}

var errWantDuration = errors.New("want a positive duration such as 2s or 24h")

// positive reads a duration above zero.
func positive(field func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return errWantDuration
		}
		*field(c) = d
		return nil
	}
}

// orOff reads a duration of zero (which turns the thing off) or more.
func orOff(field func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return errors.New("want a positive duration such as 2s or 24h, or 0 to turn it off")
		}
		*field(c) = d
		return nil
	}
}

// atLeastOne reads a whole number of at least 1; want says what it counts.
func atLeastOne(field func(*Config) *int, want string) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return errors.New("want " + want)
		}
		*field(c) = n
		return nil
	}
}

func parseReaperDuty(c *Config, v string) (err error) {
	if c.ReaperDuty, err = strconv.ParseFloat(v, 64); err != nil || c.ReaperDuty <= 0 || c.ReaperDuty > 1 {
		return errors.New("want a share of time above 0 and at most 1, such as 0.05")
	}
	return nil
}

// problemBase reads PROBLEM_BASE_URL: an absolute http(s) URL, or a path
// of this API (the default), which a client resolves against the URL it
// called.
func problemBase(c *Config, v string) error {
	u, err := url.Parse(v)
	if err != nil || (u.Scheme == "" && !strings.HasPrefix(v, "/")) || (u.Scheme != "" && u.Scheme != "http" && u.Scheme != "https") || (u.Scheme != "" && u.Host == "") {
		return errors.New("want an absolute http(s) URL or a path, such as https://api.example.com/docs/problems#")
	}
	c.ProblemBaseURL = v
	return nil
}

func parseRateLimit(c *Config, v string) (err error) {
	r := &c.RateLimit.Rate
	if *r, err = strconv.ParseFloat(v, 64); err != nil || *r < 0 || math.IsInf(*r, 0) || math.IsNaN(*r) {
		return errors.New("want requests per second and tenant, such as 100 (0 turns the limit off)")
	}
	return nil
}

func parseKeyBudget(c *Config, v string) (err error) {
	if c.KeyBudget, err = strconv.ParseInt(v, 10, 64); err != nil || c.KeyBudget < 0 {
		return errors.New("want how many live keys a tenant may hold, such as 1000000 (0 turns the budget off)")
	}
	if c.KeyBudget == 0 {
		c.KeyBudget = -1
	}
	return nil
}

// parseTrustedProxies checks the list; TRUSTED_PROXY_HEADER, read next,
// builds the resolver from it.
func parseTrustedProxies(c *Config, v string) error {
	if _, err := clientaddr.Parse(v, clientaddr.XForwardedFor); err != nil {
		return err
	}
	c.trustedProxies = v
	return nil
}

func parseTrustedProxyHeader(c *Config, v string) (err error) {
	c.Clients, err = clientaddr.Parse(c.trustedProxies, clientaddr.Header(v))
	return err
}

func parseEventWorkers(c *Config, v string) (err error) {
	if c.EventWorkers, err = strconv.ParseBool(v); err != nil {
		return errors.New("want true or false")
	}
	return nil
}

func parseEventsReplicas(c *Config, v string) (err error) {
	if c.Broker.Replicas, err = strconv.Atoi(v); err != nil || c.Broker.Replicas < 1 || c.Broker.Replicas > broker.MaxReplicas {
		return fmt.Errorf("want the number of NATS servers that keep each stream, 1 to %d (3 in a cluster of three)", broker.MaxReplicas)
	}
	return nil
}

func parseWebhookSecrets(c *Config, v string) error {
	for sec := range strings.SplitSeq(v, ",") {
		if sec = strings.TrimSpace(sec); sec != "" {
			c.WebhookSecrets = append(c.WebhookSecrets, sec)
		}
	}
	return nil
}

// parseWebhookScheme reads the scheme, and checks the secrets read before
// it against it.
func parseWebhookScheme(c *Config, v string) error {
	switch v {
	case string(webhook.SchemeProcessor):
		c.WebhookScheme = webhook.SchemeProcessor
	case string(webhook.SchemeStandard):
		c.WebhookScheme = webhook.SchemeStandard
		for _, sec := range c.WebhookSecrets {
			if _, err := webhook.StandardKey(sec); err != nil {
				return errors.New("with WEBHOOK_SCHEME=standard each of WEBHOOK_SECRETS is whsec_ followed by the base64 of at least 16 bytes, as the processor shows it")
			}
		}
	default:
		return errors.New("want processor (Processor-Signature, the default) or standard (Standard Webhooks)")
	}
	return nil
}

func parseLogLevel(c *Config, v string) error {
	if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
		return errors.New("want debug, info, warn or error")
	}
	return nil
}

func parseProcessor(c *Config, v string) error {
	if v != ProcessorSimulator && v != ProcessorStripe {
		return errors.New("want simulator (the processor simulator at PROCESSOR_URL) or stripe (Stripe, with STRIPE_API_KEY)")
	}
	c.Processor = v
	return nil
}

// parseStripeAPIKey reads a secret or restricted key. A publishable key
// (pk_) cannot charge, and a key with white space was pasted wrong, or
// read from a file with its newline; Load's error says which.
func parseStripeAPIKey(c *Config, v string) error {
	switch {
	case v == "":
	case strings.HasPrefix(v, "pk_"):
		return errors.New("want a Stripe secret key beginning sk_test_ or sk_live_, or a restricted key rk_ (a publishable pk_ key cannot charge)")
	case !strings.HasPrefix(v, "sk_") && !strings.HasPrefix(v, "rk_"):
		return errors.New("want a Stripe secret key beginning sk_test_ or sk_live_, or a restricted key rk_ (this one begins otherwise)")
	case strings.ContainsFunc(v, unicode.IsSpace):
		return errors.New("want a Stripe secret key beginning sk_test_ or sk_live_, or a restricted key rk_, without white space")
	}
	c.StripeAPIKey = v
	return nil
}

// baseURL reads an http or https URL with a host: a processor's.
func baseURL(v string) (*url.URL, bool) {
	u, err := url.Parse(v)
	return u, err == nil && (u.Scheme == "https" || u.Scheme == "http") && u.Host != ""
}

// parseProcessorURL reads the simulator's URL, or "" (the default of each
// command): checked now, since net/http's error for a URL it cannot parse
// quotes it, and a password with it.
func parseProcessorURL(c *Config, v string) error {
	if _, ok := baseURL(v); v != "" && !ok {
		return errors.New("want the processor's base URL, such as " + DefaultProcessorURL)
	}
	c.ProcessorURL = v
	return nil
}

// parseNatsURL reads NATS_URL as nats.Connect does: comma-separated
// servers. Checked now, since the client's error for a URL it cannot
// parse quotes it. The scheme is required, though the client would add
// nats:// itself: without it a value set by mistake, a token, would be
// taken for a host name, and logged.
func parseNatsURL(c *Config, v string) error {
	if v == "" {
		return nil
	}
	for server := range strings.SplitSeq(v, ",") {
		u, err := url.Parse(strings.TrimSpace(server))
		if err != nil || !slices.Contains([]string{"nats", "tls", "ws", "wss"}, u.Scheme) || u.Hostname() == "" {
			return errors.New("want NATS servers such as nats://host:4222, comma-separated, a user or password in one percent-encoded")
		}
	}
	c.NatsURL = v
	return nil
}

func parseStripeURL(c *Config, v string) error {
	if u, ok := baseURL(v); !ok || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return errors.New("want a base URL such as https://api.stripe.com or http://127.0.0.1:12111 (stripe-mock), without a path")
	}
	c.StripeURL = v
	return nil
}
