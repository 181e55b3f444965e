// Package reaper enforces the two retention horizons of idempotency keys
// (E1, E3) without getting in the way of live traffic.
//
// A key's exact response is kept until expires_at (IDEMPOTENCY_TTL); after
// that the reaper prunes the row to a tombstone: state 'expired', headers
// and body gone (E2), status, fingerprint, resource and times kept, so a
// late retry still gets 409 idempotency_result_expired with the resource's
// link instead of a second execution. The tombstone itself is kept until
// retain_until (IDEMPOTENCY_KEY_RETENTION); then the reaper deletes it and
// the key may be used afresh. Correctness does not depend on the reaper:
// the store already treats a row past a horizon as pruned (E3). The reaper
// only reclaims space.
//
// The rules, and why:
//
//   - An in_progress key, and any key whose lease is live (locked_until >
//     now()), is never touched, whatever its horizons say. A payment at
//     recovery point charge_sent must keep its row until it finishes, or
//     the charge could be sent a second time under the same key.
//   - Work is done in batches of at most Batch rows, each its own short
//     transaction bounded by SET LOCAL statement_timeout, so no batch holds
//     row locks or a snapshot for long. Rows are taken oldest first along
//     the horizon's index, never by a full scan.
//   - Rows are claimed with FOR UPDATE SKIP LOCKED: a row a request holds
//     is skipped (it will be there next pass), so the reaper never waits
//     behind live traffic, and any number of reapers can run at once.
//   - Between batches it rests in proportion to the batch it just ran (at
//     most Duty of its time in batches, jittered), so a large backlog is
//     worked off as a trickle rather than a burst, and more slowly the
//     more loaded the database is.
//   - While it keeps finding full batches, the backlog outruns Duty: after
//     every catchUpAfter full batches in a row its duty doubles, up to
//     maxCatchUpDuty, and it falls back to Duty at the first short batch or
//     statement timeout. A service whose keys arrive faster than Duty can
//     reap keeps up by itself, and pays in tail latency only while it
//     catches up.
//   - When batches keep hitting the statement timeout (a cold cache, a
//     loaded database), the batch size halves, down to minBatch; it grows
//     back as batches succeed.
package reaper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/db/dbsqlc"
)

// Defaults for Config.
const (
	DefaultInterval = time.Minute
	// DefaultBatch and DefaultDuty keep create p99 within 1.3× of idle
	// at the base duty, on 2 cores (BenchmarkReaperUnderLoad, a million-
	// row backlog, median of 5 interleaved rounds, paced and flat-out p99
	// ratios, the first three measured at a fixed duty):
	//
	//	batch 5000, duty 0.2:   2,300 rows/s, p99 ×1.72 paced, ×1.25 flat
	//	batch 1000, duty 0.1:     550 rows/s, p99 ×1.12 paced, ×1.02 flat
	//	batch  500, duty 0.05:    370 rows/s, p99 ×0.99 paced, ×1.17 flat
	//	batch  500, catching up: 3,825 rows/s, p99 ×1.45 paced, ×1.51 flat
	//
	// A backlog fills every batch, so the duty climbs to maxCatchUpDuty
	// (the last line): a million rows are worked off in about 5 minutes
	// instead of 45, at ×1.5 create p99 while it lasts, and the base duty's
	// cost returns when a batch comes back short. A reaper that keeps up
	// (the soak: ~1,500 rows/s of prunes and deletes at 600 requests/s)
	// mostly runs short batches at the base duty.
	DefaultBatch            = 500
	DefaultStatementTimeout = 2 * time.Second
	DefaultDuty             = 0.05
)

const (
	// minBatch is the floor of the adaptive batch size: below it the
	// per-transaction overhead dominates and shrinking no longer helps.
	minBatch = 100
	// timeoutsBeforeShrink is how many statement timeouts in a row it takes
	// to halve the batch: one may be bad luck, two in a row are load.
	timeoutsBeforeShrink = 2
	// successesBeforeGrow is how many full batches in a row it takes to
	// double the batch again, up to Config.Batch.
	successesBeforeGrow = 4
	// catchUpAfter is how many full batches in a row double the duty;
	// maxCatchUpDuty is the most it doubles to (a Duty set above it is
	// kept as it is).
	catchUpAfter   = 4
	maxCatchUpDuty = 0.5
	// maxTimeoutsPerPass ends a pass that keeps timing out even at
	// minBatch; the next tick tries again.
	maxTimeoutsPerPass = 10
	// The pause between batches, jittered so several reapers do not march
	// in step.
	minPause, maxPause = 10 * time.Millisecond, 50 * time.Millisecond
)

