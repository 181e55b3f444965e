package main

// The soak (-soak D): a day of churn in half an hour.
//
// One API process runs as `api serve` with every horizon the reaper works
// to divided by soakFactor, so that keys are created, replayed, pruned to
// tombstones and deleted many times over within the run. Requests arrive
// at a fixed rate (-soak-rate, open loop: what `make soak` runs) or from a
// fixed number of closed-loop clients (-c, 8 by default here): a mix of
// creates under fresh keys, replays of recent creates, and payments of
// created orders, for D; every answer is checked. Every
// -soak-interval a row is taken: the rates and p99 per kind, the key
// table's size, tuples, autovacuum and autoanalyze counts, the reaper's
// lag, and the WAL written per create. At the end the rows are judged
// (judgeSoak) and, with -soak-plot, drawn (soakplot.go) and written as CSV.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/idemref/payments/internal/config"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/reaper"
	"github.com/idemref/payments/internal/tooling/harness"
)

// soakFactor divides every horizon of the soak's API: 72 h of key
// retention become 10 minutes, a third of a 30-minute run, so that the
// last two thirds run on a table the reaper has been trimming, and a day's
// TTL becomes 3 min 20 s.
const soakFactor = 432

// soakConcurrency is the soak's default -c: enough clients to keep two
// cores busy with the API, PostgreSQL and the reaper, few enough that the
// run is a steady state rather than a queue.
const soakConcurrency = 8

// soakMaxInFlight bounds the requests in flight at a fixed rate
// (-soak-rate): a service that slows down gets more requests at once, as
// it would from real callers, up to this many; past it arrivals wait, and
// the rate answered falls below the rate offered.
const soakMaxInFlight = 64

// soakHorizon is one setting of the soak's API: its default and the value
// the soak runs with.
type soakHorizon struct {
	name           string
	def, scaled    time.Duration
	why            string
	ttl, retention bool
}

// soakHorizons are the horizons the reaper works to, each divided by
// factor (rounded to the millisecond). The broker's redelivery horizon
// (EVENTS_ACK_WAIT doubling over EVENTS_MAX_DELIVER: 15.5 min) is not
// scaled: it times live deliveries, and an ack wait of 69 ms would turn
// ordinary consumer latency into redeliveries. MESSAGE_RETENTION scaled
// (23 min 20 s) still exceeds it, as config requires.
func soakHorizons(factor int) []soakHorizon {
	list := []soakHorizon{
		{name: "IDEMPOTENCY_TTL", def: idem.DefaultTTL, why: "a completed key's response is replayed; then pruned to a tombstone", ttl: true},
		{name: "IDEMPOTENCY_KEY_RETENTION", def: idem.DefaultKeyRetention, why: "a tombstone is kept (from creation); then deleted", retention: true},
		{name: "REAPER_INTERVAL", def: reaper.DefaultInterval, why: "between reaper passes"},
		{name: "MESSAGE_RETENTION", def: config.DefaultMessageRetention, why: "inbox ids and published outbox rows are kept"},
		{name: "PROCESSOR_WEBHOOK_RETRY_SPAN", def: processor.DefaultWebhookRetrySpan, why: "MESSAGE_RETENTION must exceed it (no webhooks are sent in the soak)"},
	}
	for i := range list {
		list[i].scaled = (list[i].def / time.Duration(factor)).Round(time.Millisecond)
	}
	return list
}

// soakEnv is the API's environment for the scaled horizons.
func soakEnv(factor int) []string {
	var env []string
	for _, h := range soakHorizons(factor) {
		env = append(env, h.name+"="+h.scaled.String())
	}
	return env
}

