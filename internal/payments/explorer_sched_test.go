package payments_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/tooling/processorsim"
)

// The cooperative scheduler of the schedule explorer (T7).
//
// Every actor (a client request, a retry, the completer, a webhook
// delivery, a clock, a held processor call landing late) runs in its own
// goroutine, and parks at each yield point: right before it touches the
// world, that is before every connection it takes from a pool (each
// transaction, each statement outside one) and before every call to the
// processor. The scheduler wakes exactly one actor at a time and waits
// until it parks again or ends, so between two decisions exactly one actor
// has done exactly one thing, and a schedule is the sequence of those
// decisions. The yield points need no hook in the production code: the
// pools' PrepareConn and the processor client's transport are the test's.
//
// A connection is taken at the start of a transaction, never inside one
// (the code under test runs each transaction on one connection), so a
// parked actor holds no row lock and the running one never waits for a
// parked one. If it did (a yield point inside a transaction, or under a
// mutex of the process), the running actor would never park: the
// scheduler names it, with the goroutines' stacks, instead of hanging.

// stuckAfter is how long the scheduler waits for the running actor to park
// before it declares the schedule stuck. Steps take milliseconds; this is
// a bound on a bug, not a timing the schedule depends on.
const stuckAfter = 10 * time.Second

// errAborted is what an actor's yield point returns once its schedule has
// ended without it (a failure, or a loop actor with nothing left to do):
// the actor unwinds without touching anything more.
var errAborted = errors.New("explorer: schedule aborted")

type actorKey struct{}

func actorOf(ctx context.Context) *actor {
	a, _ := ctx.Value(actorKey{}).(*actor)
	return a
}

// actor is one participant of a schedule.
type actor struct {
	run  *run
	name string
	// ready says whether the actor can take its next step when it is
	// between two operations (nil: always). A webhook deliverer is ready
	// once an event waits, a consumer once an outbox row does.
	ready func() bool
	wake  chan bool // true: take a step; false: abort
	parks chan park
	// armed: the actor yielded explicitly, and its next implicit yield
	// point belongs to the step that follows, not to a step of its own.
	armed bool
	// mid: parked inside an operation (a request, a completer pass), not
	// between two: switching away from it is a preemption.
	mid     bool
	aborted bool
	done    bool
	steps   int
	next    string // what its next step starts with
}

// park is an actor's report to the scheduler: parked before what, or done.
type park struct {
	what     string
	explicit bool
	done     bool
	err      error
}

// yieldPoint parks the actor of ctx (none: fixtures, the drain, the
// checker) until the scheduler picks it again. An explicit yield point
// starts a step of a loop actor or a clock; an implicit one is a pool
// acquisition or a processor call.
func yieldPoint(ctx context.Context, what string, explicit bool) error {
	a := actorOf(ctx)
	if a == nil {
		return nil
	}
	if a.aborted {
		return errAborted
	}
	if !explicit && a.armed {
		a.armed = false
		return nil
	}
	a.armed = explicit
	a.parks <- park{what: what, explicit: explicit}
	if !<-a.wake {
		return errAborted // stop set a.aborted before this wake
	}
	return nil
}

// choice is one decision of a schedule: which actor steps, which fault a
// call takes, which event a deliverer picks.
type choice struct {
	n, pick int
	// preemptive: option 0 continues an actor inside an operation, so any
	// other pick is a preemption.
	preemptive bool
}

type choiceKind int

const (
	kindActor choiceKind = iota
	kindFault
	kindPick
)

