// Command api runs the payments API and its operator tasks:
//
//	api serve                  run the HTTP server, the outbox relay and the
//	                           orders consumer (DATABASE_URL and NATS_URL
//	                           required)
//	api dev                    development mode: a private PostgreSQL when
//	                           DATABASE_URL is unset, an embedded NATS when
//	                           NATS_URL is unset, migrations, a demo tenant
//	                           and ready-to-paste curl commands
//	api completer              finish abandoned payments and run the
//	                           reconciliation sweep (also runs inside serve)
//	api reap [--loop]          prune expired idempotency results to tombstones
//	                           and delete tombstones past retention, once
//	                           (printing the counts) or every REAPER_INTERVAL
//	                           until SIGINT (also runs inside serve)
//	api migrate up             apply every migration not yet applied
//	api migrate down N|--all   roll back the last N migrations, or all of
//	                           them (every table and row: never by default)
//	api tenant create NAME     create a tenant; prints its API key last
//	api tenant list            list the tenants: id, creation, live and all
//	                           keys, name
//	api key create TENANT      another key for the tenant (by name or id),
//	                           printed last and only once; the other keys
//	                           keep working (rotation with overlap)
//	api key list TENANT        the tenant's keys by id (the first 8 hex
//	                           digits of the key's SHA-256, never the key):
//	                           created, last used, revoked
//	api key revoke TENANT KEYID [--force]
//	                           revoke a key; every API process refuses it
//	                           within AUTH_CACHE_TTL. Revoking a revoked key
//	                           says so and succeeds; the tenant's last live
//	                           key needs --force
//	api deadletters list       list the events consumers gave up on
//	api deadletters redrive    publish each of them again to its subject,
//	                           under its message id, unless the consumers'
//	                           inbox says it was applied or cannot vouch
//	                           for it (NATS_URL and DATABASE_URL required)
//	api version                print the module version, the VCS revision,
//	                           its time and whether the tree was modified,
//	                           and the Go version (also payments_build_info
//	                           on /metrics)
//
// Configuration comes from the environment: api help lists every variable
// with its default and meaning (docs/configuration.md has the same table).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemref/payments/internal/config"
	"github.com/idemref/payments/internal/logging"
	"github.com/idemref/payments/internal/tracing"
)