// checkSoakConfig loads the API's configuration with the scaled horizons,
// so that a factor the API would refuse fails here, naming the rule.
func checkSoakConfig(factor int) error {
	vars := map[string]string{}
	for _, kv := range soakEnv(factor) {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	_, err := config.Load(func(k string) string { return vars[k] })
	return err
}

// soakScaled returns the scaled TTL, retention and reaper interval.
func soakScaled(factor int) (ttl, retention, interval time.Duration) {
	for _, h := range soakHorizons(factor) {
		switch {
		case h.ttl:
			ttl = h.scaled
		case h.retention:
			retention = h.scaled
		case h.name == "REAPER_INTERVAL":
			interval = h.scaled
		}
	}
	return ttl, retention, interval
}

// soakDefaults applies the soak's defaults to the flags not given and
// checks the soak's flags.
func soakDefaults(fs *flag.FlagSet, o *options) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.soak < 0 {
		return fmt.Errorf("-soak %s: want how long the soak runs, or 0 for the default benchmark", o.soak)
	}
	if o.soak == 0 {
		if set["soak-interval"] || set["soak-plot"] || set["soak-rate"] {
			return errors.New("-soak-interval, -soak-plot and -soak-rate belong to -soak; give -soak DURATION")
		}
		return nil
	}
	if !set["c"] {
		o.concurrency = soakConcurrency
	}
	switch {
	case o.soakInterval <= 0 || o.soakInterval > o.soak:
		return fmt.Errorf("-soak-interval %s: want a positive interval no longer than -soak %s", o.soakInterval, o.soak)
	case o.soakRate < 0:
		return fmt.Errorf("-soak-rate %d: want requests per second, or 0 for closed-loop clients", o.soakRate)
	case o.pgbench || o.storedKeys > 0:
		return errors.New("-soak, -pgbench and -stored-keys are separate benchmarks; give one")
	}
	return checkSoakConfig(soakFactor)
}

// soakCreate is a create answered as an execution, which a replay may
// resend.
type soakCreate struct {
	key          string
	body, answer []byte
	at           time.Time
}

// soakPlan is what one request of the soak is, and what its answer must be.
type soakPlan struct {
	kind   requestKind
	create *soakCreate // the create to record, or the one replayed
}

// soakTraffic makes the soak's requests and checks their answers.
type soakTraffic struct {
	l         *load
	replayAge time.Duration // a replay resends a create at most this old

	mu      sync.Mutex
	plans   map[string]soakPlan // by tag
	recent  []*soakCreate       // a ring of recent creates, for replays
	next    int
	unpaid  []string // ids of created orders not yet paid
	nextTag int64

	// Results, read by the loop that consumes the answers.
	win      soakWindow
	executed [requestKinds]int // answered as expected, over the run
	failures int
	examples []string
}

// soakWindow is what the answers of one sampling interval were.
type soakWindow struct {
	ok        [requestKinds]int
	latencies [requestKinds][]time.Duration
	failures  int
}

func newSoakTraffic(l *load, ttl time.Duration) *soakTraffic {
	return &soakTraffic{l: l, replayAge: ttl / 2, plans: map[string]soakPlan{}, recent: make([]*soakCreate, 0, 1024)}
}

// target is the attack's targeter. The plan travels in the URL's fragment,
// which the client never sends (net/http leaves it out of the request
// line) and vegeta copies into the result: vegeta numbers its results
// before it calls the targeter, so the sequence number cannot join a
// result to its request.
func (t *soakTraffic) target(tgt *vegeta.Target) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.nextTag++
	tag := strconv.FormatInt(t.nextTag, 36)
	plan := t.choose()
	tgt.Method = http.MethodPost
	switch plan.kind {
	case kindReplay:
		tgt.URL, tgt.Header, tgt.Body = t.l.base+"/v1/orders#"+tag, t.l.headers(plan.create.key), plan.create.body
	case kindPayment:
		id := t.unpaid[len(t.unpaid)-1]
		t.unpaid = t.unpaid[:len(t.unpaid)-1]
		tgt.URL, tgt.Header = t.l.base+"/v1/payments#"+tag, t.l.headers(t.l.fresh("soak-pay"))
		tgt.Body = fmt.Appendf(nil, `{"order_id":%q,"amount":%d,"currency":"EUR","payment_method":"pm_card_visa"}`, id, orderAmount)
	default:
		c := &soakCreate{key: t.l.fresh("soak"), body: orderBody(t.l.fresh("soak-ref"))}
		plan.create = c
		tgt.URL, tgt.Header, tgt.Body = t.l.base+"/v1/orders#"+tag, t.l.headers(c.key), c.body
	}
	t.plans[tag] = plan
	return nil
}

// choose draws the next request's kind from the mix; a replay with no
// recent create to resend, or a payment with no unpaid order, is a create
// instead.
func (t *soakTraffic) choose() soakPlan {
	n := rand.IntN(mixCreate + mixReplay + mixPayment)
	switch {
	case n < mixCreate:
	case n < mixCreate+mixReplay:
		if len(t.recent) > 0 {
			c := t.recent[rand.IntN(len(t.recent))]
			if time.Since(c.at) < t.replayAge {
				return soakPlan{kind: kindReplay, create: c}
			}
		}
	default:
		if len(t.unpaid) > 0 {
			return soakPlan{kind: kindPayment}
		}
	}
	return soakPlan{kind: kindCreate}
}

