// Command api runs the payments API and its operator tasks: serve, dev,
// completer, reap, migrate, tenant, key, deadletters and version. api help
// prints the usage, from the table of commands below, and every variable
// of the configuration with its default and meaning (docs/configuration.md
// has the same table).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemref/payments/internal/buildinfo"
	"github.com/idemref/payments/internal/config"
	"github.com/idemref/payments/internal/logging"
	"github.com/idemref/payments/internal/opscli"
	"github.com/idemref/payments/internal/tracing"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "api:", err)
		if errors.Is(err, errUsage) {
			fmt.Fprint(os.Stderr, usage())
			os.Exit(2)
		}
		os.Exit(1)
	}
}

var errUsage = errors.New("invalid command line")

// errNoDatabaseURL is what every command that needs PostgreSQL says
// without it.
var errNoDatabaseURL = errors.New("DATABASE_URL is not set: point it at PostgreSQL, such as postgres://user:password@host:5432/payments (for a zero-setup local run use 'make run')")

// env is what a command runs with: the configuration, the logger, the
// environment (for what a command reads beyond the configuration) and
// stdout.
type env struct {
	cfg    config.Config
	logger *slog.Logger
	getenv func(string) string
	stdout io.Writer
}

// command is one line of the usage and what run does with it.
type command struct {
	synopsis string // as the usage shows it: api key create TENANT
	about    string
	// words name the command: the first arguments, such as key create.
	words []string
	// args reports whether the arguments after words are the command's;
	// nil: it takes none.
	args func(rest []string) bool
	// database: the command needs DATABASE_URL, and says so without it.
	database bool
	// run runs it, after the configuration was read; rest are the
	// arguments after words. nil for help, which needs no configuration
	// (run answers it first).
	run func(ctx context.Context, e env, rest []string) error
	// bare, instead of run, runs it without reading the configuration:
	// what it prints is the binary's, whatever the environment.
	bare func(stdout io.Writer)
}

// commands are the commands run knows, in the usage's order.
var commands = []command{
	{synopsis: "api serve", about: "run the HTTP server, the outbox relay and the orders consumer (DATABASE_URL, NATS_URL)",
		words: []string{"serve"}, database: true, run: runServe},
	{synopsis: "api dev", about: "development mode (private PostgreSQL and embedded NATS when DATABASE_URL, NATS_URL are unset)",
		words: []string{"dev"}, run: runDev},
	{synopsis: "api completer", about: "finish abandoned payments, run the reconciliation sweep (serve also runs one)",
		words: []string{"completer"}, database: true, run: func(ctx context.Context, e env, _ []string) error {
			if e.cfg.ProcessorURL == "" {
				e.cfg.ProcessorURL = config.DefaultProcessorURL
			}
			return runCompleter(ctx, e.cfg, e.logger)
		}},
	{synopsis: "api reap [--loop]", about: "prune expired idempotency keys once, or until SIGINT with --loop (serve also runs one)",
		words: []string{"reap"}, database: true,
		args: func(rest []string) bool { return len(rest) == 0 || len(rest) == 1 && rest[0] == "--loop" },
		run: func(ctx context.Context, e env, rest []string) error {
			return opscli.RunReaper(ctx, e.cfg, e.logger, len(rest) == 1, e.stdout)
		}},
	{synopsis: "api migrate up", about: "apply every database migration not yet applied",
		words: []string{"migrate", "up"}, database: true, run: func(ctx context.Context, e env, _ []string) error {
			return opscli.Migrate(ctx, e.cfg.DirectURL(), "up", 0, e.logger)
		}},
	{synopsis: "api migrate down N", about: "roll back the last N migrations",
		words: []string{"migrate", "down"}, database: true,
		args: func(rest []string) bool { return len(rest) == 1 && migrationCount(rest[0]) > 0 },
		run: func(ctx context.Context, e env, rest []string) error {
			return opscli.Migrate(ctx, e.cfg.DirectURL(), "down", migrationCount(rest[0]), e.logger)
		}},
	// Rolling back everything drops every table and row: it is never what
	// a bare "down" does.
	{synopsis: "api migrate down --all", about: "roll back every migration: drops every table and row",
		words: []string{"migrate", "down", "--all"}, database: true, run: func(ctx context.Context, e env, _ []string) error {
			return opscli.Migrate(ctx, e.cfg.DirectURL(), "down", -1, e.logger)
		}},
	{synopsis: "api help", about: "this text (also -h, --help, and -h after any command)", words: []string{"help"}},
	{synopsis: "api version", about: "print the module version, VCS revision and time, modified flag and Go version",
		words: []string{"version"}, bare: func(stdout io.Writer) { buildinfo.Print(stdout, buildinfo.Read()) }},
	{synopsis: "api tenant create NAME", about: "create a tenant and print its API key",
		words: []string{"tenant", "create"}, args: oneArgument, database: true, run: func(ctx context.Context, e env, rest []string) error {
			return opscli.CreateTenant(ctx, e.cfg.DatabaseURL, rest[0], e.stdout)
		}},
	{synopsis: "api tenant list", about: "list the tenants with their key counts",
		words: []string{"tenant", "list"}, database: true, run: func(ctx context.Context, e env, _ []string) error {
			return opscli.TenantList(ctx, e.cfg.DatabaseURL, e.stdout)
		}},
	{synopsis: "api key create TENANT", about: "create another API key for the tenant (name or id) and print it, once",
		words: []string{"key", "create"}, args: oneArgument, database: true, run: func(ctx context.Context, e env, rest []string) error {
			return opscli.KeyCreate(ctx, e.cfg.DatabaseURL, rest[0], e.stdout)
		}},
	{synopsis: "api key list TENANT", about: "list the tenant's keys by id (never the key): created, last used, revoked",
		words: []string{"key", "list"}, args: oneArgument, database: true, run: func(ctx context.Context, e env, rest []string) error {
			return opscli.KeyList(ctx, e.cfg.DatabaseURL, rest[0], e.stdout)
		}},
	{synopsis: "api key revoke TENANT KEYID [--force]", about: "revoke a key: refused everywhere within AUTH_CACHE_TTL; the last live key needs --force",
		words: []string{"key", "revoke"}, database: true,
		args: func(rest []string) bool { args, _ := withoutFlag(rest, "--force"); return len(args) == 2 },
		run: func(ctx context.Context, e env, rest []string) error {
			args, force := withoutFlag(rest, "--force")
			return opscli.KeyRevoke(ctx, e.cfg.DatabaseURL, args[0], args[1], force, e.cfg.AuthCacheTTL, e.stdout)
		}},
	{synopsis: "api deadletters list", about: "list the events consumers gave up on (NATS_URL)",
		words: []string{"deadletters", "list"}, run: deadLettersCommand("list")},
	{synopsis: "api deadletters redrive", about: "publish them again to their subjects, under their message ids, once their cause is fixed; one the inbox says was applied is removed, one it can no longer vouch for is refused (NATS_URL, DATABASE_URL)",
		words: []string{"deadletters", "redrive"}, run: deadLettersCommand("redrive")},
}

