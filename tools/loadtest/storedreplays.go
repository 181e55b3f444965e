package main

import (
	"context"
	"crypto/md5"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// The stored-keys benchmark's second half: what a big key table costs a
// replay, and the blocks each request reads.
//
// A replay of a stored key reads that key's primary key leaf and its heap
// page, which for a random old key of a table past memory are the pages
// least likely to be cached. Each side replays the completed rows of its
// own fill, chosen at random: the full side those of its N keys, the
// other side those of a small fill (smallReplayKeys rows, written after
// the create rounds into the empty side's table, as it is, so that it
// holds keys of the same shape in memory). Every row carries the
// template's fingerprint and recorded response, so the template's request
// sent under a stored completed key and its tenant's API key must answer
// 201, replayed, with the template's body; a key computed differently
// from the fill's would execute instead and fail the run.
//
// The reads are PostgreSQL's own counters: blocks of the key table (heap
// and indexes, pg_statio_user_tables) and of the database
// (pg_stat_database) that were not in shared_buffers and were read from
// the operating system, whose page cache may still hold them (under
// -pg-memory, only within the limit). They are read before and after each
// phase over all its rounds, not per round: a backend reports its
// counters when idle, at most once a second and at the latest 10 seconds
// after its last transaction (PostgreSQL 15), so each reading waits
// statsSettle for the API's pooled backends to report.

const (
	// smallReplayKeys is the size of the small side's fill: about 50 MB,
	// in memory under any limit the benchmark is run with.
	smallReplayKeys = 100_000
	statsSettle     = 11 * time.Second
)

// ioCounters are block reads (from the operating system) and hits (in
// shared_buffers) of the key table, heap and indexes, and of the whole
// database.
type ioCounters struct {
	keyRead, keyHit, dbRead, dbHit int64
}

func readIO(ctx context.Context, db *pgxpool.Pool) (ioCounters, error) {
	var c ioCounters
	err := db.QueryRow(ctx, `
		SELECT coalesce(s.heap_blks_read, 0) + coalesce(s.idx_blks_read, 0),
		       coalesce(s.heap_blks_hit, 0) + coalesce(s.idx_blks_hit, 0),
		       d.blks_read, d.blks_hit
		FROM pg_statio_user_tables s, pg_stat_database d
		WHERE s.relname = 'idempotency_keys' AND d.datname = current_database()`).Scan(&c.keyRead, &c.keyHit, &c.dbRead, &c.dbHit)
	return c, err
}

func (c ioCounters) minus(o ioCounters) ioCounters {
	return ioCounters{c.keyRead - o.keyRead, c.keyHit - o.keyHit, c.dbRead - o.dbRead, c.dbHit - o.dbHit}
}

// perRequest is the reads per request of a phase that answered n.
func (c ioCounters) perRequest(n int) (keyReads, dbReads float64) {
	if n == 0 {
		return 0, 0
	}
	return float64(c.keyRead) / float64(n), float64(c.dbRead) / float64(n)
}

// ioPhase reads each side's counters, runs fn, and records the
// difference in *field of each side, waiting statsSettle before each
// reading.
func ioPhase(ctx context.Context, sides []*side, field func(*side) *ioCounters, fn func() error) error {
	read := func() ([]ioCounters, error) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(statsSettle):
		}
		var cs []ioCounters
		for _, s := range sides {
			c, err := readIO(ctx, s.load.db)
			if err != nil {
				return nil, err
			}
			cs = append(cs, c)
		}
		return cs, nil
	}
	before, err := read()
	if err != nil {
		return err
	}
	if err := fn(); err != nil {
		return err
	}
	after, err := read()
	if err != nil {
		return err
	}
	for i, s := range sides {
		*field(s) = after[i].minus(before[i])
	}
	return nil
}

// storedKey is the key of row g of a fill seeded with seed: fillSQL's
// md5(seed || g)::uuid, its first 12 hex digits g's when time-ordered.
func storedKey(seed string, g int64, timeOrdered bool) string {
	u := uuid.UUID(md5.Sum([]byte(seed + strconv.FormatInt(g, 10))))
	if timeOrdered {
		// The first 6 bytes, big-endian, as a version 7 UUID's milliseconds.
		for i := range 6 {
			u[i] = byte(g >> (8 * (5 - i)))
		}
	}
	return u.String()
}

