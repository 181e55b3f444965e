package reaper_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/reaper"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// BenchmarkReaperUnderLoad measures what the reaper working off a large
// backlog costs live traffic: the latency of key claims (the first
// statement of every create) alone and while the reaper runs, in
// interleaved rounds (alone, reaping, alone, reaping, ...) so that drift in
// the machine's speed lands on both sides. It reports the median and the
// range of the per-round p99 ratios, and the reaper's rows per second. One
// iteration takes about three minutes:
//
//	go test -run='^$' -bench=ReaperUnderLoad -benchtime=1x ./internal/reaper/
//
// REAPER_BENCH_BATCH and REAPER_BENCH_DUTY override the reaper's defaults,
// to compare settings on the same backlog.
func BenchmarkReaperUnderLoad(b *testing.B) {
	const (
		expired = 1_000_000 // completed, past expires_at: the backlog
		live    = 1_000_000 // completed, within their TTL
		clients = 16
		rounds  = 5
		window  = 6 * time.Second // each half of a round
	)
	cfg := reaper.Config{Logger: testkit.Logger(b)}
	if v, err := strconv.Atoi(os.Getenv("REAPER_BENCH_BATCH")); err == nil {
		cfg.Batch = v
	}
	if v, err := strconv.ParseFloat(os.Getenv("REAPER_BENCH_DUTY"), 64); err == nil {
		cfg.Duty = v
	}
	for b.Loop() {
		b.StopTimer()
		pool, _ := testdb.NewPool(b)
		tenant := newTenant(b, pool)
		start := time.Now()
		fill(b, pool, tenant, "due", expired, "completed", "-1 hour", "+2 days")
		fill(b, pool, tenant, "live", live, "completed", "+12 hours", "+60 hours")
		if _, err := pool.Exec(b.Context(), `VACUUM ANALYZE idempotency_keys`); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(b.Context(), `CHECKPOINT`); err != nil {
			b.Fatal(err)
		}
		b.Logf("filled %d expired and %d live rows in %s", expired, live, time.Since(start))
		b.StartTimer()

		// One reaper for the whole run: each reaping window continues where
		// the last one stopped, as a pass over a large backlog does.
		rp := reaper.New(pool, cfg)
		var pruned int64
		var reaped time.Duration

		// Two loads: paced at about half of what this machine sustains, as
		// a service with headroom runs (2,000 claims/s from 16 clients),
		// and flat out (the database is the bottleneck).
		for _, load := range []struct {
			name  string
			every time.Duration
		}{{"paced", clients * time.Second / 2000}, {"flat", 0}} {
			var ratios []float64
			for round := range rounds {
				base := claimLoad(b, pool, tenant, fmt.Sprintf("%s-base-%d", load.name, round), clients, load.every, func(ctx context.Context) {
					select {
					case <-ctx.Done():
					case <-time.After(window):
					}
				})
				var res reaper.Result
				with := claimLoad(b, pool, tenant, fmt.Sprintf("%s-with-%d", load.name, round), clients, load.every, func(ctx context.Context) {
					ctx, cancel := context.WithTimeout(ctx, window)
					defer cancel()
					t0 := time.Now()
					var err error
					res, err = rp.RunOnce(ctx)
					reaped += time.Since(t0)
					if err != nil && !errors.Is(err, context.DeadlineExceeded) {
						b.Error(err)
					}
				})
				if res.Pruned == 0 {
					b.Error("the reaper pruned nothing: the backlog ran out or the reaper stalled")
				}
				pruned += res.Pruned
				ratios = append(ratios, ms(with.p99)/ms(base.p99))
				b.Logf("%s round %d: alone: %s; reaping: %s; pruned %d", load.name, round, base, with, res.Pruned)
			}
			slices.Sort(ratios)
			b.ReportMetric(ratios[len(ratios)/2], load.name+"-p99-ratio-median")
			b.ReportMetric(ratios[0], load.name+"-p99-ratio-min")
			b.ReportMetric(ratios[len(ratios)-1], load.name+"-p99-ratio-max")
		}
		b.ReportMetric(float64(pruned)/reaped.Seconds(), "reaped-rows/s")
	}
}

type loadStats struct {
	n        int
	p50, p99 time.Duration
	rate     float64 // claims per second
}

func (s loadStats) String() string {
	return fmt.Sprintf("%d claims, %.0f/s, p50 %s, p99 %s", s.n, s.rate, s.p50, s.p99)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// claimLoad runs clients goroutines, each claiming fresh keys in a
// transaction of its own as a create does, until during returns, and
// reports the claims' latencies.
//
// every paces each client to one claim per every (0: flat out). A paced
// load is what a service sees in production, with headroom; a flat-out one
// measures what is left when the database is the bottleneck.
func claimLoad(b *testing.B, pool *pgxpool.Pool, tenant uuid.UUID, prefix string, clients int, every time.Duration, during func(context.Context)) loadStats {
	ctx, stop := context.WithCancel(b.Context())
	defer stop()
	var (
		mu   sync.Mutex
		lats []time.Duration
		seq  atomic.Int64
		wg   sync.WaitGroup
	)
	for range clients {
		wg.Go(func() {
			var mine []time.Duration
			next := time.Now()
			for ctx.Err() == nil {
				if every > 0 {
					// Open loop: the schedule does not wait for slow claims.
					next = next.Add(every)
					if d := time.Until(next); d > 0 {
						select {
						case <-ctx.Done():
						case <-time.After(d):
						}
					}
				}
				key := fmt.Sprintf("%s-%d", prefix, seq.Add(1))
				t0 := time.Now()
				if err := claim(ctx, pool, tenant, key); err != nil {
					if ctx.Err() == nil {
						b.Error(err)
					}
					break
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		})
	}
	t0 := time.Now()
	during(ctx)
	elapsed := time.Since(t0)
	stop()
	wg.Wait()
	slices.Sort(lats)
	if len(lats) == 0 {
		b.Fatal("no claims")
	}
	return loadStats{
		n:    len(lats),
		p50:  lats[len(lats)/2],
		p99:  lats[len(lats)*99/100],
		rate: float64(len(lats)) / elapsed.Seconds(),
	}
}

// claim is the idempotency claim of a one-transaction create: the INSERT
// of the key in progress, in its own transaction.
func claim(ctx context.Context, pool *pgxpool.Pool, tenant uuid.UUID, key string) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `
		INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, expires_at, retain_until)
		VALUES ($1, 'POST /v1/orders', $2, sha256(convert_to($2, 'UTF8')), 1, now() + interval '24 hours', now() + interval '72 hours')
		ON CONFLICT (tenant_id, endpoint, idem_key) DO NOTHING`, tenant, key); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