// choose returns the schedule's next decision among n options: from the
// plan while it lasts (a replay, or the prefix the depth-first search
// fixed), else from the seeded generator in random mode, else 0.
// Decisions with one option are not recorded: they are no decision.
func (r *run) choose(n int, kind choiceKind, preemptive bool) int {
	if n <= 1 {
		return 0
	}
	i := len(r.choices)
	pick := 0
	switch {
	case i < len(r.plan):
		pick = r.plan[i]
		if pick >= n {
			// The same decisions must lead to the same options: a
			// difference means something outside the schedule (a clock,
			// a goroutine) decided, and the exploration is meaningless.
			r.fail("replay diverged at decision %d: %d options, the plan picks %d", i, n, pick)
			pick = 0
		}
	case r.rng != nil:
		pick = r.randomPick(n, kind, preemptive)
	}
	r.choices = append(r.choices, choice{n: n, pick: pick, preemptive: preemptive})
	return pick
}

// randomPick biases the generator towards what finds bugs: an actor
// mostly goes on with its operation (long runs without preemption reach
// deep states), and a call mostly gets through (every fault is still
// likely within a few calls).
func (r *run) randomPick(n int, kind choiceKind, preemptive bool) int {
	switch {
	case kind == kindActor && preemptive && r.rng.Float64() < 0.6:
		return 0
	case kind == kindActor && preemptive:
		return 1 + r.rng.IntN(n-1)
	case kind == kindFault && r.rng.Float64() < 0.7:
		return 0
	case kind == kindFault:
		return 1 + r.rng.IntN(n-1)
	}
	return r.rng.IntN(n)
}

// newRNG is the generator of a random schedule's seed.
func newRNG(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }

// nextPlan is the depth-first search's step: the plan of the next schedule
// after the one that made choices, or false when every schedule within the
// preemption bound (negative: none) has run. It changes the deepest
// decision that has an option left, and lets every decision after it take
// option 0.
func nextPlan(choices []choice, bound int) ([]int, bool) {
	preemptions := make([]int, len(choices)+1)
	for i, c := range choices {
		preemptions[i+1] = preemptions[i]
		if c.preemptive && c.pick > 0 {
			preemptions[i+1]++
		}
	}
	for i := len(choices) - 1; i >= 0; i-- {
		c := choices[i]
		if c.pick+1 >= c.n || (bound >= 0 && c.preemptive && preemptions[i]+1 > bound) {
			continue
		}
		plan := make([]int, i+1)
		for j := range i {
			plan[j] = choices[j].pick
		}
		plan[i] = c.pick + 1
		return plan, true
	}
	return nil, false
}

// add starts an actor and lets it run to its first yield point, which it
// reaches without touching anything: every body starts with a yield point,
// explicit or implicit. It may be called by the running actor (a held
// call becomes an actor when the processor holds it).
func (r *run) add(name string, ready func() bool, body func(ctx context.Context) error) *actor {
	a := &actor{run: r, name: name, ready: ready, wake: make(chan bool), parks: make(chan park)}
	r.actors = append(r.actors, a)
	ctx := context.WithValue(r.ctx, actorKey{}, a)
	go func() {
		var err error
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
			a.parks <- park{done: true, err: err}
		}()
		err = body(ctx)
	}()
	r.await(a)
	return a
}

// await waits for a to park or end.
func (r *run) await(a *actor) {
	timer := time.NewTimer(stuckAfter)
	defer timer.Stop()
	select {
	case p := <-a.parks:
		switch {
		case p.done:
			a.done, a.mid = true, false
			if p.err != nil && !errors.Is(p.err, errAborted) {
				r.fail("%s: %v", a.name, p.err)
			}
		default:
			a.next, a.mid = p.what, !p.explicit && a.steps > 0
		}
	case <-timer.C:
		r.stuck = a
		r.fail("%s did not reach its next yield point within %s: stuck (waiting for a lock or a mutex that a parked actor holds?)\n%s",
			a.name, stuckAfter, stacks())
	}
}

// stacks returns the stacks of the goroutines that run the code under
// exploration, for the report of a stuck schedule.
func stacks() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var keep []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "github.com/idemref/payments/internal/") && !strings.Contains(g, "(*run).await") {
			keep = append(keep, g)
		}
	}
	return strings.Join(keep, "\n\n")
}