// answer checks one result against its plan and counts it.
func (t *soakTraffic) answer(res *vegeta.Result) {
	_, tag, _ := strings.Cut(res.URL, "#")
	t.mu.Lock()
	plan, ok := t.plans[tag]
	delete(t.plans, tag)
	t.mu.Unlock()
	problem := "an answer to no request of the soak: " + res.URL
	if ok {
		problem = t.check(plan, res)
	}
	if problem != "" {
		t.win.failures++
		t.failures++
		if len(t.examples) < 5 {
			t.examples = append(t.examples, problem)
		}
		return
	}
	t.win.ok[plan.kind]++
	t.win.latencies[plan.kind] = append(t.win.latencies[plan.kind], res.Latency)
	t.executed[plan.kind]++
}

// check returns what is wrong with res as the answer to plan, or "".
func (t *soakTraffic) check(plan soakPlan, res *vegeta.Result) string {
	name := requestKindNames[plan.kind]
	if p := status(http.StatusCreated, plan.kind == kindReplay)(res); p != "" {
		return name + ": " + p
	}
	switch plan.kind {
	case kindReplay:
		if !bytes.Equal(res.Body, plan.create.answer) {
			return "replay: the body differs from the create's: " + truncate(res.Body)
		}
	case kindPayment:
		var v struct{ Status string }
		if err := json.Unmarshal(res.Body, &v); err != nil || v.Status != "succeeded" {
			return "payment: did not succeed: " + truncate(res.Body)
		}
	default:
		var v struct{ ID string }
		if err := json.Unmarshal(res.Body, &v); err != nil || v.ID == "" {
			return "create: the body has no id: " + truncate(res.Body)
		}
		c := plan.create
		c.answer, c.at = res.Body, time.Now()
		t.recorded(c, v.ID)
	}
	return ""
}

// recorded keeps a create for replays, and its order for a payment.
func (t *soakTraffic) recorded(c *soakCreate, orderID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.recent) < cap(t.recent) {
		t.recent = append(t.recent, c)
	} else {
		t.recent[t.next] = c
		t.next = (t.next + 1) % len(t.recent)
	}
	t.unpaid = append(t.unpaid, orderID)
	if len(t.unpaid) > 20_000 { // payments take the newest; the oldest are never needed
		t.unpaid = append(t.unpaid[:0], t.unpaid[10_000:]...)
	}
}

// runSoak is the soak of -soak.
func runSoak(ctx context.Context, o options, env *environment, stdout io.Writer) error {
	printSoakHeader(stdout, o, env)
	l := newLoad(env.loadURL, env.apiKey, env.runID, env.db, max(o.concurrency, soakMaxInFlight)+8)
	ttl, _, _ := soakScaled(soakFactor)
	traffic := newSoakTraffic(l, ttl)
	s := &soakSampler{db: env.db, started: time.Now().UTC()}
	var err error
	if s.orders0, err = l.count(ctx, countOrders); err != nil {
		return err
	}
	if s.payments0, err = l.count(ctx, countPayments); err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	printSoakTableHead(stdout)
	rows, err := soakLoop(ctx, o, traffic, s, stdout)
	if err != nil {
		return err
	}
	checkErr := soakFinalChecks(ctx, env, l, traffic, s)
	judgement := judgeSoak(rows, o.soakInterval, soakFactor, float64(o.soakRate))
	verdict, complete := soakVerdict(judgement.checks)
	printSoakVerdict(stdout, judgement.checks, verdict, complete)
	if o.soakPlot != "" {
		if err := writeSoakOutputs(o.soakPlot, rows, s.started, o); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "soak: wrote %s and %s\n", o.soakPlot, csvPath(o.soakPlot))
	}
	fmt.Fprintf(stdout, "\nsoak: %s\n", strings.Join(soakFields(o, rows, judgement, traffic, verdict), " "))
	if checkErr != nil {
		if lines := harness.ErrorLines(env.loadAPI.LogPath, 10); len(lines) > 0 {
			fmt.Fprintf(os.Stderr, "loadtest: the last errors %s logged:\n%s\n", env.loadAPI.Name, strings.Join(lines, "\n"))
		}
		return checkErr
	}
	if verdict == "FAIL" && complete {
		return errors.New("soak: the verdict is FAIL (see the lines above)")
	}
	return nil
}

