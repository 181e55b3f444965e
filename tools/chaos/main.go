package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/idemref/payments/internal/broker"
)

// eventsStream is the stream the relay publishes to.
const eventsStream = broker.StreamEvents

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(1)
	}
}

// options are the command line's.
type options struct {
	short   bool
	seed    uint64
	only    *regexp.Regexp
	keep    bool
	verbose bool
}

func parseOptions(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var only string
	fs.BoolVar(&o.short, "short", false, "the short mode: the scenarios CI runs, with shorter loads and faults")
	fs.Uint64Var(&o.seed, "seed", 0, "seed of every random choice (0: a new one, printed)")
	fs.StringVar(&only, "run", "", "run the scenarios whose id or name matches this regular expression (with -short too: -short then only shortens them)")
	fs.BoolVar(&o.keep, "keep", false, "keep the work directory (logs, data directories) instead of removing it")
	fs.BoolVar(&o.verbose, "v", false, "log the harness's progress")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	re, err := regexp.Compile(only)
	if err != nil {
		return o, fmt.Errorf("-run: %w", err)
	}
	o.only = re
	if o.seed == 0 {
		o.seed = rand.Uint64()
	}
	return o, nil
}

// selects says whether s runs: -run picks by id or name; without it the
// short mode runs its own set and the long mode every scenario.
func (o options) selects(s scenario) bool {
	if o.only.String() != "" {
		return o.only.MatchString(s.id + " " + s.name)
	}
	return s.short || !o.short
}

// outcome is one scenario's result.
type outcome struct {
	s      scenario
	res    checkResult
	outage time.Duration
	p99    time.Duration
	notes  []string
	// answers counts every attempt's answer by status ("none": no answer
	// at all), so a reader sees the fault was felt; resolved counts the
	// operations whose unknown outcome a same-key retry resolved as a
	// replay (D2).
	answers  string
	resolved int
	// notReady is how long the first API's /readyz answered 503.
	notReady time.Duration
	// alerts is what the monitor paged during the scenario.
	alerts alertOutcome
	err    error
}

// passed: the checker found nothing, or for the negative control, found
// the losses it must.
func (o outcome) passed() bool {
	if o.err != nil || !o.alerts.passed() {
		return false
	}
	if o.s.control {
		return o.res.Lost > 0
	}
	return o.res.Lost == 0 && o.res.Duplicated == 0 && o.res.DoubleCharged == 0 && o.res.Unresolved == 0 && len(o.res.Problems) == 0
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	o, err := parseOptions(args, os.Stderr)
	if err != nil {
		return err
	}
	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	work, err := os.MkdirTemp("", "chaos-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Fprintln(stdout, "work directory (kept):", work)
	} else {
		defer os.RemoveAll(work)
	}
	// PostgreSQL runs as its own account, which must reach its data.
	if err := os.Chmod(work, 0o755); err != nil {
		return err
	}
	mode := "long"
	if o.short {
		mode = "short"
	}
	fmt.Fprintf(stdout, "chaos: %s mode, seed %d (repeat with -seed %d)\n", mode, o.seed, o.seed)
	fmt.Fprintln(stdout, "building cmd/api and tools/processor ...")
	bins, err := buildBinaries(work)
	if err != nil {
		return err
	}

	var outcomes []outcome
	for i, s := range scenarios() {
		if !o.selects(s) {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		fmt.Fprintf(stdout, "\n[%s] %s: %s\n", s.id, s.name, s.about)
		out := runScenario(ctx, o, s, o.seed+uint64(i), work, bins, log)
		printOutcome(stdout, out)
		outcomes = append(outcomes, out)
	}
	return summarize(stdout, outcomes)
}

// runScenario deploys, loads, injects the fault, stops the load, and
// checks.
func runScenario(ctx context.Context, o options, s scenario, seed uint64, work string, bins binaries, log *slog.Logger) (out outcome) {
	out.s = s
	d, err := deploy(ctx, work, bins, deployOptions{Async: s.async, APIs: s.apis, Log: log})
	if err != nil {
		out.err = fmt.Errorf("deploy: %w", err)
		return out
	}
	defer d.stop()
	mon, err := startMonitor(ctx, filepath.Join(d.work, "monitor"), d.adminAddrs, s.alerts.broken)
	if err != nil {
		out.err = fmt.Errorf("monitor: %w", err)
		return out
	}
	defer mon.stop()
	startup, err := mon.settle(ctx, len(d.adminAddrs))
	if err != nil {
		out.err = fmt.Errorf("monitor: %w", err)
		return out
	}
	r := &faultRun{d: d, rng: rand.New(rand.NewPCG(seed, seed>>1)), long: !o.short}

	probeCtx, stopProbe := context.WithCancel(ctx)
	defer stopProbe()
	readiness := probeReadiness(probeCtx, d.apiURLs[0])
	led := newLedger()
	loadCtx, stopLoad := context.WithCancel(ctx)
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		runLoad(loadCtx, loadConfig{
			APIs: d.apiURLs, APIKey: d.apiKey, Clients: 16, Seed: int64(seed),
			Payments: true, DeclineEvery: 7, RetryFor: 60 * time.Second,
		}, led)
	}()
	warm := 3 * time.Second
	if r.long {
		warm = 10 * time.Second
	}
	sleep(ctx, warm)
	faultStart := time.Now()
	if err := s.fault(ctx, r); err != nil {
		out.err = fmt.Errorf("fault: %w", err)
	}
	faultEnd := time.Now()
	sleep(ctx, warm)
	stopLoad()
	<-loaded
	out.outage = led.Outage(faultStart, faultEnd.Add(warm))
	out.p99 = led.P99(faultStart, faultEnd)
	out.notes = r.notes
	if len(startup) > 0 {
		out.notes = append(out.notes, fmt.Sprintf("fired while the monitor started, before the scenario's clock (not judged): %s", strings.Join(startup, ", ")))
	}
	out.answers = answerCounts(led.Operations())
	out.resolved = led.UnknownResolved()
	out.notReady = readiness.NotReady()

	// The negative control never comes to rest (its lost inbox rows leave
	// events applied nowhere): waiting long for it proves nothing more.
	wait := 90 * time.Second
	if s.control {
		wait = 20 * time.Second
	}
	out.res = check(ctx, d.check, d.processorURL, led, wait)
	out.alerts = watchResolved(ctx, s.alerts.inMode(r.long), mon, faultStart)
	return out
}

