package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/idemref/payments/internal/tooling/harness"
)

// scenario is one kind of request's figures, one entry per round.
type scenario struct {
	rps, p50, p99 series
	requests      int // answered as expected, over all rounds
}

func (s *scenario) add(r outcome) {
	s.rps = append(s.rps, r.rps())
	s.p50 = append(s.p50, ms(harness.Percentile(r.latencies, 50)))
	s.p99 = append(s.p99, ms(harness.Percentile(r.latencies, 99)))
	s.requests += r.ok
}

type results struct {
	create, baseline, replay, get, payment scenario
	claimFirst, fiber, fiberPlain          scenario // the peers (peers.go)
	paymentBaseline                        scenario // POST /v1/_baseline/payments
	crash                                  map[string]*crashResult
	traced                                 scenario // create on the traced API (tracing.go)
	tracedSpans, tracedCreateSpans         int      // what the sink received during the traced creates
	untracedCreateSpans                    int      // ... during the untraced ones: must stay 0
	tracedRSSPeak                          int64
	stormP99                               series
	stormExecutions, stormReplays          int
	stormInProgress, storms                int
	paymentsRanOut                         bool
	costs                                  probeCosts
	rssPeak, rssEnd                        int64
	charges, succeeded                     int
}

// measureAll runs a warm-up round (not reported), the rounds, the probe
// and the final checks.
func measureAll(ctx context.Context, o options, env *environment, stdout io.Writer) (*results, error) {
	l := newLoad(env.loadURL, env.apiKey, env.runID, env.db, max(o.concurrency, o.storm)+8)
	if err := l.setupReplays(ctx, o.replayKeys); err != nil {
		return nil, err
	}
	traced := &tracedSide{load: newLoad(env.tracedURL, env.apiKey, env.runID+"-traced", env.db, o.concurrency+8), sink: env.sink}
	// The Fiber peer's load: its own client, so that its connections are
	// to its process; the same run id keeps its references apart.
	fiber := newLoad(env.fiberURL, env.apiKey, env.runID+"-fiber", env.db, o.concurrency+8)
	res := &results{}
	warm := &results{}
	if err := oneRound(ctx, o, l, traced, fiber, warm, max(o.duration/4, 250*time.Millisecond), 0); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	for i := 1; i <= o.rounds; i++ {
		if err := oneRound(ctx, o, l, traced, fiber, res, o.duration, i); err != nil {
			return nil, fmt.Errorf("round %d: %w", i, err)
		}
		last := func(s series) float64 { return s[len(s)-1] }
		fmt.Fprintf(stdout, "round %d/%d: create %.0f/s, traced %.0f/s, baseline %.0f/s, claim-first %.0f/s, fiber %.0f/s, fiber-plain %.0f/s, replay %.0f/s, get %.0f/s, payment %.0f/s, payment-baseline %.0f/s, storm p99 %.1f ms; traced / create %.2f, p99 %.2f\n",
			i, o.rounds, last(res.create.rps), last(res.traced.rps), last(res.baseline.rps), last(res.claimFirst.rps), last(res.fiber.rps), last(res.fiberPlain.rps),
			last(res.replay.rps), last(res.get.rps), last(res.payment.rps), last(res.paymentBaseline.rps), last(res.stormP99),
			last(res.traced.rps)/last(res.create.rps), last(res.traced.p99)/last(res.create.p99))
	}

	// The crash test, after the rounds, so that its restarts disturb none.
	var err error
	if res.crash, err = crashTest(ctx, env, l, o.crashTrials); err != nil {
		return nil, err
	}

	if res.rssPeak, res.rssEnd, err = memory(env.loadAPI); err != nil {
		return nil, err
	}
	if res.tracedRSSPeak, _, err = memory(env.tracedAPI); err != nil {
		return nil, err
	}

	p := &probe{base: env.probeURL, apiKey: env.apiKey, proxy: env.proxy, load: l, client: &http.Client{Timeout: 30 * time.Second}}
	if res.costs, err = p.run(ctx, 3, o.samples, env.unusedKeys); err != nil {
		return nil, err
	}

	// Exactly one charge at the processor per succeeded payment (S2):
	// the probe's payments included.
	if res.charges, err = executedCharges(ctx, env.processorURL); err != nil {
		return nil, err
	}
	if res.succeeded, err = l.count(ctx, countPayments); err != nil {
		return nil, err
	}
	if res.charges != res.succeeded {
		return nil, fmt.Errorf("the processor executed %d charges for %d succeeded payments", res.charges, res.succeeded)
	}
	return res, nil
}

