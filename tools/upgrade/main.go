// Command upgrade checks that an upgrade needs no downtime (requirement
// G8, make upgrade-test): during a rolling deploy the previous release's
// binary and this one run against one database at once, on the schema this
// one migrated. It builds both binaries, the previous release's from its
// own tree (git archive of the revision, extracted once into the user's
// cache directory, so that the build cache serves it after the first
// time), starts a private PostgreSQL, an embedded NATS with JetStream and
// the processor simulator, then:
//
//  1. migrates the database with this tree's binary (api migrate up);
//  2. creates a tenant with each binary's CLI;
//  3. runs the previous release's api serve against it, and over HTTP
//     creates an order, replays it under its Idempotency-Key (the same
//     bytes, Idempotent-Replayed, one row in orders) and pays it (a final
//     status, one charge at the simulator, the payment row succeeded, the
//     order paid by the events it published and consumed, the webhook
//     applied);
//  4. starts this tree's api serve beside it on the same database, and
//     each replays the other's keys byte for byte, with the tenant the
//     other's CLI made, and refunds the other's payment, while the
//     previous release's reaper prunes keys, the inbox and the outbox on
//     the new schema;
//  5. stops the previous release (SIGTERM) and replays again on this one.
//
// Any ERROR line in either server's log fails it too. Its last line is
//
//	upgrade: ok: ...
//
// Which revision is the previous release: UPGRADE_FROM (or -from) when
// set; else the newest v* tag HEAD descends from; else HEAD when the work
// tree changes an up migration; else the parent of the newest commit that
// added or changed an up migration (previousRelease in rev.go). On a
// shallow clone or outside git it skips, saying why, unless CI is set:
// then it fails. docs/forking.md, "Upgrades without downtime", says the
// rule the migrations follow.
//
// Usage:
//
//	upgrade [-from REV] [-keep] [-v]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "upgrade: FAILED:", err)
		os.Exit(1)
	}
}

type options struct {
	from    string // the previous release's revision; "" applies the rule
	keep    bool   // keep the work directory: logs, binaries, data
	verbose bool
}

func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	o := options{from: getenv("UPGRADE_FROM")}
	fs := flag.NewFlagSet("upgrade", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.from, "from", o.from, "the previous release's revision (default: UPGRADE_FROM, else the rule of docs/forking.md)")
	fs.BoolVar(&o.keep, "keep", false, "keep the work directory (both servers' logs, the binaries, PostgreSQL's data)")
	fs.BoolVar(&o.verbose, "v", false, "print each request and its answer")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return o, nil
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	o, err := parseOptions(args, getenv, os.Stderr)
	if err != nil {
		return err
	}
	err = check(ctx, o, stdout)
	if errors.Is(err, errNoHistory) && !inCI(getenv) {
		fmt.Fprintln(stdout, "upgrade: SKIPPED:", err, "(on CI, with CI set, this fails)")
		return nil
	}
	return err
}
