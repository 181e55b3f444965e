package main

import (
	"context"
	"fmt"
	"time"
)

// The scenarios of the orchestrator itself (D6): Patroni fencing a
// cut-off leader, rejoining a former one, a planned switchover and the
// loss of an etcd member.

// isolation is what a watcher saw of a cut-off leader, straight from its
// PostgreSQL (the harness reaches it directly, like the API).
type isolation struct {
	// demotedAfter: from the cut until the node stopped accepting writes
	// (in recovery, or not answering at all).
	demotedAfter time.Duration
	demoted      bool
	// maxSyncRepWaits is the most commits seen waiting at once for the
	// standby's confirmation (wait_event SyncRep): written locally,
	// not acknowledged, and never to be.
	maxSyncRepWaits int
	// writableAnswers counts the polls it answered as a writable
	// primary.
	writableAnswers int
}

// watchIsolated polls member i every 100 ms until ctx ends, and returns
// what it saw then.
func watchIsolated(ctx context.Context, r *faultRun, i int, start time.Time) <-chan isolation {
	out := make(chan isolation, 1)
	url := r.d.pg.adminURL(i)
	go func() {
		var seen isolation
		defer func() { out <- seen }()
		for ctx.Err() == nil {
			var inRecovery bool
			var waits int
			err := pgQueryRow(ctx, url,
				"SELECT pg_is_in_recovery(), count(*) FILTER (WHERE wait_event = 'SyncRep') FROM pg_stat_activity", nil,
				&inRecovery, &waits)
			if ctx.Err() != nil {
				return
			}
			if err != nil || inRecovery {
				if !seen.demoted {
					seen.demoted, seen.demotedAfter = true, time.Since(start)
				}
			} else if !seen.demoted {
				seen.writableAnswers++
				seen.maxSyncRepWaits = max(seen.maxSyncRepWaits, waits)
			}
			sleep(ctx, 100*time.Millisecond)
		}
	}()
	return out
}

// isolateLeader cuts the leader off from etcd and its standby while the
// API still reaches it, waits until Patroni has promoted the standby, and
// notes how the cut-off leader fared. It returns the old leader's index.
func isolateLeader(ctx context.Context, r *faultRun) (int, error) {
	old := r.d.pg.Leader()
	start := time.Now()
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watched := watchIsolated(watchCtx, r, old, start)
	if err := r.d.pg.Isolate(old); err != nil {
		return old, err
	}
	leader, err := r.d.pg.WaitLeader(ctx, old)
	if err != nil {
		return old, err
	}
	promotedAfter := time.Since(start)
	stopWatch()
	seen := <-watched
	if !seen.demoted {
		return old, fmt.Errorf("%s, cut off, still accepted writes when %s was promoted: two writable leaders",
			r.d.pg.Name(old), r.d.pg.Name(leader))
	}
	r.note("%s cut off from etcd and its standby: it demoted itself %s after the cut (retry_timeout %s); %s was promoted after %s (ttl %s)",
		r.d.pg.Name(old), seen.demotedAfter.Round(100*time.Millisecond), patroniRetryTimeout,
		r.d.pg.Name(leader), promotedAfter.Round(100*time.Millisecond), patroniTTL)
	r.note("while cut off and writable it answered %d polls; at most %d commits at once waited there for the standby: written on it alone, never acknowledged, rewound away",
		seen.writableAnswers, seen.maxSyncRepWaits)
	return old, nil
}

// splitBrain is scenario 9: the leader cut off, demoted and replaced, then
// the links healed and the old leader back as a standby.
func splitBrain(ctx context.Context, r *faultRun) error {
	old, err := isolateLeader(ctx, r)
	if err != nil {
		return err
	}
	sleep(ctx, r.hold())
	before := logSize(r.d.pg.members[old].logPath)
	start := time.Now()
	if err := r.d.pg.Heal(old); err != nil {
		return err
	}
	if err := r.d.pg.WaitStandby(ctx, old); err != nil {
		return err
	}
	r.note("healed: %s streams from %s again %s later (pg_rewind ran: %t)", r.d.pg.Name(old), r.d.pg.Name(r.d.pg.Leader()),
		time.Since(start).Round(100*time.Millisecond), logHas(r.d.pg.members[old].logPath, before, "pg_rewind exit code=0"))
	return nil
}

// rejoin is scenario 10: the leader lost and failed over, the old leader
// started again (Patroni rewinds it), and a switchover back to it.
func rejoin(ctx context.Context, r *faultRun) error {
	old, err := failover(ctx, r)
	if err != nil {
		return err
	}
	sleep(ctx, r.hold()/2)
	start := time.Now()
	rewound, err := r.d.pg.Rejoin(ctx, old)
	if err != nil {
		return err
	}
	r.note("%s started again and streams as the synchronous standby %s later (pg_rewind ran: %t)",
		r.d.pg.Name(old), time.Since(start).Round(100*time.Millisecond), rewound)
	sleep(ctx, r.hold()/2)
	start = time.Now()
	if err := r.d.pg.Switchover(ctx, old); err != nil {
		return err
	}
	r.note("switched over back to %s in %s", r.d.pg.Name(old), time.Since(start).Round(100*time.Millisecond))
	sleep(ctx, r.hold()/2)
	return nil
}

// switchover is scenario 11: the planned change of leader an upgrade or
// a maintenance window makes.
func switchover(ctx context.Context, r *faultRun) error {
	candidate := 1 - r.d.pg.Leader()
	start := time.Now()
	if err := r.d.pg.Switchover(ctx, candidate); err != nil {
		return err
	}
	r.note("patronictl switchover to %s returned and it led %s after the request", r.d.pg.Name(candidate), time.Since(start).Round(100*time.Millisecond))
	if err := r.d.pg.WaitStandby(ctx, 1-candidate); err != nil {
		return err
	}
	sleep(ctx, r.hold())
	return nil
}

// etcdMemberKill is scenario 12: the etcd raft leader dies; the other two
// keep the quorum, and Patroni must keep its leader all along, on the same
// timeline (no failover, no demotion).
func etcdMemberKill(ctx context.Context, r *faultRun) error {
	victim, err := r.d.pg.etcd.Leader(ctx)
	if err != nil {
		return err
	}
	leader := r.d.pg.Leader()
	before, err := r.d.pg.Status(ctx, leader)
	if err != nil {
		return err
	}
	r.d.pg.etcd.Kill(victim)
	end := time.Now().Add(r.hold())
	polls := 0
	for time.Now().Before(end) && ctx.Err() == nil {
		st, err := r.d.pg.Status(ctx, leader)
		if err != nil {
			return fmt.Errorf("after etcd%d was killed: %w", victim, err)
		}
		if !st.leads() || st.Timeline != before.Timeline {
			return fmt.Errorf("after etcd%d was killed, %s is %s/%s on timeline %d (was the leader on %d)",
				victim, r.d.pg.Name(leader), st.Role, st.State, st.Timeline, before.Timeline)
		}
		polls++
		sleep(ctx, 200*time.Millisecond)
	}
	r.note("etcd%d, the raft leader, killed: %s led on timeline %d at each of %d polls over %s",
		victim, r.d.pg.Name(leader), before.Timeline, polls, r.hold())
	return nil
}

// asyncSplitBrain is the negative control: without synchronous_mode the
// cut-off leader acknowledges writes its standby never receives until it
// demotes itself, and the standby is promoted without them.
func asyncSplitBrain(ctx context.Context, r *faultRun) error {
	if _, err := isolateLeader(ctx, r); err != nil {
		return err
	}
	sleep(ctx, r.hold())
	return nil
}