// watchResolved waits until every alert the scenario fired has resolved
// (at most resolveWait) and judges what the monitor saw.
func watchResolved(ctx context.Context, spec alertSpec, mon *monitor, faultStart time.Time) alertOutcome {
	waitCtx, cancel := context.WithTimeout(ctx, resolveWait)
	mon.pages.waitResolved(waitCtx)
	cancel()
	return judgeAlerts(spec, mon.pages.snapshot(), faultStart)
}

func printOutcome(w io.Writer, o outcome) {
	verdict := "PASS"
	if !o.passed() {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "  %s: acked=%d lost=%d duplicated=%d double_charged=%d unresolved=%d outage=%.1fs p99_during_fault=%dms\n",
		verdict, o.res.Acked, o.res.Lost, o.res.Duplicated, o.res.DoubleCharged, o.res.Unresolved,
		o.outage.Seconds(), o.p99.Milliseconds())
	fmt.Fprintf(w, "  answers: %s; unknown outcomes resolved by a same-key replay: %d; /readyz of api0 answered 503 for %.1fs\n",
		o.answers, o.resolved, o.notReady.Seconds())
	printAlerts(w, o.alerts)
	for _, n := range o.notes {
		fmt.Fprintln(w, "  note:", n)
	}
	if o.err != nil {
		fmt.Fprintln(w, "  error:", o.err)
	}
	for _, p := range o.res.Problems {
		fmt.Fprintln(w, "  problem:", p)
	}
}

// answerCounts counts the attempts' answers by status, in status order,
// such as "201=812 402=40 503=13 none=2".
func answerCounts(ops []loadOp) string {
	counts := map[int]int{}
	for _, op := range ops {
		for _, st := range op.Statuses {
			counts[st]++
		}
	}
	statuses := slices.Sorted(maps.Keys(counts))
	parts := make([]string, 0, len(statuses))
	for _, st := range statuses {
		name := strconv.Itoa(st)
		if st == 0 {
			name = "none"
		}
		parts = append(parts, fmt.Sprintf("%s=%d", name, counts[st]))
	}
	return strings.Join(parts, " ")
}

// summarize prints the table and the last line, and fails when a
// scenario failed.
func summarize(w io.Writer, outcomes []outcome) error {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tresult\tacked\tlost\tduplicated\tdouble charged\tunresolved\toutage s\tp99 ms\t")
	var failed, acked, lost, duplicated, double int
	var alerts alertTotals
	var control *outcome
	for i, o := range outcomes {
		verdict := "pass"
		if !o.passed() {
			verdict = "FAIL"
			failed++
		}
		fmt.Fprintf(tw, "%s %s\t%s\t%d\t%d\t%d\t%d\t%d\t%.1f\t%d\t\n", o.s.id, o.s.name, verdict,
			o.res.Acked, o.res.Lost, o.res.Duplicated, o.res.DoubleCharged, o.res.Unresolved, o.outage.Seconds(), o.p99.Milliseconds())
		alerts.add(o.alerts)
		if o.s.control {
			control = &outcomes[i]
			continue
		}
		acked += o.res.Acked
		lost += o.res.Lost
		duplicated += o.res.Duplicated
		double += o.res.DoubleCharged
	}
	_ = tw.Flush()
	printAlertTable(w, outcomes)
	for _, o := range outcomes {
		if b := o.alerts.spec.broken; b != nil {
			fmt.Fprintf(w, "chaos: negative control of the alerts %s: %s with %s misspelled: missed=%q (%s: it must be reported missed)\n",
				o.s.name, b.alert, b.metric, o.alerts.missed, map[bool]string{true: "passed", false: "FAILED"}[o.alerts.passed()])
		}
	}
	if control != nil {
		fmt.Fprintf(w, "chaos: negative control %s: lost=%d (%s: it must find losses)\n", control.s.name, control.res.Lost,
			map[bool]string{true: "passed", false: "FAILED"}[control.passed()])
	}
	fmt.Fprintf(w, "chaos: scenarios=%d failed=%d acked=%d lost=%d duplicated=%d double_charged=%d alerts_expected=%d alerts_fired=%d alerts_missed=%d false_pages=%d\n",
		len(outcomes), failed, acked, lost, duplicated, double, alerts.expected, alerts.fired, alerts.missed, alerts.falsePages)
	if failed > 0 {
		return errors.New("a scenario failed")
	}
	if len(outcomes) == 0 {
		return errors.New("no scenario matched")
	}
	return nil
}