// Config tunes a Reaper; zero fields take the defaults.
type Config struct {
	// Interval is the time between passes of Run.
	Interval time.Duration
	// Batch is the most rows one transaction prunes or deletes.
	Batch int
	// StatementTimeout bounds each batch's statement.
	StatementTimeout time.Duration
	// Duty is the largest share of its time the reaper spends inside
	// batches (0 < Duty ≤ 1): after a batch it rests in proportion, so a
	// large backlog is worked off as a trickle that leaves the database to
	// live traffic. Default DefaultDuty.
	Duty float64
	// MessageRetention is how long inbox rows (processed_messages) and
	// published outbox rows are kept (M3). It must exceed the longest
	// redelivery horizon of every producer: a redelivery that finds its id
	// pruned would apply its effect a second time. Each prune also moves the
	// inbox's horizon past the ids it deletes, in the same statement (a
	// trigger, migration 000015): a dead letter's redrive reads it to tell
	// whether the inbox still vouches for the event. Zero keeps them.
	MessageRetention time.Duration
	// Logger receives warnings and a line per pass that did work.
	Logger *slog.Logger
}

// Result is what one pass did.
type Result struct {
	Pruned  int64 // completed keys turned into tombstones
	Deleted int64 // finished keys past retain_until removed
	// Messages are inbox rows past MessageRetention removed; Outbox are
	// published outbox rows past it removed.
	Messages int64
	Outbox   int64
}

// Reaper prunes and deletes idempotency keys past their horizons. It is
// safe to run several, in one process or many.
type Reaper struct {
	pool  *pgxpool.Pool
	cfg   Config
	log   *slog.Logger
	batch int // the current, adaptive batch size; Run and RunOnce are not concurrent
	// full counts full batches in a row, across passes that ended before a
	// short batch (a cancelled RunOnce): the backlog outruns the base duty.
	full int
}