func printSoakHeader(w io.Writer, o options, env *environment) {
	fmt.Fprintf(w, "loadtest: soak of %s, PostgreSQL %s (fsync=%s synchronous_commit=%s full_page_writes=%s), %d CPUs, %s, pool=%d, a row every %s\n",
		o.soak, env.settings["server_version"], env.settings["fsync"], env.settings["synchronous_commit"], env.settings["full_page_writes"],
		runtime.NumCPU(), soakLoadText(o, true), o.pool, o.soakInterval)
	fmt.Fprintf(w, "mix: %d%% creates under fresh keys, %d%% replays of a create at most IDEMPOTENCY_TTL/2 old, %d%% payments of created orders; RATE_LIMIT_RPS=0\n",
		mixCreate, mixReplay, mixPayment)
	fmt.Fprintf(w, "the API's horizons divided by %d (a run of %s is %.1f days of churn):\n", soakFactor, o.soak, (o.soak*soakFactor).Hours()/24)
	for _, h := range soakHorizons(soakFactor) {
		fmt.Fprintf(w, "  %-28s %-8s -> %-8s %s\n", h.name, horizonText(h.def), h.scaled, h.why)
	}
}

// soakLoadText says how the soak's requests come: at a rate, or from
// closed-loop clients; long, for the header, or short, for the plot.
func soakLoadText(o options, long bool) string {
	switch {
	case o.soakRate > 0 && long:
		return fmt.Sprintf("%d requests/s offered (open loop, at most %d in flight)", o.soakRate, soakMaxInFlight)
	case o.soakRate > 0:
		return fmt.Sprintf("%d requests/s", o.soakRate)
	case long:
		return fmt.Sprintf("c=%d closed-loop clients", o.concurrency)
	}
	return fmt.Sprintf("c=%d", o.concurrency)
}

// soakLoop runs the attack for o.soak, checks every answer and takes a
// row every o.soakInterval; the last, partial interval makes a row if it
// lasted at least half an interval.
func soakLoop(ctx context.Context, o options, traffic *soakTraffic, s *soakSampler, stdout io.Writer) ([]soakRow, error) {
	// Closed loop: o.concurrency clients, each sending as soon as it has
	// its answer. Open loop: arrivals at o.soakRate, whatever the latency.
	rate, maxWorkers := vegeta.Rate{}, o.concurrency
	if o.soakRate > 0 {
		rate, maxWorkers = vegeta.Rate{Freq: o.soakRate, Per: time.Second}, soakMaxInFlight
	}
	atk := vegeta.NewAttacker(
		vegeta.Client(traffic.l.client),
		vegeta.Workers(uint64(o.concurrency)),
		vegeta.MaxWorkers(uint64(maxWorkers)),
	)
	ticker := time.NewTicker(o.soakInterval)
	defer ticker.Stop()
	results := atk.Attack(traffic.target, rate, o.soak, "soak")
	var rows []soakRow
	done := ctx.Done()
	for {
		select {
		case res, ok := <-results:
			if !ok {
				if time.Since(s.last) >= o.soakInterval/2 {
					row, err := s.take(ctx, &traffic.win)
					if err != nil {
						return rows, err
					}
					printSoakRow(stdout, row)
					rows = append(rows, row)
				}
				return rows, ctx.Err()
			}
			traffic.answer(res)
		case <-ticker.C:
			row, err := s.take(ctx, &traffic.win)
			if err != nil {
				atk.Stop()
				return rows, err
			}
			printSoakRow(stdout, row)
			rows = append(rows, row)
		case <-done:
			atk.Stop()
			done = nil
		}
	}
}