// runnable reports whether a can take a step now.
func (a *actor) runnable() bool {
	return !a.done && (a.mid || a.ready == nil || a.ready())
}

// loop runs the schedule: until no actor can step, the run fails, or it
// takes more steps than any scenario needs (an actor that never ends).
func (r *run) loop() {
	dirty := true
	for !r.failed() {
		// A step that only called the processor changed nothing the
		// snapshot reads: it ends at the database step that follows.
		if dirty {
			r.refresh()
		}
		if r.failed() {
			return
		}
		var options []*actor
		preemptive := r.last != nil && r.last.mid && r.last.runnable()
		if preemptive {
			options = append(options, r.last)
		}
		for _, a := range r.actors {
			if a != r.last || !preemptive {
				if a.runnable() {
					options = append(options, a)
				}
			}
		}
		if len(options) == 0 {
			return
		}
		if r.steps == maxSteps {
			r.fail("the schedule did not end within %d steps", maxSteps)
			return
		}
		a := options[r.choose(len(options), kindActor, preemptive)]
		r.steps++
		r.note("%3d %-14s %s", r.steps, a.name, a.next)
		r.last = a
		dirty = !strings.HasPrefix(a.next, http.MethodGet+" ") && !strings.HasPrefix(a.next, http.MethodPost+" ") && !strings.HasPrefix(a.next, "lands ")
		a.steps++
		a.wake <- true
		r.await(a)
	}
}

// maxSteps bounds one schedule, far above what any scenario takes (the
// random one about a hundred steps).
const maxSteps = 600

// stop aborts every actor that has not ended (loop actors wait for work
// that will not come; after a failure, any actor) and waits for each to
// unwind. A stuck actor may be waiting for something an aborted actor
// releases, so it is awaited last, and aborted in turn if it parks.
func (r *run) stop() {
	stuck := r.stuck
	for _, a := range r.actors {
		if a != stuck {
			r.abort(a)
		}
	}
	if stuck != nil && !stuck.done {
		r.stuck = nil
		r.await(stuck)
		if r.stuck == nil {
			r.abort(stuck)
		}
	}
}

func (r *run) abort(a *actor) {
	for !a.done && !a.aborted && r.stuck != a {
		a.aborted = true
		a.wake <- false
		r.await(a)
	}
}

// --- Yield points in the pools and the processor's transport ---

// hookedPool is a pool whose every acquisition is a yield point of the
// actor in its context. It has room for every actor to hold a connection
// while parked (taken, not in a transaction: a parked actor locks
// nothing).
func hookedPool(ctx context.Context, dbURL string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	db.Configure(cfg)
	cfg.MaxConns = 16
	cfg.PrepareConn = func(ctx context.Context, _ *pgx.Conn) (bool, error) {
		if actorOf(ctx) == nil {
			return true, nil
		}
		return true, yieldPoint(ctx, dbCaller(), false)
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// dbCaller names a database step in a schedule's trace: the query (for a
// statement outside a transaction) or the function that runs the
// transaction.
func dbCaller() string {
	pcs := make([]uintptr, 40)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)])
	for {
		f, more := frames.Next()
		fn := f.Function
		if i := strings.LastIndex(fn, "/"); i >= 0 && !strings.Contains(fn, "jackc/") && !strings.Contains(fn, "/internal/db.") {
			name := fn[i+1:]
			return strings.TrimPrefix(name, "dbsqlc.(*Queries).")
		}
		if !more {
			return "db"
		}
	}
}

// fault is what the network and the processor do to one call.
type fault string