// New returns a Reaper over pool.
func New(pool *pgxpool.Pool, cfg Config) *Reaper {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Batch <= 0 {
		cfg.Batch = DefaultBatch
	}
	if cfg.StatementTimeout <= 0 {
		cfg.StatementTimeout = DefaultStatementTimeout
	}
	if cfg.Duty <= 0 || cfg.Duty > 1 {
		cfg.Duty = DefaultDuty
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	currentDuty.Set(cfg.Duty)
	return &Reaper{pool: pool, cfg: cfg, log: cfg.Logger, batch: cfg.Batch}
}

// Run makes a pass every Interval until ctx is cancelled. A failed pass is
// logged; the next tick is the retry.
func (r *Reaper) Run(ctx context.Context) {
	ticker := time.NewTicker(r.cfg.Interval)
	defer ticker.Stop()
	for {
		if _, err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
			passFailuresTotal.Inc()
			r.log.WarnContext(ctx, "reaper: pass failed", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// RunOnce prunes batches until one comes back short, then deletes batches
// likewise, and returns the counts. Pruning goes first so that a row past
// both horizons is usually deleted as a tombstone, but the delete takes
// completed rows too, so neither order is needed for correctness.
func (r *Reaper) RunOnce(ctx context.Context) (Result, error) {
	var res Result
	var err error
	res.Pruned, err = r.drain(ctx, "prune", "pruned", func(q *dbsqlc.Queries, n int32) (int64, error) {
		return q.IdemKeyPruneBatch(ctx, n)
	})
	if err != nil {
		return res, err
	}
	res.Deleted, err = r.drain(ctx, "delete", "deleted", func(q *dbsqlc.Queries, n int32) (int64, error) {
		return q.IdemKeyDeleteBatch(ctx, n)
	})
	if err != nil {
		return res, err
	}
	if r.cfg.MessageRetention > 0 {
		retention := r.cfg.MessageRetention.Seconds()
		res.Messages, err = r.drain(ctx, "messages", "messages_deleted", func(q *dbsqlc.Queries, n int32) (int64, error) {
			return q.ProcessedMessagePrune(ctx, dbsqlc.ProcessedMessagePruneParams{RetentionSeconds: retention, BatchSize: n})
		})
		if err != nil {
			return res, err
		}
		res.Outbox, err = r.drain(ctx, "outbox", "outbox_deleted", func(q *dbsqlc.Queries, n int32) (int64, error) {
			return q.OutboxDeletePublished(ctx, dbsqlc.OutboxDeletePublishedParams{RetentionSeconds: retention, BatchSize: n})
		})
		if err != nil {
			return res, err
		}
	}
	if res.Pruned > 0 || res.Deleted > 0 || res.Messages > 0 || res.Outbox > 0 {
		r.log.InfoContext(ctx, "reaper: pass", slog.Int64("pruned", res.Pruned), slog.Int64("deleted", res.Deleted),
			slog.Int64("messages_deleted", res.Messages), slog.Int64("outbox_deleted", res.Outbox))
	}
	return res, nil
}

// drain runs step in batches until a batch comes back short and returns
// the rows it affected, counted under action as each batch commits.
func (r *Reaper) drain(ctx context.Context, what, action string, step func(*dbsqlc.Queries, int32) (int64, error)) (int64, error) {
	var total int64
	timeouts, streak, successes := 0, 0, 0
	for {
		n := r.batch
		batchSize.Set(float64(n))
		started := time.Now()
		rows, err := r.batchTx(ctx, func(q *dbsqlc.Queries) (int64, error) { return step(q, db.Int32(n)) })
		worked := time.Since(started)
		switch {
		case isStatementTimeout(err) && ctx.Err() == nil:
			timeoutsTotal.Inc()
			timeouts++
			streak++
			successes, r.full = 0, 0
			if streak >= timeoutsBeforeShrink && r.batch > minBatch {
				r.batch = max(r.batch/2, minBatch)
				streak = 0
				r.log.WarnContext(ctx, "reaper: statement timeouts; halving the batch",
					slog.String("step", what), slog.Int("batch", r.batch), slog.Duration("statement_timeout", r.cfg.StatementTimeout))
			}
			if timeouts >= maxTimeoutsPerPass {
				return total, fmt.Errorf("reaper %s: %d statement timeouts in one pass: %w", what, timeouts, err)
			}
		case err != nil:
			return total, fmt.Errorf("reaper %s: %w", what, err)
		default:
			total += rows
			rowsTotal.WithLabelValues(action).Add(float64(rows))
			streak = 0
			if rows < int64(n) {
				r.full = 0
				currentDuty.Set(r.cfg.Duty)
				return total, nil // short batch: nothing more is due
			}
			r.full++
			if successes++; successes >= successesBeforeGrow && r.batch < r.cfg.Batch {
				r.batch = min(r.batch*2, r.cfg.Batch)
				successes = 0
			}
		}
		d := catchUpDuty(r.cfg.Duty, r.full)
		currentDuty.Set(d)
		if err := pause(ctx, worked, d); err != nil {
			return total, err
		}
	}
}

// batchTx runs one batch in its own transaction, its statements bounded by
// the statement timeout for this transaction only.
func (r *Reaper) batchTx(ctx context.Context, fn func(*dbsqlc.Queries) (int64, error)) (int64, error) {
	var rows int64
	err := db.WithTx(ctx, r.pool, func(ctx context.Context, tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		if err := q.TxSetStatementTimeout(ctx, fmt.Sprintf("%dms", r.cfg.StatementTimeout.Milliseconds())); err != nil {
			return err
		}
		var err error
		rows, err = fn(q)
		return err
	})
	return rows, err
}

// catchUpDuty is the duty after full full batches in a row: base, doubled
// after every catchUpAfter of them, up to maxCatchUpDuty (or base, if base
// is higher already). A backlog that fills every batch is one the base
// duty is not working off; a short batch means it has caught up.
func catchUpDuty(base float64, full int) float64 {
	limit := max(base, maxCatchUpDuty)
	d := base
	for range full / catchUpAfter {
		if d *= 2; d >= limit {
			return limit
		}
	}
	return d
}

// pause sleeps between batches: the reaper yields to live traffic. It
// rests at least worked×(1−duty)/duty after a batch that took worked, so it
// spends no more than duty of its time in batches however slow they get
// under load, and a jittered moment more.
func pause(ctx context.Context, worked time.Duration, duty float64) error {
	rest := time.Duration(float64(worked) * (1 - duty) / duty)
	d := rest + minPause + rand.N(maxPause-minPause)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// isStatementTimeout reports whether err is PostgreSQL cancelling a
// statement (SQLSTATE 57014, statement_timeout).
func isStatementTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57014"
}