// soakFinalChecks holds the database to the answers: the orders grew by
// the creates executed, the succeeded payments by the payments, and the
// processor executed one charge per succeeded payment.
func soakFinalChecks(ctx context.Context, env *environment, l *load, t *soakTraffic, s *soakSampler) error {
	if t.failures > 0 {
		return fmt.Errorf("soak: %d unexpected answers, e.g.: %v", t.failures, t.examples)
	}
	orders, err := l.count(ctx, countOrders)
	if err != nil {
		return err
	}
	if grew := orders - s.orders0; grew != t.executed[kindCreate] {
		return fmt.Errorf("soak: %d orders were written for %d creates executed and %d replays", grew, t.executed[kindCreate], t.executed[kindReplay])
	}
	succeeded, err := l.count(ctx, countPayments)
	if err != nil {
		return err
	}
	if grew := succeeded - s.payments0; grew != t.executed[kindPayment] {
		return fmt.Errorf("soak: %d payments succeeded for %d payment requests executed", grew, t.executed[kindPayment])
	}
	charges, err := executedCharges(ctx, env.processorURL)
	if err != nil {
		return err
	}
	if charges != succeeded {
		return fmt.Errorf("soak: the processor executed %d charges for %d succeeded payments", charges, succeeded)
	}
	return nil
}

// horizonText writes a default horizon as a person reads it: 72h, 7d, 1m.
func horizonText(d time.Duration) string {
	switch {
	case d%(24*time.Hour) == 0 && d >= 7*24*time.Hour:
		return strconv.Itoa(int(d/(24*time.Hour))) + "d"
	case d%time.Hour == 0:
		return strconv.Itoa(int(d/time.Hour)) + "h"
	case d%time.Minute == 0:
		return strconv.Itoa(int(d/time.Minute)) + "m"
	}
	return d.String()
}

// soakRow is one sampling interval of the soak.
type soakRow struct {
	end      time.Duration // since the attack began
	interval time.Duration
	rps      [requestKinds]float64
	total    float64 // requests/s, every kind
	p99      [requestKinds]float64
	p99All   float64 // ms
	failures int
	// The key table, from pg_relation_size, pg_indexes_size and
	// pg_stat_user_tables (cumulative counts).
	heap, indexes             int64
	live, dead                int64
	autovacuums, autoanalyzes int64
	pruneLag, deleteLag       float64 // seconds
	walPerCreate              float64 // bytes
}

func (r soakRow) size() int64 { return r.heap + r.indexes }

func (r soakRow) lag() float64 { return max(r.pruneLag, r.deleteLag) }

// soakSampler reads the database's side of each row.
type soakSampler struct {
	db interface {
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	}
	started            time.Time // wall clock, for the plot's title
	begun, last        time.Time
	wal                int64
	orders0, payments0 int
}

// soakStatsSQL reads the key table's sizes and statistics, the WAL
// position, and the reaper's lag: how long ago the oldest row it should
// have pruned (a completed key past expires_at) or deleted (a finished key
// past retain_until) passed that horizon, with the reaper's own predicates,
// along the indexes it walks; 0 when none is due.
const soakStatsSQL = `
SELECT pg_relation_size(s.relid), pg_indexes_size(s.relid),
       s.n_live_tup, s.n_dead_tup, s.autovacuum_count, s.autoanalyze_count,
       (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint,
       coalesce((SELECT extract(epoch FROM now() - min(k.expires_at))::float8 FROM idempotency_keys k
                 WHERE k.state = 'completed' AND idem_passed(k.expires_at) AND idem_lease_free(k.locked_until)), 0),
       coalesce((SELECT extract(epoch FROM now() - min(k.retain_until))::float8 FROM idempotency_keys k
                 WHERE idem_forgotten(k.state, k.retain_until) AND idem_lease_free(k.locked_until)), 0)
FROM pg_stat_user_tables s WHERE s.relid = 'idempotency_keys'::regclass`

// begin reads the WAL position the first row counts from.
func (s *soakSampler) begin(ctx context.Context) error {
	var r soakRow
	err := s.read(ctx, &r)
	s.begun, s.last = time.Now(), time.Now()
	return err
}

func (s *soakSampler) read(ctx context.Context, r *soakRow) error {
	var wal int64
	err := s.db.QueryRow(ctx, soakStatsSQL).Scan(&r.heap, &r.indexes, &r.live, &r.dead, &r.autovacuums, &r.autoanalyzes,
		&wal, &r.pruneLag, &r.deleteLag)
	if err != nil {
		return fmt.Errorf("soak: read the key table's statistics: %w", err)
	}
	if s.wal != 0 {
		r.walPerCreate = float64(wal - s.wal)
	}
	s.wal = wal
	return nil
}