// tracedSide is the traced API's load and the sink of its spans.
type tracedSide struct {
	load *load
	sink *spanSink
}

// oneRound runs every scenario once. Create, baseline, the traced create
// and the peers' creates take turns at going first, second, and so on from
// one round to the next, so that none always runs on the warmer (or
// fuller) database.
func oneRound(ctx context.Context, o options, l *load, traced *tracedSide, fiber *load, res *results, d time.Duration, round int) error {
	r := &roundRun{ctx: ctx, o: o, l: l, traced: traced, fiber: fiber, res: res, d: d, ids: &orderIDs{}}
	steps := r.creates()
	first := round % len(steps)
	steps = slices.Concat(steps[first:], steps[:first])
	payments := r.payments()
	steps = append(steps, r.replay, r.get,
		// The payment and its baseline take turns at going first.
		payments[round%2],
		payments[(round+1)%2],
		r.storm,
	)
	for _, step := range steps {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// roundRun is one round of oneRound: each step runs a scenario for d at
// o's concurrency and adds its figures to res. ids are the orders the
// round's untraced creates made, for the reads and payments after them.
type roundRun struct {
	ctx    context.Context
	o      options
	l      *load
	traced *tracedSide
	fiber  *load
	res    *results
	d      time.Duration
	ids    *orderIDs
}

// creates are the create scenarios: ours, the baseline, the traced create
// and the peers'.
func (r *roundRun) creates() []func() error {
	return []func() error{
		func() error {
			out, spans, err := r.traced.sink.withSpans(r.ctx, "create", false, func() (outcome, error) {
				return r.l.create(r.ctx, r.o.concurrency, r.d, r.ids)
			})
			r.res.create.add(out)
			r.res.untracedCreateSpans += spans.createSpans
			return err
		},
		func() error {
			out, err := r.l.baseline(r.ctx, r.o.concurrency, r.d, r.ids)
			r.res.baseline.add(out)
			return err
		},
		func() error {
			// The traced creates' orders are not the round's: the
			// scenarios that follow read and pay the untraced API's.
			out, spans, err := r.traced.sink.withSpans(r.ctx, "traced", true, func() (outcome, error) {
				return r.traced.load.createOn(r.ctx, "traced", "/v1/orders", true, r.o.concurrency, r.d, &orderIDs{})
			})
			r.res.traced.add(out)
			r.res.tracedSpans += spans.spans
			r.res.tracedCreateSpans += spans.createSpans
			return err
		},
		func() error {
			out, err := r.l.createOn(r.ctx, peerClaimFirst, "/v1/_claimfirst/orders", true, r.o.concurrency, r.d, &orderIDs{})
			r.res.claimFirst.add(out)
			return err
		},
		func() error {
			out, err := r.fiber.fiberCreate(r.ctx, peerFiber, true, r.o.concurrency, r.d)
			r.res.fiber.add(out)
			return err
		},
		func() error {
			out, err := r.fiber.fiberCreate(r.ctx, "fiber-plain", false, r.o.concurrency, r.d)
			r.res.fiberPlain.add(out)
			return err
		},
	}
}

// payments are the payment and its baseline.
func (r *roundRun) payments() []func() error {
	return []func() error{
		func() error {
			out, ranOut, err := r.l.payment(r.ctx, r.o.concurrency, r.d, r.ids)
			r.res.payment.add(out)
			r.res.paymentsRanOut = r.res.paymentsRanOut || ranOut
			return err
		},
		func() error {
			out, ranOut, err := r.l.paymentBaseline(r.ctx, r.o.concurrency, r.d, r.ids)
			r.res.paymentBaseline.add(out)
			r.res.paymentsRanOut = r.res.paymentsRanOut || ranOut
			return err
		},
	}
}

// replay resends the setup's requests under their keys.
func (r *roundRun) replay() error {
	out, err := r.l.replay(r.ctx, r.o.concurrency, r.d)
	r.res.replay.add(out)
	return err
}

// get reads the round's orders.
func (r *roundRun) get() error {
	out, err := r.l.get(r.o.concurrency, r.d, r.ids)
	r.res.get.add(out)
	return err
}

// storm sends identical requests under one key at once.
func (r *roundRun) storm() error {
	s, err := r.l.storm(r.ctx, r.o.storm)
	r.res.stormP99 = append(r.res.stormP99, ms(s.p99))
	r.res.stormExecutions += s.executions
	r.res.stormReplays += s.replays
	r.res.stormInProgress += s.inProgress
	r.res.storms++
	return err
}

// executedCharges counts the charges the simulator executed (deduplicated
// calls excluded).
func executedCharges(ctx context.Context, processorURL string) (int, error) {
	calls, err := harness.ProcessorCalls(ctx, processorURL)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, c := range calls {
		if c.Method == http.MethodPost && c.Path == "/v1/charges" && c.Executed && !c.Replayed {
			n++
		}
	}
	return n, nil
}

// peerFigures are the peers' ratios, per round.
type peerFigures struct {
	claimFirstOverOurs, fiberOverOurs series // requests/s over ours
	fiberOwn                          series // fiber / fiber-plain
}

func peerRatios(r *results) peerFigures {
	return peerFigures{
		claimFirstOverOurs: ratio(r.claimFirst.rps, r.create.rps),
		fiberOverOurs:      ratio(r.fiber.rps, r.create.rps),
		fiberOwn:           ratio(r.fiber.rps, r.fiberPlain.rps),
	}
}

func (p peerFigures) overOurs(peer string) series {
	if peer == peerFiber {
		return p.fiberOverOurs
	}
	return p.claimFirstOverOurs
}

// describe lists the retries' answers, e.g. "3× 201 replayed".
func (c *crashResult) describe() string {
	var parts []string
	for _, a := range slices.Sorted(maps.Keys(c.answers)) {
		parts = append(parts, fmt.Sprintf("%d× %s", c.answers[a], a))
	}
	return strings.Join(parts, ", ")
}

// report writes the benchmark's figures and their targets to w.
func report(w io.Writer, o options, r *results) {
	reportThroughput(w, o, r)
	q := ratiosOf(r)
	reportRatios(w, o, r, q)
	reportCrashes(w, r)
	reportCosts(w, o, r.costs)
	fmt.Fprintf(w, "\nAPI process memory: peak RSS (VmHWM) %.1f MB, RSS after the rounds (VmRSS) %.1f MB; the traced API's peak RSS %.1f MB\n", megabytes(r.rssPeak), megabytes(r.rssEnd), megabytes(r.tracedRSSPeak))
	fmt.Fprintf(w, "checked: %d creates executed, %d traced creates, %d baseline creates, %d claim-first creates, %d fiber creates, %d fiber-plain creates, %d replays, %d reads, %d payments, %d baseline payments, one order per storm; every one in the database; %d processor charges for %d succeeded payments\n",
		r.create.requests, r.traced.requests, r.baseline.requests, r.claimFirst.requests, r.fiber.requests, r.fiberPlain.requests,
		r.replay.requests, r.get.requests, r.payment.requests, r.paymentBaseline.requests, r.charges, r.succeeded)
	reportFields(w, r, q)
}

// reportThroughput writes each scenario's rate and latencies.
func reportThroughput(w io.Writer, o options, r *results) {
	fmt.Fprintf(w, "\nthroughput and latency at c=%d, median (range) over %d rounds:\n", o.concurrency, o.rounds)
	fmt.Fprintf(w, "  %-16s %-24s %-24s %s\n", "", "requests/s", "p50 ms", "p99 ms")
	for _, s := range []struct {
		name string
		sc   scenario
	}{{"create", r.create}, {"traced", r.traced}, {"baseline", r.baseline}, {"replay", r.replay}, {"get", r.get}, {"payment", r.payment},
		{"payment-baseline", r.paymentBaseline}, {"claim-first", r.claimFirst}, {"fiber", r.fiber}, {"fiber-plain", r.fiberPlain}} {
		fmt.Fprintf(w, "  %-16s %-24s %-24s %s\n", s.name, s.sc.rps.format(0), s.sc.p50.format(1), s.sc.p99.format(1))
	}
	fmt.Fprintln(w, "  (traced: the create on a twin API with OpenTelemetry on, every request sampled, exported over OTLP/HTTP)")
	fmt.Fprintln(w, "  (peers, around the same order insert: claim-first, the key claimed in progress, the order, the key updated to completed, one transaction;")
	fmt.Fprintln(w, "   fiber, Fiber's middleware/idempotency with its Redis storage on a private redis-server; fiber-plain, the same Fiber app without it)")
	if r.paymentsRanOut {
		fmt.Fprintln(w, "  (the payment scenario ran out of unpaid orders before its time in some round; its rate is over the time it ran)")
	}
}

// roundRatios are the ratios the report judges, each taken per round.
type roundRatios struct {
	p1, p3, p4, paymentOverBaseline, tracedRPS, tracedP99 series
	peers                                                 peerFigures
}

// ratiosOf takes the ratios of r.
func ratiosOf(r *results) roundRatios {
	return roundRatios{
		p1:                  ratio(r.create.rps, r.baseline.rps),
		p3:                  ratio(r.payment.rps, r.create.rps),
		paymentOverBaseline: ratio(r.payment.rps, r.paymentBaseline.rps),
		p4:                  ratio(r.replay.rps, r.create.rps),
		tracedRPS:           ratio(r.traced.rps, r.create.rps),
		tracedP99:           ratio(r.traced.p99, r.create.p99),
		peers:               peerRatios(r),
	}
}

// reportRatios writes the ratios against their targets.
func reportRatios(w io.Writer, o options, r *results, q roundRatios) {
	fmt.Fprintf(w, "\nratios, per round, median (range):\n")
	fmt.Fprintf(w, "  P1 create / baseline   %-22s target >= 0.7 (P7; aim: 0.8)\n", q.p1.format(2))
	fmt.Fprintf(w, "  P3 payment / create    %-22s target >= 0.45\n", q.p3.format(2))
	fmt.Fprintf(w, "  P8 payment / payment baseline %-15s target >= 0.7 (the same processor call and rows, without the key)\n", q.paymentOverBaseline.format(2))
	fmt.Fprintf(w, "  P4 replay / create     %-22s target >= 2\n", q.p4.format(2))
	fmt.Fprintf(w, "  P5 storm of %d: p99 %s ms, %d execution(s) in %d storm(s) (replays %d, 409 in progress %d); target one execution, p99 <= 100 ms\n",
		o.storm, r.stormP99.format(1), r.stormExecutions, r.storms, r.stormReplays, r.stormInProgress)
	fmt.Fprintf(w, "  X3 traced / create     %-22s requests/s; p99 %s (tracing on, 100 %% sampled, over off)\n", q.tracedRPS.format(2), q.tracedP99.format(2))
	fmt.Fprintf(w, "     the sink received %d spans during the traced creates, %d of them server spans of the %d creates; %d server spans during the untraced creates\n",
		r.tracedSpans, r.tracedCreateSpans, r.traced.requests, r.untracedCreateSpans)
	fmt.Fprintf(w, "  P8 claim-first / ours  %-22s requests/s; p99 %s\n", q.peers.claimFirstOverOurs.format(2), ratio(r.claimFirst.p99, r.create.p99).format(2))
	fmt.Fprintf(w, "     fiber / ours        %-22s requests/s; p99 %s\n", q.peers.fiberOverOurs.format(2), ratio(r.fiber.p99, r.create.p99).format(2))
	fmt.Fprintf(w, "     fiber / fiber-plain %-22s the peer's own price of its key, beside P1 %s\n", q.peers.fiberOwn.format(2), q.p1.format(2))
	fmt.Fprintf(w, "     fiber-plain / baseline %-19s the two HTTP stacks without a key\n", ratio(r.fiberPlain.rps, r.baseline.rps).format(2))
}

// reportCrashes writes the crash test's outcome, ours and the peers'.
func reportCrashes(w io.Writer, r *results) {
	fmt.Fprintf(w, "\ncrash test: killed after the order's commit, before the response is stored; the same request under the same key to a fresh process:\n")
	fmt.Fprintf(w, "  %-11s %-7s %-9s %-22s %-14s %s\n", "", "crashes", "replayed", "duplicate executions", "orders past 1", "the retries' answers")
	for _, name := range append([]string{"ours"}, peerNames...) {
		c := r.crash[name]
		fmt.Fprintf(w, "  %-11s %-7d %-9d %-22d %-14d %s\n", name, c.trials, c.replays, c.duplicates, c.extraRows, c.describe())
	}
}

// reportCosts writes the round trips and statements per request, and the
// statements of each.
func reportCosts(w io.Writer, o options, c probeCosts) {
	fmt.Fprintf(w, "\nround trips / statements per request, single requests at the wire, median (range) of %d:\n", o.samples)
	for _, k := range []struct {
		name string
		c    cost
		note string
	}{
		{"create", c.create, "target <= 4 round trips"},
		{"replay", c.replay, "target <= 3"},
		{"payment", c.payment, "target <= 12, plus the processor call"},
		{"payment-baseline", c.paymentBaseline, "plus the processor call"},
		{"baseline", c.baseline, ""},
		{"get", c.get, ""},
	} {
		fmt.Fprintf(w, "  %-16s %-12s / %-12s %s\n", k.name, k.c.roundTrips.format(0), k.c.statements.format(0), k.note)
	}
	fmt.Fprintf(w, "  an API key not in the authentication cache adds %d round trip(s) / %d statement(s), once per key per AUTH_CACHE_TTL\n",
		c.authMiss.RoundTrips, c.authMiss.Statements)
	for _, k := range []struct {
		name string
		c    cost
	}{{"create", c.create}, {"replay", c.replay}, {"payment", c.payment}, {"payment baseline", c.paymentBaseline}} {
		fmt.Fprintf(w, "\nstatements of one %s, one line per round trip:\n", k.name)
		for i, line := range formatStatements(k.c.recorded) {
			fmt.Fprintf(w, "  %2d  %s\n", i+1, line)
		}
	}
}

// reportFields writes the one line of key=value figures that scripts read.
func reportFields(w io.Writer, r *results, q roundRatios) {
	c := r.costs
	fields := []string{
		fmt.Sprintf("p1=%.2f", q.p1.median()),
		fmt.Sprintf("p3=%.2f", q.p3.median()),
		fmt.Sprintf("p4=%.2f", q.p4.median()),
		fmt.Sprintf("p5_p99_ms=%.0f", r.stormP99.median()),
		fmt.Sprintf("p5_executions=%d", r.stormExecutions/max(r.storms, 1)),
		fmt.Sprintf("rt_create=%g", c.create.roundTrips.median()),
		fmt.Sprintf("rt_replay=%g", c.replay.roundTrips.median()),
		fmt.Sprintf("rt_payment=%g", c.payment.roundTrips.median()),
		fmt.Sprintf("rt_baseline=%g", c.baseline.roundTrips.median()),
		fmt.Sprintf("rt_auth_miss=%d", c.authMiss.RoundTrips),
		fmt.Sprintf("st_create=%g", c.create.statements.median()),
		fmt.Sprintf("st_replay=%g", c.replay.statements.median()),
		fmt.Sprintf("st_payment=%g", c.payment.statements.median()),
		fmt.Sprintf("create_rps=%.0f", r.create.rps.median()),
		fmt.Sprintf("baseline_rps=%.0f", r.baseline.rps.median()),
		fmt.Sprintf("traced_rps=%.0f", r.traced.rps.median()),
		fmt.Sprintf("trace_rps=%.2f", q.tracedRPS.median()),
		fmt.Sprintf("trace_p99=%.2f", q.tracedP99.median()),
		fmt.Sprintf("rss_mb=%.0f", megabytes(r.rssPeak)),
		fmt.Sprintf("payment_over_baseline=%.2f", q.paymentOverBaseline.median()),
		fmt.Sprintf("payment_baseline_rps=%.0f", r.paymentBaseline.rps.median()),
		fmt.Sprintf("rt_payment_baseline=%g", c.paymentBaseline.roundTrips.median()),
		fmt.Sprintf("st_payment_baseline=%g", c.paymentBaseline.statements.median()),
		fmt.Sprintf("peers=%d", len(peerNames)),
		fmt.Sprintf("crash_dups_ours=%d", r.crash["ours"].duplicates),
		fmt.Sprintf("fiber_own=%.2f", q.peers.fiberOwn.median()),
		fmt.Sprintf("claim_first_rps=%.0f", r.claimFirst.rps.median()),
		fmt.Sprintf("fiber_rps=%.0f", r.fiber.rps.median()),
		fmt.Sprintf("fiber_plain_rps=%.0f", r.fiberPlain.rps.median()),
	}
	for _, name := range peerNames {
		fields = append(fields,
			fmt.Sprintf("%s_over_ours=%.2f", fieldName(name), q.peers.overOurs(name).median()),
			fmt.Sprintf("crash_dups_%s=%d", fieldName(name), r.crash[name].duplicates))
	}
	fmt.Fprintf(w, "\nloadtest: %s\n", strings.Join(fields, " "))
}