const usage = `usage:
  api serve                 run the HTTP server, the outbox relay and the orders consumer (DATABASE_URL, NATS_URL)
  api dev                   development mode (private PostgreSQL and embedded NATS when DATABASE_URL, NATS_URL are unset)
  api completer             finish abandoned payments, run the reconciliation sweep (serve also runs one)
  api reap [--loop]         prune expired idempotency keys once, or until SIGINT with --loop (serve also runs one)
  api migrate up            apply every database migration not yet applied
  api migrate down N        roll back the last N migrations
  api migrate down --all    roll back every migration: drops every table and row
  api help                  this text (also -h, --help, and -h after any command)
  api version               print the module version, VCS revision and time, modified flag and Go version
  api tenant create NAME    create a tenant and print its API key
  api tenant list           list the tenants with their key counts
  api key create TENANT     create another API key for the tenant (name or id) and print it, once
  api key list TENANT       list the tenant's keys by id (never the key): created, last used, revoked
  api key revoke TENANT KEYID [--force]
                            revoke a key: refused everywhere within AUTH_CACHE_TTL; the last live key needs --force
  api deadletters list      list the events consumers gave up on (NATS_URL)
  api deadletters redrive   publish them again to their subjects, under their message ids, once their cause is fixed; one the inbox says was applied is removed, one it can no longer vouch for is refused (NATS_URL, DATABASE_URL)
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "api:", err)
		if errors.Is(err, errUsage) {
			fmt.Fprint(os.Stderr, usage)
			os.Exit(2)
		}
		os.Exit(1)
	}
}

var errUsage = errors.New("invalid command line")

// errNoDatabaseURL is what every command that needs PostgreSQL says
// without it.
var errNoDatabaseURL = errors.New("DATABASE_URL is not set: point it at PostgreSQL, such as postgres://user:password@host:5432/payments (for a zero-setup local run use 'make run')")

// commandLineError says what is wrong with args, which no case of run
// accepted; main prints the usage after it.
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
		fmt.Fprint(stdout, usage, "\n", config.Help())
		return nil
	}
	// Nor does the version: it is the binary's, whatever the environment.
	if args[0] == "version" {
		if len(args) > 1 {
			return commandLineError(args)
		}
		printVersion(stdout, readBuildVersion())
		return nil
	}
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	logger := logging.New(stderr, cfg.LogLevel)
	// Traces (X3), when OpenTelemetry's variables ask for them: flushed
	// once the command returned, after the drain of serve.
	shutdownTracing, err := tracing.Setup(ctx, getenv, readBuildVersion().Version)
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
	switch cmd, rest := args[0], args[1:]; {
	case cmd == "serve" && len(rest) == 0:
		if cfg.DatabaseURL == "" {
			return errNoDatabaseURL
		}
		if cfg.NatsURL == "" {
			return errors.New("NATS_URL is not set: serve publishes events to and consumes them from NATS JetStream (for a zero-setup local run use 'make run')")
		}
		if cfg.ProcessorURL == "" {
			cfg.ProcessorURL = config.DefaultProcessorURL
		}
		return serve(ctx, cfg, logger, nil)
	case cmd == "completer" && len(rest) == 0:
		if cfg.DatabaseURL == "" {
			return errNoDatabaseURL
		}
		if cfg.ProcessorURL == "" {
			cfg.ProcessorURL = config.DefaultProcessorURL
		}
		return runCompleter(ctx, cfg, logger)
	case cmd == "reap" && (len(rest) == 0 || len(rest) == 1 && rest[0] == "--loop"):
		if cfg.DatabaseURL == "" {
			return errNoDatabaseURL
		}
		return runReaper(ctx, cfg, logger, len(rest) == 1, stdout)
	case cmd == "dev" && len(rest) == 0:
		if getenv("SHUTDOWN_GRACE") == "" {
			cfg.ShutdownGrace = 0 // no load balancer to wait for: Ctrl-C stops at once
		}
		return dev(ctx, cfg, logger, stdout)
	case cmd == "migrate" && len(rest) == 1 && rest[0] == "up":
		if cfg.DatabaseURL == "" {
			return errNoDatabaseURL
		}
		return migrate(ctx, cfg.DirectURL(), "up", 0, logger)
	case cmd == "migrate" && len(rest) >= 1 && rest[0] == "down":
		// Rolling back everything drops every table and row: it is never
		// what a bare "down" does.
		steps := -1
		if len(rest) != 2 {
			return fmt.Errorf("%w: migrate down needs how many migrations to roll back (N) or --all", errUsage)
		}
		if rest[1] != "--all" {
			n, err := strconv.Atoi(rest[1])
			if err != nil || n < 1 {
				return fmt.Errorf("%w: migrate down %q: want a positive number of migrations or --all", errUsage, rest[1])
			}
			steps = n
		}
		if cfg.DatabaseURL == "" {
			return errNoDatabaseURL
		}
		return migrate(ctx, cfg.DirectURL(), "down", steps, logger)
	case cmd == "tenant" && len(rest) == 2 && rest[0] == "create":
		if cfg.DatabaseURL == "" {
			return errNoDatabaseURL
		}
		return createTenant(ctx, cfg.DatabaseURL, rest[1], stdout)
	case cmd == "tenant" && len(rest) == 1 && rest[0] == "list":
		if cfg.DatabaseURL == "" {
			return errNoDatabaseURL
		}
		return tenantList(ctx, cfg.DatabaseURL, stdout)
	case cmd == "key" && len(rest) == 2 && rest[0] == "create":
		if cfg.DatabaseURL == "" {
			return errNoDatabaseURL
		}
		return keyCreate(ctx, cfg.DatabaseURL, rest[1], stdout)
	case cmd == "key" && len(rest) == 2 && rest[0] == "list":
		if cfg.DatabaseURL == "" {
			return errNoDatabaseURL
		}
		return keyList(ctx, cfg.DatabaseURL, rest[1], stdout)
	case cmd == "key" && len(rest) >= 1 && rest[0] == "revoke":
		args, force := withoutFlag(rest[1:], "--force")
		if len(args) != 2 {
			break
		}
		if cfg.DatabaseURL == "" {
			return errNoDatabaseURL
		}
		return keyRevoke(ctx, cfg.DatabaseURL, args[0], args[1], force, cfg.AuthCacheTTL, stdout)
	case cmd == "deadletters" && len(rest) == 1 && (rest[0] == "list" || rest[0] == "redrive"):
		if cfg.NatsURL == "" {
			return errors.New("NATS_URL is not set: the dead letters are in NATS JetStream")
		}
		return deadLetters(ctx, cfg, rest[0], stdout)
	}
	return commandLineError(args)
}