// take makes the row of the interval that ends now from w, which it
// empties.
func (s *soakSampler) take(ctx context.Context, w *soakWindow) (soakRow, error) {
	now := time.Now()
	r := soakRow{end: now.Sub(s.begun), interval: now.Sub(s.last), failures: w.failures}
	s.last = now
	secs := r.interval.Seconds()
	var all []time.Duration
	for k := range requestKinds {
		r.rps[k] = float64(w.ok[k]) / secs
		r.total += r.rps[k]
		r.p99[k] = ms(harness.Percentile(w.latencies[k], 99))
		all = append(all, w.latencies[k]...)
	}
	r.p99All = ms(harness.Percentile(all, 99))
	creates := w.ok[kindCreate]
	*w = soakWindow{}
	if err := s.read(ctx, &r); err != nil {
		return r, err
	}
	if creates > 0 {
		r.walPerCreate /= float64(creates)
	} else {
		r.walPerCreate = 0
	}
	return r, nil
}

// soakColumns name the table's and the CSV's columns.
var soakColumns = []string{"min", "total_rps", "create_rps", "replay_rps", "payment_rps",
	"p99_ms", "create_p99_ms", "replay_p99_ms", "payment_p99_ms",
	"heap_mb", "indexes_mb", "live_tup", "dead_tup", "autovacuum", "autoanalyze",
	"prune_lag_s", "delete_lag_s", "wal_per_create", "failures"}

