package outbox_test

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemref/payments/internal/broker"
	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/events"
	"github.com/idemref/payments/internal/outbox"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/natstmp"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

func TestMain(m *testing.M) { testdb.Main(m) }

type bundle struct {
	pool   *pgxpool.Pool
	nats   *natstmp.Server
	js     jetstream.JetStream
	tenant uuid.UUID
}

// setup gives a test its own database and its own embedded JetStream with
// the streams created.
func setup(t *testing.T) *bundle {
	t.Helper()
	pool, _ := testdb.NewPool(t)
	ns, _, js := testkit.Broker(t, broker.Config{})
	tenant, _, err := tenants.Create(t.Context(), pool, "outbox")
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{pool: pool, nats: ns, js: js, tenant: tenant}
}

// runRelay runs relay until the test ends.
func runRelay(t *testing.T, relay *outbox.Relay) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		relay.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// unpublished counts the outbox rows not marked published.
func (f *bundle) unpublished(t *testing.T) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// streamIDs returns the Nats-Msg-Id of every message on the events
// stream, in stream order.
func (f *bundle) streamIDs(t *testing.T) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	s, err := f.js.Stream(ctx, broker.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.Header.Get("Nats-Msg-Id"))
	}
	return ids
}

// testEvent is an event of no domain: the outbox and its relay carry any
// type and payload (the stream takes every subject under
// events.SubjectPrefix).
const testEvent = "test.written"

// testPayload is testEvent's data.
type testPayload struct {
	N int `json:"n"`
}