const (
	faultNone fault = ""
	// faultLost: the processor executes the call; its answer is lost.
	faultLost fault = "lost"
	// faultLate: the processor accepts and holds the call (its key in
	// flight), the client gives up, and the call executes later, as a
	// step of its own actor.
	faultLate fault = "late"
	// faultMalformed: the processor executes the call and a 2xx answer
	// arrives as {}: it parses, and says nothing.
	faultMalformed fault = "malformed"
	// faultServerError: the processor answers 500 without executing.
	faultServerError fault = "500"
	// faultRateLimited: the processor answers 429 without executing.
	faultRateLimited fault = "429"
	// faultReset: the connection breaks before the call arrives (a
	// lookup: nothing executes either way).
	faultReset fault = "reset"
	// faultDoubled: the charge call reaches the processor twice and both
	// answers are lost: something between our client and the processor
	// sent it again (a proxy or a mesh sidecar that retries upstream; our
	// client keeps net/http from doing so, internal/processor). A
	// processor that deduplicates replays the first charge; one that
	// ignores keys makes a second charge, under one marked call.
	// Charges only: a refund executed twice at a processor that ignores
	// keys is money sent back twice, which nothing can pull back (the
	// sweep reports it).
	faultDoubled fault = "doubled"
)

// errNoAnswer is what the client sees of a call whose answer never came:
// a connection closed after the request was sent. The processor client
// classifies it as outcome unknown.
var errNoAnswer = errors.New("explorer: the connection closed after the request was sent")

// transport carries the processor client's calls to the simulator's
// handler in this goroutine, with no network, no timeout and no clock:
// each call is a yield point, and its fault a decision of the schedule.
type transport struct {
	sim *processorsim.Simulator
	// holding is the call the simulator is about to hold (faultLate); its
	// HoldTimer hands the hold to it. Only the running actor makes calls,
	// so at most one is being admitted at a time.
	holding atomic.Pointer[heldCall]
}

// heldCall is a call the simulator holds with its key in flight. The
// simulator drops a call still held processorsim.MaxExecution (30 s) after
// it arrived; a schedule lands every held call long before that.
type heldCall struct {
	op     string
	path   string
	held   chan struct{}  // closed once the simulator holds it
	fire   chan time.Time // ends the hold: the call executes
	landed chan struct{}  // closed once it executed and answered
	rec    *httptest.ResponseRecorder
}

// land ends the hold and waits for the call to execute. Landing twice
// (the drain after the call's actor) is landing once.
func (h *heldCall) land() {
	select {
	case h.fire <- time.Now():
	default:
	}
	<-h.landed
}

func (h *heldCall) hasLanded() bool {
	select {
	case <-h.landed:
		return true
	default:
		return false
	}
}

// holdTimer is the simulator's HoldTimer: the hold ends when the held
// call's actor (or the drain) lands it.
func (tr *transport) holdTimer(time.Duration) <-chan time.Time {
	h := tr.holding.Swap(nil)
	close(h.held)
	return h.fire
}

func (tr *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		var err error
		if body, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		_ = req.Body.Close()
	}
	ctx := req.Context()
	op := req.Method + " " + req.URL.Path
	if err := yieldPoint(ctx, op, false); err != nil {
		return nil, err
	}
	// The simulator's request is a fresh one, detached from the client's
	// context: a held call outlives the client that gave up on it.
	in := httptest.NewRequest(req.Method, req.URL.RequestURI(), bytes.NewReader(body))
	in.Header = req.Header.Clone()
	f := faultNone
	if a := actorOf(ctx); a != nil {
		f = a.run.fault(req.Method, req.URL.Path)
	}
	switch f {
	case faultLate:
		return tr.hold(actorOf(ctx).run, in, op)
	case faultServerError:
		tr.sim.InjectFault(processorsim.Fault{Path: req.URL.Path, Kind: processorsim.FaultServerError})
	case faultRateLimited:
		tr.sim.InjectFault(processorsim.Fault{Path: req.URL.Path, Kind: processorsim.FaultStatus, Status: http.StatusTooManyRequests})
	case faultReset:
		return nil, errNoAnswer
	case faultDoubled:
		// The first copy executes; its answer goes nowhere.
		first := httptest.NewRequest(req.Method, req.URL.RequestURI(), bytes.NewReader(body))
		first.Header = req.Header.Clone()
		tr.sim.Handler().ServeHTTP(httptest.NewRecorder(), first)
	default:
		// faultNone, and faultLost and faultMalformed, which act once the
		// simulator has answered (below).
	}
	rec := httptest.NewRecorder()
	tr.sim.Handler().ServeHTTP(rec, in)
	switch {
	case f == faultLost, f == faultDoubled:
		return nil, errNoAnswer
	case f == faultMalformed && rec.Code/100 == 2:
		return &http.Response{
			Status: "200 OK", StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader("{}")),
			ContentLength: 2, Request: req,
		}, nil
	}
	return rec.Result(), nil
}