// usage is the commands' synopses and what each does, a line each (a
// long synopsis on a line of its own).
func usage() string {
	const width = 25
	var b strings.Builder
	b.WriteString("usage:\n")
	for _, c := range commands {
		if len(c.synopsis) > width {
			fmt.Fprintf(&b, "  %s\n  %-*s %s\n", c.synopsis, width, "", c.about)
			continue
		}
		fmt.Fprintf(&b, "  %-*s %s\n", width, c.synopsis, c.about)
	}
	return b.String()
}

// lookup finds the command args name and accept, and the arguments after
// its words; nil when there is none.
func lookup(args []string) (*command, []string) {
	for i := range commands {
		c := &commands[i]
		rest, ok := cutWords(args, c.words)
		if ok && (c.args == nil && len(rest) == 0 || c.args != nil && c.args(rest)) {
			return c, rest
		}
	}
	return nil, nil
}

// cutWords returns args after words, and whether args begin with them.
func cutWords(args, words []string) ([]string, bool) {
	if len(args) < len(words) || !slices.Equal(args[:len(words)], words) {
		return nil, false
	}
	return args[len(words):], true
}

// oneArgument: the command takes one argument, such as a tenant's name.
func oneArgument(rest []string) bool { return len(rest) == 1 }

// migrationCount is N of migrate down N, or 0 when it is not a positive
// number.
func migrationCount(arg string) int {
	n, err := strconv.Atoi(arg)
	if err != nil || n < 1 {
		return 0
	}
	return n
}

