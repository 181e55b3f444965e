package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	toxiclient "github.com/Shopify/toxiproxy/v2/client"
)

// scenario is one named fault, injected while clients run their load.
type scenario struct {
	id    string // its number: 1 to 12, 4a to 4c
	name  string
	about string
	// short: part of the short mode CI runs.
	short bool
	// control: the negative control, which passes only when the checker
	// finds losses.
	control bool
	async   bool
	apis    int
	// alerts is what the fault must page, and may.
	alerts alertSpec
	// fault injects the fault and returns when it is over.
	fault func(ctx context.Context, r *faultRun) error
}

// faultRun is what a scenario's fault works with.
type faultRun struct {
	d    *deployment
	rng  *rand.Rand
	long bool
	// notes are shown under the scenario's row.
	notes []string
}

func (r *faultRun) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

// hold is how long a fault lasts (or the load runs around it): short in
// CI, longer in the long mode.
func (r *faultRun) hold() time.Duration {
	if r.long {
		return 20 * time.Second
	}
	return 5 * time.Second
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// A database outage (a failover, resets, a split brain) pages with the
// 5xx share of the routes (HTTPServerErrors, whose runbook starts at the
// database). A short mode's 5 s of resets is as long as its for: long
// marks it required in the long mode only.
func dbOutagePages(long bool) []page {
	return []page{{alert: "HTTPServerErrors", within: 30 * time.Second, long: long}}
}

// dbOutageSymptoms are what a database outage may also fire: the share of
// keyed requests released transiently (a request that fails before its
// key is claimed, at authentication, is no such outcome, so it fires in
// some failovers and not in others); the relay cannot read the outbox,
// so events do not flow; the consumers hold their messages and retry.
var dbOutageSymptoms = []string{"TransientFailures", "EventsBrokerDisconnected", "ConsumersWaitForTheDatabase"}

// scenarios lists every scenario in the order they run.
func scenarios() []scenario {
	return []scenario{
		{id: "0", name: "no-fault", short: true, apis: 2, fault: noFault,
			about: "the control of the alerts: the same load and no fault; any alert that fires is a false page (X6)"},
		{id: "1", name: "leader-kill", apis: 2, fault: leaderKill,
			about:  "the Patroni leader's machine is lost (PostgreSQL and Patroni SIGKILLed) under order and payment load; Patroni promotes the synchronous standby on its own",
			alerts: alertSpec{pages: dbOutagePages(false), tolerates: dbOutageSymptoms}},
		{id: "2", name: "commit-reset", short: true, apis: 2, fault: commitReset,
			about:  "connections to the database are reset (toxiproxy reset_peer) in bursts: some during COMMIT, an unknown outcome",
			alerts: alertSpec{pages: dbOutagePages(true), tolerates: dbOutageSymptoms}},
		{id: "3", name: "pooler", apis: 3, fault: pooler,
			about: "the whole load through PgBouncer in transaction mode, three APIs, payments resumed by the completer; LISTEN on the direct URL"},
		{id: "4a", name: "nats-leader-kill", short: true, apis: 2, fault: natsLeaderKill,
			about:  "the node leading the events stream is killed while the relay publishes, then restarted",
			alerts: alertSpec{pages: []page{{alert: "EventsBrokerDisconnected", within: 20 * time.Second, long: true}}, tolerates: []string{"OutboxRelayCannotPublish"}}},
		{id: "4b", name: "nats-partition", apis: 2, fault: natsPartition,
			about:  "one NATS node, the stream's leader, is cut from the other two while the relay publishes, then healed",
			alerts: alertSpec{pages: []page{{alert: "EventsBrokerDisconnected", within: 20 * time.Second, long: true}, {alert: "OutboxRelayCannotPublish", within: 30 * time.Second, long: true}}}},
		{id: "4c", name: "nats-restarted-empty", apis: 2, fault: natsRestartedEmpty,
			about:  "every NATS node killed and started again on empty storage while the relay publishes: the APIs must set the streams and the consumer up again and publish again what the lost stream held unapplied (D7)",
			alerts: alertSpec{pages: []page{{alert: "EventsStreamsLost", within: 20 * time.Second}}, tolerates: []string{"EventsBrokerDisconnected", "OutboxRelayCannotPublish"}}},
		{id: "5", name: "processor-link", short: true, apis: 2, fault: processorLink,
			about:  "latency past the processor timeout, stalled and reset connections on the API→processor link",
			alerts: alertSpec{pages: []page{{alert: "ProcessorOutcomesUnknown", within: 30 * time.Second, long: true}}, tolerates: []string{"HTTPServerErrors"}}},
		{id: "6", name: "api-kill", apis: 3, fault: apiKill,
			about: "API processes SIGKILLed at random and restarted, during a Patroni failover and processor-link faults",
			alerts: alertSpec{pages: []page{{alert: "APIProcessDown", within: 20 * time.Second}, {alert: "HTTPServerErrors", within: 30 * time.Second}},
				tolerates: append([]string{"ProcessorOutcomesUnknown"}, dbOutageSymptoms...)}},
		{id: "8", name: "pg-restart", apis: 2, fault: pgRestart,
			about: "the leader's PostgreSQL restarted under load: patronictl restart (fast), then SIGQUIT (immediate), Patroni starting it again (T6)",
			// Restarts heal in seconds, before any for: no page, and the
			// outage's symptoms may fire.
			alerts: alertSpec{tolerates: append([]string{"HTTPServerErrors"}, dbOutageSymptoms...)}},
		{id: "9", name: "split-brain", short: true, apis: 2, fault: splitBrain,
			about:  "the leader is cut off from etcd and from its standby while the API still reaches it: Patroni must demote it before the standby takes over, then it rejoins (pg_rewind)",
			alerts: alertSpec{pages: dbOutagePages(false), tolerates: dbOutageSymptoms}},
		{id: "10", name: "rejoin", apis: 2, fault: rejoin,
			about:  "the leader is lost and Patroni fails over; the old leader comes back as a standby (pg_rewind) and a switchover back to it loses nothing",
			alerts: alertSpec{pages: dbOutagePages(false), tolerates: dbOutageSymptoms}},
		{id: "11", name: "switchover", apis: 2, fault: switchover,
			about: "a planned switchover (patronictl switchover) under load"},
		{id: "12", name: "etcd-member-kill", apis: 2, fault: etcdMemberKill,
			about: "the etcd member leading the raft group is killed: two of three keep the quorum, Patroni keeps its leader"},
		{id: "13", name: "api-process-dies", short: true, apis: 2, fault: apiProcessDies,
			about: "one API process SIGKILLed and left down, then started again: the load goes on through the other, and the person on call is paged for the one down (X6)",
			// The other process takes the whole load: its pool may fill.
			alerts: alertSpec{pages: []page{{alert: "APIProcessDown", within: 10 * time.Second}}, tolerates: []string{"DatabasePoolSaturated"}}},
		{id: "13b", name: "api-process-dies-rule-broken", short: true, apis: 2, fault: apiProcessDies,
			about: "NEGATIVE CONTROL of the alerts: scenario 13 with APIProcessDown's metric misspelled in the rules Prometheus loads: the harness must report that page missed, by name",
			alerts: alertSpec{pages: []page{{alert: "APIProcessDown", within: 10 * time.Second}}, tolerates: []string{"DatabasePoolSaturated"},
				broken: &brokenRule{alert: "APIProcessDown", metric: "up"}}},
		{id: "14", name: "processor-key-revoked", short: true, apis: 2, fault: processorKeyRevoked,
			about: "the processor answers 401 to every call, as to a revoked secret key, then serves again: payments wait unfailed, and the page names our configuration, not the processor (X6)",
			// The payments the processor refuses wait with their leases
			// expired, which the completer cannot finish either.
			alerts: alertSpec{pages: []page{{alert: "ProcessorRefusesOurConfiguration", within: 10 * time.Second}},
				tolerates: []string{"CompleterNotFinishingAbandonedPayments", "HTTPServerErrors"}}},
		{id: "15", name: "relay-cannot-publish", apis: 2, fault: relayCannotPublish,
			about:  "every connection to NATS black-holed (nothing answers, nothing closes): the relay's publishes time out while the process still counts itself connected at first (X6)",
			alerts: alertSpec{pages: []page{{alert: "OutboxRelayCannotPublish", within: 30 * time.Second}, {alert: "EventsBrokerDisconnected", within: 30 * time.Second}}}},
		{id: "16", name: "consumer-failing", apis: 2, fault: consumerFailing,
			about:  "the orders consumer's every write fails (a trigger refuses its inbox rows, as a bad migration would), then heals within the redelivery horizon: every event applied once after (X6)",
			alerts: alertSpec{pages: []page{{alert: "ConsumersKeepFailing", within: 30 * time.Second}}}},
		{id: "7", name: "async-split-brain", short: true, control: true, async: true, apis: 2, fault: asyncSplitBrain,
			about:  "NEGATIVE CONTROL: Patroni without synchronous_mode; the leader is cut off from etcd and its standby while the API writes to it, then the standby is promoted: the checker must report lost writes",
			alerts: alertSpec{unjudged: true}},
	}
}

// failover crashes the leader's machine and waits until Patroni has
// promoted the standby on its own.
func failover(ctx context.Context, r *faultRun) (old int, err error) {
	start := time.Now()
	old, err = r.d.pg.CrashLeader()
	if err != nil {
		return old, err
	}
	leader, err := r.d.pg.WaitLeader(ctx, old)
	if err != nil {
		return old, err
	}
	r.note("Patroni promoted %s %s after the crash (ttl %s, loop_wait %s, retry_timeout %s)",
		r.d.pg.Name(leader), time.Since(start).Round(100*time.Millisecond), patroniTTL, patroniLoopWait, patroniRetryTimeout)
	return old, nil
}

func leaderKill(ctx context.Context, r *faultRun) error {
	if _, err := failover(ctx, r); err != nil {
		return err
	}
	sleep(ctx, r.hold())
	return nil
}

// commitReset resets every open database connection, at random moments:
// whatever is on the wire then, a COMMIT among them, never gets its
// answer.
func commitReset(ctx context.Context, r *faultRun) error {
	l := r.d.dbLinks[r.d.pg.Leader()]
	end := time.Now().Add(r.hold())
	bursts := 0
	for time.Now().Before(end) && ctx.Err() == nil {
		sleep(ctx, time.Duration(200+r.rng.IntN(400))*time.Millisecond)
		if err := l.Toxic("reset", "reset_peer", "upstream", 1, toxiclient.Attributes{"timeout": 0}); err != nil {
			return err
		}
		sleep(ctx, time.Duration(20+r.rng.IntN(60))*time.Millisecond)
		if err := l.Clear(); err != nil {
			return err
		}
		bursts++
	}
	r.note("%d bursts of resets", bursts)
	return nil
}

// noFault holds the load for as long as a fault would last.
func noFault(ctx context.Context, r *faultRun) error {
	sleep(ctx, r.hold())
	return nil
}

// apiProcessDies kills the second API process and starts it again after
// the fault's hold.
func apiProcessDies(ctx context.Context, r *faultRun) error {
	return r.d.killAPI(ctx, 1, r.hold())
}

// processorKeyRevoked has the simulator refuse every call with 401 for
// the fault's hold.
func processorKeyRevoked(ctx context.Context, r *faultRun) error {
	if err := setProcessorMode(ctx, r.d.processorURL, `{"refuse_key":true}`); err != nil {
		return err
	}
	sleep(ctx, r.hold())
	return setProcessorMode(context.WithoutCancel(ctx), r.d.processorURL, `{"refuse_key":false}`)
}

func setProcessorMode(ctx context.Context, processorURL, body string) error {
	var mode map[string]any
	return doJSON(ctx, http.MethodPost, processorURL+"/_sim/mode", body, &mode)
}

// stalledHold is how long the faults whose page waits "for: 10m" last:
// ten seconds of the harness (timeScale), and as much again for the
// alert's window to fill and for Alertmanager to notify.
const stalledHold = 25 * time.Second

// relayCannotPublish black-holes every NATS link both ways: data is
// dropped, connections stay open, so a publish waits for an
// acknowledgement that never comes.
func relayCannotPublish(ctx context.Context, r *faultRun) error {
	for _, l := range r.d.natsLinks {
		for _, stream := range []string{"upstream", "downstream"} {
			if err := l.Toxic("blackhole-"+stream, "timeout", stream, 1, toxiclient.Attributes{"timeout": 0}); err != nil {
				return err
			}
		}
	}
	sleep(ctx, max(r.hold(), stalledHold))
	var err error
	for _, l := range r.d.natsLinks {
		err = errors.Join(err, l.Clear())
	}
	return err
}

// consumerFailing makes every insert of the orders consumer's inbox rows
// fail for the fault's hold: each event's effect rolls back and is
// redelivered after the backoff. The hold stays well inside the
// redelivery horizon (EVENTS_ACK_WAIT 3s doubling over 5 deliveries), so
// no event is dead-lettered.
func consumerFailing(ctx context.Context, r *faultRun) error {
	const install = `CREATE FUNCTION chaos_refuse_inbox() RETURNS trigger LANGUAGE plpgsql AS
$$BEGIN RAISE EXCEPTION 'chaos: the consumer''s writes are refused'; END$$;
CREATE TRIGGER chaos_refuse_inbox BEFORE INSERT ON processed_messages
FOR EACH ROW WHEN (NEW.consumer = 'orders') EXECUTE FUNCTION chaos_refuse_inbox()`
	const remove = `DROP TRIGGER chaos_refuse_inbox ON processed_messages; DROP FUNCTION chaos_refuse_inbox()`
	if _, err := r.d.check.Exec(ctx, install); err != nil {
		return err
	}
	sleep(ctx, max(r.hold(), stalledHold))
	_, err := r.d.check.Exec(context.WithoutCancel(ctx), remove)
	return err
}

// pooler adds no fault: the load itself, through PgBouncer in
// transaction mode with three APIs, is the test.
func pooler(ctx context.Context, r *faultRun) error {
	sleep(ctx, r.hold())
	return nil
}

func natsLeaderKill(ctx context.Context, r *faultRun) error {
	leader, err := r.d.nats.StreamLeader(eventsStream)
	if err != nil {
		return err
	}
	r.d.nats.Kill(leader)
	r.note("killed NATS node %d, the stream's leader", leader)
	sleep(ctx, r.hold())
	return r.d.nats.Restart(leader)
}

func natsPartition(ctx context.Context, r *faultRun) error {
	leader, err := r.d.nats.StreamLeader(eventsStream)
	if err != nil {
		return err
	}
	if err := r.d.nats.Partition(leader); err != nil {
		return err
	}
	r.note("partitioned NATS node %d, the stream's leader", leader)
	sleep(ctx, r.hold())
	return r.d.nats.Heal(leader)
}

// natsRestartedEmpty loses the whole cluster's storage under load, once
// the APIs have set the stream up and events flow (their recovery is
// tested, not their start), and notes how soon the APIs had the events
// stream back on every node: only they create it.
func natsRestartedEmpty(ctx context.Context, r *faultRun) error {
	waitCtx, cancel := context.WithTimeout(ctx, natsSettle)
	defer cancel()
	held, err := r.d.nats.WaitStreamMessages(waitCtx, eventsStream)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := r.d.nats.RestartEmpty(); err != nil {
		return err
	}
	r.note("the %d NATS nodes restarted on empty storage in %s; the events stream held %d messages", natsNodes, time.Since(start).Round(100*time.Millisecond), held)
	restarted := time.Now()
	waitCtx, cancel = context.WithTimeout(ctx, natsSettle)
	defer cancel()
	if err := r.d.nats.WaitStreamHealthy(waitCtx, eventsStream); err != nil {
		return fmt.Errorf("the APIs did not create the events stream again: %w", err)
	}
	r.note("the APIs had created the events stream again, 3 replicas current, %s after the restart", time.Since(restarted).Round(100*time.Millisecond))
	sleep(ctx, r.hold())
	return nil
}

// processorLink makes the processor slow past the API's timeout, then
// stalls, then resets its connections: each a call whose outcome the API
// cannot know.
func processorLink(ctx context.Context, r *faultRun) error {
	l := r.d.procLink
	phase := r.hold() / 3
	steps := []struct {
		kind  string
		attrs toxiclient.Attributes
	}{
		{"latency", toxiclient.Attributes{"latency": 2500, "jitter": 1000}},
		{"timeout", toxiclient.Attributes{"timeout": 0}},
		{"reset_peer", toxiclient.Attributes{"timeout": 500}},
	}
	for _, s := range steps {
		if err := l.Toxic(s.kind, s.kind, "downstream", 0.5, s.attrs); err != nil {
			return err
		}
		sleep(ctx, phase)
		if err := l.Clear(); err != nil {
			return err
		}
	}
	return nil
}

// apiKill kills a random API process every second or two while the
// primary fails over and the processor link misbehaves.
func apiKill(ctx context.Context, r *faultRun) error {
	killCtx, stopKilling := context.WithCancel(ctx)
	killed := make(chan int, 1)
	go func() {
		n := 0
		defer func() { killed <- n }()
		for killCtx.Err() == nil {
			sleep(killCtx, time.Duration(800+r.rng.IntN(1200))*time.Millisecond)
			if killCtx.Err() != nil {
				return
			}
			if err := r.d.killAPI(killCtx, r.rng.IntN(len(r.d.apiURLs)), 300*time.Millisecond); err != nil {
				r.note("restart an API: %v", err)
				return
			}
			n++
		}
	}()
	_, failErr := failover(ctx, r)
	err := errors.Join(processorLink(ctx, r), failErr)
	sleep(ctx, r.hold()/2)
	stopKilling()
	r.note("%d API processes killed", <-killed)
	return err
}

func pgRestart(ctx context.Context, r *faultRun) error {
	for _, mode := range []string{"fast", "immediate"} {
		start := time.Now()
		if err := r.d.pg.RestartLeader(ctx, mode); err != nil {
			return err
		}
		r.note("restart (%s) of the leader took %s, until its standby streamed again", mode, time.Since(start).Round(time.Millisecond))
		sleep(ctx, r.hold()/2)
	}
	return nil
}