// storedRows is what a side's replays need of its fill: the completed
// rows are numbers tombstones to n - 1, and row g belongs to the tenant
// tenantOrder[g % len] (fillSQL's tenants, ordered by name as the
// database orders them), whose API key is apiKeys[name].
type storedRows struct {
	seed          string
	timeOrdered   bool
	tombstones, n int64
	tenantOrder   []string
	apiKeys       map[string]string
}

func newStoredRows(ctx context.Context, db *pgxpool.Pool, f fillTarget, tenants, apiKeys []string) (storedRows, error) {
	r := storedRows{seed: f.seed, timeOrdered: f.timeOrdered, tombstones: f.n * 2 / 3, n: f.n, apiKeys: map[string]string{}}
	for i, name := range tenants {
		r.apiKeys[name] = apiKeys[i]
	}
	err := db.QueryRow(ctx, `SELECT array_agg(name ORDER BY name) FROM tenants WHERE name = ANY($1)`, tenants).Scan(&r.tenantOrder)
	if err != nil {
		return r, err
	}
	if len(r.tenantOrder) != len(tenants) {
		return r, fmt.Errorf("the database holds %d of the benchmark's %d tenants", len(r.tenantOrder), len(tenants))
	}
	return r, nil
}

// replayStored replays random completed rows of rows for d.
func (l *load) replayStored(ctx context.Context, workers int, d time.Duration, rows storedRows, tpl templateInfo) (outcome, error) {
	url := l.base + "/v1/orders"
	tr := func(t *vegeta.Target) error {
		g := rows.tombstones + rand.Int64N(rows.n-rows.tombstones)
		tenant := rows.tenantOrder[g%int64(len(rows.tenantOrder))]
		h := http.Header{
			"Authorization":   {"Bearer " + rows.apiKeys[tenant]},
			"Content-Type":    {"application/json"},
			"Idempotency-Key": {storedKey(rows.seed, g, rows.timeOrdered)},
		}
		t.Method, t.URL, t.Header, t.Body = http.MethodPost, url, h, tpl.request
		return nil
	}
	replayed := status(http.StatusCreated, true)
	expect := func(res *vegeta.Result) string {
		if p := replayed(res); p != "" {
			return p
		}
		if string(res.Body) != string(tpl.response) {
			return "a replay's body differs from the recorded one: " + truncate(res.Body)
		}
		return ""
	}
	var out outcome
	// No order is written: a replay that executed would have written one.
	// (Counting the key rows here would read the whole key table into the
	// reads the replays are measured by.)
	err := l.checkRows(ctx, "replay of stored keys", countOrders, func() (int, error) {
		var err error
		out, err = l.attack("replay-stored", workers, d, tr, expect, false)
		return 0, err
	})
	return out, err
}

// replayRounds fills the small side, then replays each side's stored
// keys in rounds, the two taking turns at going first, and reads the
// blocks the replays read.
func replayRounds(ctx context.Context, o options, env *environment, res *storedKeysResults, stdout io.Writer) error {
	small := fillTarget{database: "payments", url: env.cluster.URL("payments"), n: smallReplayKeys, seed: env.runID + "-small-", timeOrdered: env.timeOrderedKeys}
	if _, err := fillStoredKeys(ctx, env, small, res.template, stdout); err != nil {
		return err
	}
	var err error
	if res.empty.stored, err = newStoredRows(ctx, res.empty.load.db, small, env.tenants, env.apiKeys); err != nil {
		return err
	}
	if res.full.stored, err = newStoredRows(ctx, res.full.load.db, env.fullFill(o.storedKeys), env.tenants, env.fullKeys); err != nil {
		return err
	}
	sides := []*side{res.empty, res.full}
	return ioPhase(ctx, sides, func(s *side) *ioCounters { return &s.replayIO }, func() error {
		for i := 1; i <= o.rounds; i++ {
			order := []*side{res.full, res.empty}
			if i%2 == 0 {
				order[0], order[1] = order[1], order[0]
			}
			for _, s := range order {
				r, err := s.load.replayStored(ctx, o.concurrency, o.duration, s.stored, res.template)
				s.replay.add(r)
				if err != nil {
					return fmt.Errorf("replay round %d, %s: %w", i, s.name, err)
				}
			}
			last := func(s series) float64 { return s[len(s)-1] }
			fmt.Fprintf(stdout, "replay round %d/%d: %d stored keys %.0f/s, %d stored keys %.0f/s (%s first): full / small %.2f\n",
				i, o.rounds, res.empty.stored.n, last(res.empty.replay.rps), res.full.stored.n, last(res.full.replay.rps), order[0].name,
				last(res.full.replay.rps)/last(res.empty.replay.rps))
		}
		return nil
	})
}