// hold sends the call with a late_execution fault. Once the simulator
// holds it, the client gets no answer and the call becomes an actor whose
// one step lands it. A call the simulator answers at once from its key (a
// replay, 409 for a key in flight) gets that answer: the fault is used up
// on it, as at the simulator.
func (tr *transport) hold(r *run, in *http.Request, op string) (*http.Response, error) {
	tr.sim.InjectFault(processorsim.Fault{Path: in.URL.Path, Kind: processorsim.FaultLateExecution, Latency: time.Second})
	h := &heldCall{op: op, path: in.URL.Path, held: make(chan struct{}), fire: make(chan time.Time, 1),
		landed: make(chan struct{}), rec: httptest.NewRecorder()}
	tr.holding.Store(h)
	go func() {
		defer close(h.landed)
		tr.sim.Handler().ServeHTTP(h.rec, in)
	}()
	select {
	case <-h.held:
		r.held = append(r.held, h)
		r.add(fmt.Sprintf("late-%d", len(r.held)), nil, func(ctx context.Context) error {
			if err := yieldPoint(ctx, "lands "+op, true); err != nil {
				return nil
			}
			h.land()
			return nil
		})
		return nil, errNoAnswer
	case <-h.landed:
		tr.holding.Store(nil)
		return h.rec.Result(), nil
	}
}

// fault decides what happens to the running actor's call: nothing, or one
// of the scenario's faults for the method (and path) while its budget
// lasts.
func (r *run) fault(method, path string) fault {
	set := r.sc.postFaults
	if method == http.MethodGet {
		set = r.sc.getFaults
	}
	if path != processorsim.PathCharges && slices.Contains(set, faultDoubled) {
		set = slices.DeleteFunc(slices.Clone(set), func(f fault) bool { return f == faultDoubled })
	}
	if len(set) == 0 || r.faults >= r.sc.maxFaults {
		return faultNone
	}
	k := r.choose(len(set)+1, kindFault, false)
	if k == 0 {
		return faultNone
	}
	r.faults++
	r.note("    fault: %s", set[k-1])
	return set[k-1]
}

// refundInFlight reports whether a refund call may still land: held at
// the processor, or marked (refund_calls) and not sent yet by an attempt
// that is parked, or stalled, between its mark and its call. The settle
// window is longer than any call takes from its mark to its landing
// (processorsim.MaxExecution bounds the processor's part), so no clock
// passes it while one may land. A charge may (the sweep refunds one that
// lands after the window); a refund may not: money sent back twice cannot
// be pulled back, and the sweep only reports it.
func (r *run) refundInFlight() bool {
	for _, h := range r.held {
		if h.path == processorsim.PathRefunds && !h.hasLanded() {
			return true
		}
	}
	if len(r.snap.refundMarks) == 0 {
		return false
	}
	// A call the processor answered 429 was unmarked again.
	sent := map[string]int{}
	for _, c := range r.w.sim.Calls() {
		if c.Method == http.MethodPost && c.Path == processorsim.PathRefunds && c.Status != http.StatusTooManyRequests {
			sent[c.IdempotencyKey]++
		}
	}
	for key, marks := range r.snap.refundMarks {
		if marks > sent[key] {
			return true
		}
	}
	return false
}