// write commits one event in its own transaction and returns its id.
func (f *bundle) write(t *testing.T) uuid.UUID {
	t.Helper()
	tx, err := f.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(t.Context()))
	id, err := outbox.Write(t.Context(), tx, f.tenant, testEvent, testPayload{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	return id
}

// M2: the relay never publishes past a transaction still in flight. A
// transaction that wrote its row first (lower seq) but has not committed
// holds back the row of a later transaction that did commit; once it
// commits, both go out in seq order. Without the snapshot guard the later
// row is published first and a reader following the outbox by position
// would step over the earlier one.
func TestRelayWaitsForTransactionsInFlight(t *testing.T) {
	t.Parallel()
	f := setup(t)
	relay := outbox.NewRelay(f.pool, f.js, outbox.RelayConfig{})

	slow, err := f.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(context.WithoutCancel(t.Context()))
	first, err := outbox.Write(t.Context(), slow, f.tenant, testEvent, testPayload{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	second := f.write(t)

	n, err := relay.RelayOnce(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("published %d rows while an earlier transaction was in flight, want 0 (stream: %v)", n, f.streamIDs(t))
	}
	if err := slow.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Transaction ids are cluster-wide: a transaction of another test may
	// hold the guard back a moment longer, never past its own end.
	published := 0
	testkit.WaitFor(t, 10*time.Second, func() bool {
		n, err := relay.RelayOnce(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		published += n
		return published >= 2
	})
	if published != 2 {
		t.Fatalf("after the commit: published %d, want 2", published)
	}
	got := f.streamIDs(t)
	if len(got) != 2 || got[0] != first.String() || got[1] != second.String() {
		t.Errorf("stream = %v, want [%s %s] (seq order)", got, first, second)
	}
	if n, err := relay.RelayOnce(t.Context()); err != nil || n != 0 {
		t.Errorf("a third pass published %d, %v; want 0: every row is marked", n, err)
	}
}

// The relay wakes on the outbox's NOTIFY: with polling set to a minute, a
// committed row is on the stream within seconds.
func TestRelayWakesOnNotify(t *testing.T) {
	t.Parallel()
	f := setup(t)
	relay := outbox.NewRelay(f.pool, f.js, outbox.RelayConfig{PollInterval: time.Minute})
	runRelay(t, relay)
	// The first row may be found by the relay's first drain; once it is on
	// the stream the relay waits for a notification, and only the NOTIFY
	// of the second row's commit can wake it within the minute.
	first := f.write(t)
	testkit.WaitFor(t, 10*time.Second, func() bool { return len(f.streamIDs(t)) == 1 })
	second := f.write(t)
	testkit.WaitFor(t, 10*time.Second, func() bool { return len(f.streamIDs(t)) == 2 })
	if ids := f.streamIDs(t); ids[0] != first.String() || ids[1] != second.String() {
		t.Errorf("stream = %v, want [%s %s]", ids, first, second)
	}
}

// slowStream is the events stream behind a broker that stalls: the publish
// of the row named stall does not return until release is closed (or the
// publish's context ends). It records which rows it was asked to publish.
type slowStream struct {
	jetstream.JetStream
	stall   string
	stalled chan struct{} // closed when the stalled publish began
	release chan struct{}

	mu        sync.Mutex
	published []string // the rows whose publish was acknowledged
}

func (s *slowStream) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	var ev events.Envelope
	if err := json.Unmarshal(msg.Data, &ev); err != nil {
		return nil, err
	}
	id := ev.ID.String()
	if id == s.stall {
		close(s.stalled)
		select {
		case <-s.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	ack, err := s.JetStream.PublishMsg(ctx, msg, opts...)
	if err == nil {
		s.mu.Lock()
		s.published = append(s.published, id)
		s.mu.Unlock()
	}
	return ack, err
}

func (s *slowStream) rows() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.published)
}

// M2: a batch publishes only while its claim holds. The first relay claims
// three rows, publishes the first, and stalls on the second for longer than
// its claim (1 s). A second relay claims whatever has become claimable and
// publishes it. No row is published by both: without the budget the first
// relay, still holding its batch in its own view, published the second and
// third rows after the second relay had claimed and published them (and
// the first row too, never marked), two relays publishing the same rows at
// once.
func TestRelayPublishesOnlyWhileItsClaimHolds(t *testing.T) {
	t.Parallel()
	f := setup(t)
	first, second, third := f.write(t), f.write(t), f.write(t)
	slow := &slowStream{JetStream: f.js, stall: second.String(), stalled: make(chan struct{}), release: make(chan struct{})}
	const hold = time.Second
	stalling := outbox.NewRelay(f.pool, slow, outbox.RelayConfig{ClaimHold: hold, PublishTimeout: time.Minute})
	healthy := &slowStream{JetStream: f.js}
	other := outbox.NewRelay(f.pool, healthy, outbox.RelayConfig{ClaimHold: hold})

	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	// Transaction ids are cluster-wide: another test's transaction may hold
	// the snapshot guard back for a moment. Once it admits all three rows,
	// one claim takes them.
	testkit.WaitFor(t, 10*time.Second, func() bool {
		var n int
		if err := f.pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox WHERE xid < pg_snapshot_xmin(pg_current_snapshot())`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 3
	})
	go func() {
		n, err := stalling.RelayOnce(t.Context())
		done <- result{n, err}
	}()
	select {
	case <-slow.stalled:
	case res := <-done:
		t.Fatalf("the relay returned (%d rows, %v) before it published the second row", res.n, res.err)
	}
	// The other relay finds nothing to claim while the first one's claim
	// holds, then takes what it can.
	testkit.WaitFor(t, 10*time.Second, func() bool {
		n, err := other.RelayOnce(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	close(slow.release) // the stalled publish returns, if it still waits
	res := <-done
	t.Logf("the stalling relay published %d rows (%v)", res.n, res.err)

	both := map[string]bool{}
	for _, id := range slow.rows() {
		both[id] = true
	}
	var twice []string
	for _, id := range healthy.rows() {
		if both[id] {
			twice = append(twice, id)
		}
	}
	if len(twice) > 0 {
		t.Errorf("rows published by both relays: %v (the stalling relay published %v, the other %v)", twice, slow.rows(), healthy.rows())
	}
	if got, want := slow.rows(), []string{first.String()}; !slices.Equal(got, want) {
		t.Errorf("the stalling relay published %v, want %v: only what it published before its claim lapsed", got, want)
	}
	if got, want := healthy.rows(), []string{second.String(), third.String()}; !slices.Equal(got, want) {
		t.Errorf("the other relay published %v, want %v", got, want)
	}
	if got, want := f.streamIDs(t), []string{first.String(), second.String(), third.String()}; !slices.Equal(got, want) {
		t.Errorf("stream = %v, want %v (seq order)", got, want)
	}
	if n := f.unpublished(t); n != 0 {
		t.Errorf("unpublished rows = %d, want 0", n)
	}
}

// D3: the relay's LISTEN connection comes from RelayConfig.ListenPool,
// the pool that reaches PostgreSQL directly, while its claims and marks
// go through its own pool (behind a transaction-mode pooler in
// production, where a LISTEN would hear nothing). The two pools name
// their sessions apart in pg_stat_activity: the one session whose last
// statement is a LISTEN is the listen pool's, the relay holds a
// connection of that pool, and committed rows wake the relay within
// seconds although it polls once a minute.
func TestRelayListensOnItsListenPool(t *testing.T) {
	t.Parallel()
	f := setup(t)
	// pool opens a pool on the test's database whose sessions carry name.
	pool := func(name string) *pgxpool.Pool {
		cfg := f.pool.Config()
		cfg.ConnConfig.RuntimeParams["application_name"] = name
		p, err := pgxpool.NewWithConfig(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	own, listen := pool("relay-own"), pool("relay-listen")
	relay := outbox.NewRelay(own, f.js, outbox.RelayConfig{PollInterval: time.Minute, ListenPool: listen})
	runRelay(t, relay)

	// The sessions whose last statement was a LISTEN, by pool. Every test
	// has a database of its own: current_database() scopes them to this
	// test.
	var listeners []string
	testkit.WaitFor(t, 10*time.Second, func() bool {
		err := f.pool.QueryRow(t.Context(), `SELECT coalesce(array_agg(application_name ORDER BY application_name), '{}')
			FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%'`).Scan(&listeners)
		if err != nil {
			t.Fatal(err)
		}
		return len(listeners) > 0
	})
	if !slices.Equal(listeners, []string{"relay-listen"}) {
		t.Errorf("LISTEN sessions of pools %q, want one of the listen pool (relay-listen)", listeners)
	}
	if n := listen.Stat().AcquiredConns(); n != 1 {
		t.Errorf("the relay holds %d connections of the listen pool, want 1", n)
	}

	// And the relay hears there: with polling at a minute, rows reach the
	// stream within seconds. The second row is committed once the first
	// is on the stream, when the relay is back to waiting on its LISTEN
	// connection for the NOTIFY of the next commit.
	first := f.write(t)
	testkit.WaitFor(t, 10*time.Second, func() bool { return len(f.streamIDs(t)) == 1 })
	second := f.write(t)
	testkit.WaitFor(t, 10*time.Second, func() bool { return len(f.streamIDs(t)) == 2 })
	if ids := f.streamIDs(t); ids[0] != first.String() || ids[1] != second.String() {
		t.Errorf("stream = %v, want [%s %s]", ids, first, second)
	}
}

// G4: a relay that is stopped mid-batch hands the rest of its batch back.
// It claims three rows for an hour, publishes the first and is stopped
// while the second's publish waits for the broker. The first is marked
// published; the other two are released at once, so another relay, also
// claiming for an hour, publishes them now. Without the release they
// stayed claimed for the hour, and the other relay found nothing to claim.
func TestRelayStoppedMidBatchHandsTheRestBack(t *testing.T) {
	t.Parallel()
	f := setup(t)
	first, second, third := f.write(t), f.write(t), f.write(t)
	slow := &slowStream{JetStream: f.js, stall: second.String(), stalled: make(chan struct{}), release: make(chan struct{})}
	const hold = time.Hour
	stopping := outbox.NewRelay(f.pool, slow, outbox.RelayConfig{ClaimHold: hold, PublishTimeout: time.Hour})
	other := outbox.NewRelay(f.pool, f.js, outbox.RelayConfig{ClaimHold: hold})
	// As in TestRelayPublishesOnlyWhileItsClaimHolds: one claim takes all
	// three once the snapshot guard admits them.
	testkit.WaitFor(t, 10*time.Second, func() bool {
		var n int
		if err := f.pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox WHERE xid < pg_snapshot_xmin(pg_current_snapshot())`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 3
	})

	ctx, stop := context.WithCancel(t.Context())
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := stopping.RelayOnce(ctx)
		done <- result{n, err}
	}()
	select {
	case <-slow.stalled:
	case res := <-done:
		t.Fatalf("the relay returned (%d rows, %v) before it published the second row", res.n, res.err)
	}
	stop()
	res := <-done
	if res.n != 1 {
		t.Errorf("the stopped relay published %d rows (%v), want 1: the one before the stop", res.n, res.err)
	}

	var published, claimed int
	if err := f.pool.QueryRow(t.Context(), `SELECT count(*) FILTER (WHERE published_at IS NOT NULL),
		count(*) FILTER (WHERE published_at IS NULL AND claimed_until IS NOT NULL) FROM outbox`).Scan(&published, &claimed); err != nil {
		t.Fatal(err)
	}
	if published != 1 || claimed != 0 {
		t.Errorf("after the stop: %d rows published, %d still claimed; want 1 and 0 (the rest handed back)", published, claimed)
	}
	n, err := other.RelayOnce(t.Context())
	if err != nil || n != 2 {
		t.Errorf("the other relay published %d rows (%v), want 2 at once: the rows the stopped relay handed back", n, err)
	}
	if got, want := f.streamIDs(t), []string{first.String(), second.String(), third.String()}; !slices.Equal(got, want) {
		t.Errorf("stream = %v, want %v (seq order)", got, want)
	}
}

// A release is fenced by its claim: a relay whose claim lapsed, and whose
// rows another relay has claimed since, releases nothing. Without the
// fence it cleared the other relay's claim while that one was still
// publishing, and a third relay could claim the same rows.
func TestRelayReleasesOnlyItsOwnClaim(t *testing.T) {
	t.Parallel()
	f := setup(t)
	id := f.write(t)
	q := dbsqlc.New(f.pool)
	// claim claims the row for hold, once the snapshot guard admits it.
	claim := func(hold time.Duration) *time.Time {
		var rows []dbsqlc.OutboxClaimRow
		testkit.WaitFor(t, 10*time.Second, func() bool {
			var err error
			rows, err = q.OutboxClaim(t.Context(), dbsqlc.OutboxClaimParams{HoldSeconds: hold.Seconds(), MaxRows: db.Int32(10)})
			if err != nil {
				t.Fatal(err)
			}
			return len(rows) == 1
		})
		return rows[0].ClaimedUntil
	}
	lapsed := claim(time.Millisecond)
	current := claim(time.Hour) // claimable again once the first claim lapsed
	if err := q.OutboxRelease(t.Context(), dbsqlc.OutboxReleaseParams{Ids: []uuid.UUID{id}, ClaimedUntil: lapsed}); err != nil {
		t.Fatal(err)
	}
	var claimedUntil *time.Time
	if err := f.pool.QueryRow(t.Context(), `SELECT claimed_until FROM outbox WHERE id = $1`, id).Scan(&claimedUntil); err != nil {
		t.Fatal(err)
	}
	if claimedUntil == nil || !claimedUntil.Equal(*current) {
		t.Errorf("claimed_until = %v after the lapsed claim's release, want the current claim's %v", claimedUntil, *current)
	}
	if err := q.OutboxRelease(t.Context(), dbsqlc.OutboxReleaseParams{Ids: []uuid.UUID{id}, ClaimedUntil: current}); err != nil {
		t.Fatal(err)
	}
	if err := f.pool.QueryRow(t.Context(), `SELECT claimed_until FROM outbox WHERE id = $1`, id).Scan(&claimedUntil); err != nil || claimedUntil != nil {
		t.Errorf("claimed_until = %v (%v) after the current claim's release, want NULL", claimedUntil, err)
	}
}

// The lag gauges follow a publish outage: with the broker down and a row
// waiting, outbox_unpublished_rows counts it and outbox_lag_seconds is at
// least its age, on every drain, although no drain publishes anything.
// They used to be observed only after a drain that published all it
// claimed, so an outage, when the lag grows, left them at their last value.
// Not parallel: the gauges are the process's, and other tests' relays
// set them too.
func TestRelayObservesTheLagDuringAPublishOutage(t *testing.T) {
	f := setup(t)
	relay := outbox.NewRelay(f.pool, f.js, outbox.RelayConfig{PollInterval: 100 * time.Millisecond, PublishTimeout: 200 * time.Millisecond})
	runRelay(t, relay)
	// A first drain with nothing waiting sets both gauges to 0.
	testkit.WaitFor(t, 10*time.Second, func() bool { return testkit.Gauge(t, "outbox_unpublished_rows") == 0 })

	f.nats.Shutdown()
	f.write(t)
	// The gauges must follow the row's age while the broker is down: read
	// until they show it older than this.
	const age = 1.5 // seconds
	var rows, lag float64
	defer func() {
		if t.Failed() {
			t.Logf("during the outage: outbox_unpublished_rows %v, outbox_lag_seconds %v; want 1 and at least %v", rows, lag, age)
		}
	}()
	testkit.WaitFor(t, 10*time.Second, func() bool {
		rows, lag = testkit.Gauge(t, "outbox_unpublished_rows"), testkit.Gauge(t, "outbox_lag_seconds")
		return rows == 1 && lag >= age
	})
	if n := f.unpublished(t); n != 1 {
		t.Fatalf("unpublished rows = %d, want 1: the broker is down", n)
	}
}

// D7: after the broker lost the events stream, Requeue hands back to the
// relay exactly the published events of the consumer's subjects that its
// inbox has not recorded, written after the inbox's horizon: not one it
// applied, not one older than the horizon (its inbox row may be pruned,
// and a republish would apply it twice), not another subject's. A second
// call finds nothing more.
func TestRequeueHandsBackOnlyUnappliedEventsInsideTheHorizon(t *testing.T) {
	t.Parallel()
	f := setup(t)
	applied, unapplied, old, otherConsumers := f.write(t), f.write(t), f.write(t), f.write(t)
	tx, err := f.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	otherSubject, err := outbox.Write(t.Context(), tx, f.tenant, "test.other", testPayload{N: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`UPDATE outbox SET published_at = now()`,
		`UPDATE outbox SET created_at = now() - interval '2 hours' WHERE id = '` + old.String() + `'`,
		`UPDATE processed_messages_horizon SET pruned_through = now() - interval '1 hour'`,
		`INSERT INTO processed_messages (consumer, source, message_id) VALUES
		   ('c', '` + events.Source + `', '` + applied.String() + `'),
		   ('another', '` + events.Source + `', '` + otherConsumers.String() + `')`,
	} {
		if _, err := f.pool.Exec(t.Context(), sql); err != nil {
			t.Fatal(err)
		}
	}
	n, err := outbox.Requeue(t.Context(), f.pool, "c", []string{events.Subject(testEvent)})
	if err != nil || n != 2 {
		t.Errorf("Requeue = %d, %v; want 2", n, err)
	}
	rows, err := f.pool.Query(t.Context(), `SELECT id FROM outbox WHERE published_at IS NULL ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	requeued, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatal(err)
	}
	if want := []uuid.UUID{unapplied, otherConsumers}; !slices.Equal(requeued, want) {
		t.Errorf("requeued %v, want %v (not the applied %s, the old %s, the other subject's %s)", requeued, want, applied, old, otherSubject)
	}
	if n, err := outbox.Requeue(t.Context(), f.pool, "c", []string{events.Subject(testEvent)}); err != nil || n != 0 {
		t.Errorf("a second Requeue = %d, %v; want 0", n, err)
	}
}