// commandLineError says what is wrong with args, which no command
// accepts; main prints the usage after it.
func commandLineError(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: no command given", errUsage)
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve", "dev", "completer", "version":
		return fmt.Errorf("%w: %s takes no arguments, got %q", errUsage, cmd, strings.Join(rest, " "))
	case "reap":
		return fmt.Errorf("%w: reap takes --loop or nothing, got %q", errUsage, strings.Join(rest, " "))
	case "migrate":
		if len(rest) >= 1 && rest[0] == "down" {
			if len(rest) != 2 {
				return fmt.Errorf("%w: migrate down needs how many migrations to roll back (N) or --all", errUsage)
			}
			return fmt.Errorf("%w: migrate down %q: want a positive number of migrations or --all", errUsage, rest[1])
		}
		return fmt.Errorf("%w: migrate needs up, down N or down --all, got %q", errUsage, strings.Join(rest, " "))
	case "tenant":
		if len(rest) == 1 && rest[0] == "create" {
			return fmt.Errorf("%w: tenant create needs the tenant's name: api tenant create acme", errUsage)
		}
		if len(rest) > 1 && rest[0] == "list" {
			return fmt.Errorf("%w: tenant list takes no arguments, got %q", errUsage, strings.Join(rest[1:], " "))
		}
		return fmt.Errorf("%w: tenant needs create NAME or list, got %q", errUsage, strings.Join(rest, " "))
	case "key":
		if len(rest) >= 1 && (rest[0] == "create" || rest[0] == "list") {
			return fmt.Errorf("%w: key %s needs the tenant's name or id (one argument): api key %s acme", errUsage, rest[0], rest[0])
		}
		if len(rest) >= 1 && rest[0] == "revoke" {
			return fmt.Errorf("%w: key revoke needs the tenant's name or id and the key's id as api key list shows it, got %q: api key revoke acme 1a2b3c4d", errUsage, strings.Join(rest[1:], " "))
		}
		return fmt.Errorf("%w: key needs create TENANT, list TENANT or revoke TENANT KEYID, got %q", errUsage, strings.Join(rest, " "))
	case "deadletters":
		return fmt.Errorf("%w: deadletters needs list or redrive, got %q", errUsage, strings.Join(rest, " "))
	}
	return fmt.Errorf("%w: unknown command %q", errUsage, cmd)
}

// withoutFlag returns args without flag, and whether it was there.
func withoutFlag(args []string, flag string) ([]string, bool) {
	var out []string
	found := false
	for _, a := range args {
		if a == flag {
			found = true
			continue
		}
		out = append(out, a)
	}
	return out, found
}

// wantsHelp: "api help", or -h / --help anywhere on the line.
func wantsHelp(args []string) bool {
	if args[0] == "help" {
		return true
	}
	for _, a := range args {
		if a == "-h" || a == "--help" || a == "-help" {
			return true
		}
	}
	return false
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return commandLineError(args)
	}
	// Help needs no configuration: it also explains a broken one.
	if wantsHelp(args) {
		fmt.Fprint(stdout, usage(), "\n", config.Help())
		return nil
	}
	// Nor does the version: it is the binary's, whatever the environment.
	c, rest := lookup(args)
	switch {
	case c != nil && c.bare != nil:
		c.bare(stdout)
		return nil
	case c == nil && slices.ContainsFunc(commands, func(c command) bool { return c.bare != nil && c.words[0] == args[0] }):
		return commandLineError(args)
	}
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	logger := logging.New(stderr, cfg.LogLevel)
	// Traces (X3), when OpenTelemetry's variables ask for them: flushed
	// once the command returned, after the drain of serve.
	shutdownTracing, err := tracing.Setup(ctx, getenv, buildinfo.Read().Version)
	if err != nil {
		return err
	}
	defer func() {
		flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdownTracing(flushCtx); err != nil {
			logger.Warn("tracing: flush the last spans", slog.Any("error", err))
		}
	}()
	switch {
	case c == nil:
		return commandLineError(args)
	case c.database && cfg.DatabaseURL == "":
		return errNoDatabaseURL
	}
	return c.run(ctx, env{cfg: cfg, logger: logger, getenv: getenv, stdout: stdout}, rest)
}

// runServe is api serve: NATS_URL is required, and the processor is the
// simulator's default address when PROCESSOR_URL is unset.
func runServe(ctx context.Context, e env, _ []string) error {
	if e.cfg.NatsURL == "" {
		return errors.New("NATS_URL is not set: serve publishes events to and consumes them from NATS JetStream (for a zero-setup local run use 'make run')")
	}
	if e.cfg.ProcessorURL == "" {
		e.cfg.ProcessorURL = config.DefaultProcessorURL
	}
	return serve(ctx, e.cfg, e.logger, nil)
}

// runDev is api dev.
func runDev(ctx context.Context, e env, _ []string) error {
	if e.getenv("SHUTDOWN_GRACE") == "" {
		e.cfg.ShutdownGrace = 0 // no load balancer to wait for: Ctrl-C stops at once
	}
	return dev(ctx, e.cfg, e.logger, e.stdout)
}

// deadLettersCommand is api deadletters action: the dead letters are in
// NATS JetStream.
func deadLettersCommand(action string) func(context.Context, env, []string) error {
	return func(ctx context.Context, e env, _ []string) error {
		if e.cfg.NatsURL == "" {
			return errors.New("NATS_URL is not set: the dead letters are in NATS JetStream")
		}
		if action == "redrive" && e.cfg.DatabaseURL == "" {
			return fmt.Errorf("%w (redrive asks the consumers' inbox whether each event was applied)", errNoDatabaseURL)
		}
		return opscli.DeadLetters(ctx, e.cfg, action, e.stdout)
	}
}