// cells are a row's values in soakColumns' order.
func (r soakRow) cells() []string {
	f := func(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	return []string{
		f(r.end.Minutes(), 2), f(r.total, 0), f(r.rps[kindCreate], 0), f(r.rps[kindReplay], 0), f(r.rps[kindPayment], 0),
		f(r.p99All, 1), f(r.p99[kindCreate], 1), f(r.p99[kindReplay], 1), f(r.p99[kindPayment], 1),
		f(megabytes(r.heap), 1), f(megabytes(r.indexes), 1), i(r.live), i(r.dead), i(r.autovacuums), i(r.autoanalyzes),
		f(r.pruneLag, 1), f(r.deleteLag, 1), f(r.walPerCreate, 0), strconv.Itoa(r.failures),
	}
}

// soakWidths are the table's column widths.
var soakWidths = []int{6, 6, 6, 6, 6, 7, 7, 7, 7, 8, 8, 8, 8, 4, 4, 8, 8, 7, 5}

// soakHeads are the printed table's headings, soakColumns shortened.
var soakHeads = []string{"min", "all/s", "cre/s", "rep/s", "pay/s", "p99", "cre.p99", "rep.p99", "pay.p99",
	"heapMB", "idxMB", "live", "dead", "av", "aa", "pruneLag", "delLag", "WAL/cr", "fail"}

func printSoakTableHead(w io.Writer) {
	fmt.Fprintln(w, "\nevery row: requests/s answered as expected, p99 ms, the key table (idempotency_keys) heap and indexes, live and dead tuples,")
	fmt.Fprintln(w, "autovacuum and autoanalyze counts since start, the reaper's lag in seconds (prune, delete), WAL bytes per create executed, failures")
	printSoakLine(w, soakHeads)
}

func printSoakRow(w io.Writer, r soakRow) { printSoakLine(w, r.cells()) }

func printSoakLine(w io.Writer, cells []string) {
	var b strings.Builder
	for i, c := range cells {
		fmt.Fprintf(&b, " %*s", soakWidths[i], c)
	}
	fmt.Fprintln(w, b.String())
}

// The pass rules.
const (
	maxDrift     = 0.10 // throughput, last sixth of the rows against the first
	maxGrowth    = 0.05 // key table size over the last third, once retention has passed
	maxP99Step   = 1.5  // median p99, last fifth of the rows over the first
	lagIntervals = 2    // reaper lag, in scaled REAPER_INTERVALs, plus one sampling interval
)

// soakCheck is one pass rule's outcome.
type soakCheck struct {
	name   string
	judged bool // false: the run is too short to judge it
	pass   bool
	detail string
	value  float64 // the figure judged, for the last line
}

// soakJudgement is the outcome of every rule, and the plateau's size.
type soakJudgement struct {
	checks  []soakCheck
	plateau int64 // bytes: the key table at the end, when it plateaued
}

// judgeSoak applies the pass rules to rows taken every sample with the
// horizons divided by factor, and offered requests/s (0: closed loop). The first rows are the growth phase: the
// table fills until the first keys reach the retention horizon. Drift and
// p99 are judged over the whole run all the same; the plateau only over
// the last third of the rows, and only if that third begins after the
// retention horizon.
func judgeSoak(rows []soakRow, sample time.Duration, factor int, offered float64) soakJudgement {
	_, retention, interval := soakScaled(factor)
	return soakJudgement{checks: []soakCheck{
		judgeDrift(rows, offered),
		judgePlateau(rows, retention),
		judgeLag(rows, lagIntervals*interval+sample),
		judgeP99(rows),
	}, plateau: plateauBytes(rows, retention)}
}

// mean of f over rows.
func mean(rows []soakRow, f func(soakRow) float64) float64 {
	var sum float64
	for _, r := range rows {
		sum += f(r)
	}
	return sum / float64(len(rows))
}

// judgeDrift compares the mean throughput of the first and the last
// sixth of the rows (five minutes each of a 30-minute run). At an offered
// rate the last sixth must also answer within maxDrift of it: a service
// that falls behind its arrivals answers fewer than arrive, and its p99
// grows with the queue.
func judgeDrift(rows []soakRow, offered float64) soakCheck {
	c := soakCheck{name: "throughput drift"}
	k := len(rows) / 6
	if k < 1 || len(rows) < 2*k {
		c.detail = fmt.Sprintf("not judged: %d rows, want at least 6", len(rows))
		return c
	}
	total := func(r soakRow) float64 { return r.total }
	first, last := mean(rows[:k], total), mean(rows[len(rows)-k:], total)
	c.judged = true
	c.value = last/first - 1
	c.pass = first > 0 && abs(c.value) <= maxDrift
	c.detail = fmt.Sprintf("mean of the first %d rows %.0f requests/s, of the last %d %.0f: %+.1f%% (limit ±%.0f%%)",
		k, first, k, last, 100*c.value, 100*maxDrift)
	if offered > 0 {
		kept := last / offered
		c.pass = c.pass && kept >= 1-maxDrift
		c.detail += fmt.Sprintf("; the last %d answered %.1f%% of the %.0f/s offered (limit %.0f%%)", k, 100*kept, offered, 100*(1-maxDrift))
	}
	return c
}

func abs(v float64) float64 {
	if v < 0 {
		return -v
	}
	return v
}

// lastThird returns the index of the first row of the last third, and
// whether that third begins after the retention horizon.
func lastThird(rows []soakRow, retention time.Duration) (int, bool) {
	i := len(rows) - len(rows)/3
	if len(rows)/3 < 1 || i < 1 {
		return i, false
	}
	// The third begins where the row before it ends.
	return i, rows[i-1].end >= retention
}

// judgePlateau holds the key table (heap and indexes) to a growth of at
// most maxGrowth over the last third of the run, from the end of the row
// before it to the end of the last.
func judgePlateau(rows []soakRow, retention time.Duration) soakCheck {
	c := soakCheck{name: "key table plateau"}
	i, ok := lastThird(rows, retention)
	if !ok {
		c.detail = fmt.Sprintf("not judged: the last third of the run must begin after IDEMPOTENCY_KEY_RETENTION (%s), when keys are deleted as fast as they come", retention)
		return c
	}
	from, to := rows[i-1], rows[len(rows)-1]
	c.judged = true
	c.value = float64(to.size())/float64(max(from.size(), 1)) - 1
	c.pass = c.value <= maxGrowth
	c.detail = fmt.Sprintf("heap and indexes %.1f MB at %.1f min, %.1f MB at %.1f min: %+.1f%% over the last third (limit +%.0f%%); plateau %.1f MB (heap %.1f, indexes %.1f), %d live rows",
		megabytes(from.size()), from.end.Minutes(), megabytes(to.size()), to.end.Minutes(), 100*c.value, 100*maxGrowth,
		megabytes(to.size()), megabytes(to.heap), megabytes(to.indexes), to.live)
	return c
}

// plateauBytes is the key table's size at the end, if the plateau could
// be judged; 0 otherwise.
func plateauBytes(rows []soakRow, retention time.Duration) int64 {
	if _, ok := lastThird(rows, retention); !ok {
		return 0
	}
	return rows[len(rows)-1].size()
}

// judgeLag holds the reaper's lag, at every row, to limit. The lag is read
// once per row, at that moment: a reaper that keeps up holds it within a
// pass or two; one that falls behind lets it grow row after row.
func judgeLag(rows []soakRow, limit time.Duration) soakCheck {
	c := soakCheck{name: "reaper keeps up"}
	if len(rows) == 0 {
		c.detail = "not judged: no rows"
		return c
	}
	worst := rows[0]
	for _, r := range rows {
		if r.lag() > worst.lag() {
			worst = r
		}
	}
	c.judged = true
	c.value = worst.lag()
	c.pass = c.value <= limit.Seconds()
	c.detail = fmt.Sprintf("largest lag %.1f s (prune %.1f s, delete %.1f s) at %.1f min (limit %.1f s: %d scaled REAPER_INTERVALs and a sampling interval)",
		c.value, worst.pruneLag, worst.deleteLag, worst.end.Minutes(), limit.Seconds(), lagIntervals)
	return c
}

// judgeP99 compares the median p99 of the first and the last fifth of the
// rows.
func judgeP99(rows []soakRow) soakCheck {
	c := soakCheck{name: "no p99 step"}
	k := len(rows) / 5
	if k < 1 {
		c.detail = fmt.Sprintf("not judged: %d rows, want at least 5", len(rows))
		return c
	}
	p99 := func(rs []soakRow) float64 {
		s := make(series, 0, len(rs))
		for _, r := range rs {
			s = append(s, r.p99All)
		}
		return s.median()
	}
	first, last := p99(rows[:k]), p99(rows[len(rows)-k:])
	c.judged = true
	c.value = last / first
	c.pass = first > 0 && c.value <= maxP99Step
	c.detail = fmt.Sprintf("median p99 of the first %d rows %.1f ms, of the last %d %.1f ms: ×%.2f (limit ×%.1f)",
		k, first, k, last, c.value, maxP99Step)
	return c
}

// soakVerdict is PASS when every rule was judged and passed, FAIL when a
// rule judged failed, INCOMPLETE otherwise; complete says every rule was
// judged.
func soakVerdict(checks []soakCheck) (verdict string, complete bool) {
	complete, failed := true, false
	for _, c := range checks {
		complete = complete && c.judged
		failed = failed || (c.judged && !c.pass)
	}
	switch {
	case failed:
		return "FAIL", complete
	case !complete:
		return "INCOMPLETE", false
	}
	return "PASS", true
}

func printSoakVerdict(w io.Writer, checks []soakCheck, verdict string, complete bool) {
	fmt.Fprintf(w, "\nverdict: %s\n", verdict)
	for _, c := range checks {
		mark := "n/a "
		if c.judged && c.pass {
			mark = "pass"
		} else if c.judged {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  %s  %-18s %s\n", mark, c.name, c.detail)
	}
	if !complete {
		fmt.Fprintln(w, "  (a run this short cannot judge every rule: the verdict does not set the exit status)")
	}
}

// soakFields are the last line's name=value pairs.
func soakFields(o options, rows []soakRow, j soakJudgement, t *soakTraffic, verdict string) []string {
	fields := []string{
		"verdict=" + verdict,
		fmt.Sprintf("minutes=%.1f", o.soak.Minutes()),
		fmt.Sprintf("factor=%d", soakFactor),
		fmt.Sprintf("c=%d", o.concurrency),
		fmt.Sprintf("rate=%d", o.soakRate),
		fmt.Sprintf("rows=%d", len(rows)),
		fmt.Sprintf("creates=%d", t.executed[kindCreate]),
		fmt.Sprintf("replays=%d", t.executed[kindReplay]),
		fmt.Sprintf("payments=%d", t.executed[kindPayment]),
		fmt.Sprintf("failures=%d", t.failures),
	}
	names := []string{"drift", "plateau_growth", "max_lag_s", "p99_ratio"}
	for i, c := range j.checks {
		v := "na"
		if c.judged {
			v = strconv.FormatFloat(c.value, 'f', 3, 64)
		}
		fields = append(fields, names[i]+"="+v)
	}
	fields = append(fields, fmt.Sprintf("plateau_mb=%.1f", megabytes(j.plateau)))
	if len(rows) > 0 {
		r := rows[len(rows)-1]
		fields = append(fields, fmt.Sprintf("end_rps=%.0f", r.total), fmt.Sprintf("end_p99_ms=%.1f", r.p99All),
			fmt.Sprintf("end_live=%d", r.live), fmt.Sprintf("end_dead=%d", r.dead), fmt.Sprintf("autovacuums=%d", r.autovacuums))
	}
	return fields
}
