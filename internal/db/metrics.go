package db

import (
	"errors"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// poolCollector exports pgxpool.Stat at each scrape.
type poolCollector struct {
	mu   sync.Mutex
	pool *pgxpool.Pool
}

func poolDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc("pgxpool_"+name, help, nil, nil)
}

var (
	poolAcquiredDesc       = poolDesc("acquired_conns", "Connections currently checked out of the pool.")
	poolIdleDesc           = poolDesc("idle_conns", "Idle connections in the pool.")
	poolConstructingDesc   = poolDesc("constructing_conns", "Connections being opened.")
	poolTotalDesc          = poolDesc("total_conns", "All connections of the pool (acquired, idle and constructing).")
	poolMaxDesc            = poolDesc("max_conns", "The pool's maximum size.")
	poolAcquireCountDesc   = poolDesc("acquire_total", "Successful acquires from the pool.")
	poolAcquireSecondsDesc = poolDesc("acquire_duration_seconds_total", "Total time successful acquires took.")
	poolEmptyAcquireDesc   = poolDesc("empty_acquire_total", "Acquires that found no idle connection and had to wait for one (or for a new one).")
	poolEmptyWaitDesc      = poolDesc("empty_acquire_wait_seconds_total", "Total time acquires spent waiting for a connection when none was idle.")
	poolCanceledDesc       = poolDesc("canceled_acquire_total", "Acquires cancelled by their context (a request's deadline) while waiting.")
	poolNewConnsDesc       = poolDesc("new_conns_total", "Connections the pool opened.")
)

var (
	registeredMu sync.Mutex
	registered   *poolCollector
)

// RegisterPoolMetrics exports pool's statistics as pgxpool_* metrics on the
// default registry. A process serves one pool; calling it again (a second
// serve in one process, as tests do) points the metrics at the new pool.
func RegisterPoolMetrics(pool *pgxpool.Pool) error {
	registeredMu.Lock()
	defer registeredMu.Unlock()
	if registered != nil {
		registered.set(pool)
		return nil
	}
	c := &poolCollector{pool: pool}
	if err := prometheus.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*poolCollector); ok {
				existing.set(pool)
				registered = existing
				return nil
			}
		}
		return err
	}
	registered = c
	return nil
}

func (c *poolCollector) set(pool *pgxpool.Pool) {
	c.mu.Lock()
	c.pool = pool
	c.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		poolAcquiredDesc, poolIdleDesc, poolConstructingDesc, poolTotalDesc, poolMaxDesc,
		poolAcquireCountDesc, poolAcquireSecondsDesc, poolEmptyAcquireDesc, poolEmptyWaitDesc,
		poolCanceledDesc, poolNewConnsDesc,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	pool := c.pool
	c.mu.Unlock()
	s := pool.Stat()
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge(poolAcquiredDesc, float64(s.AcquiredConns()))
	gauge(poolIdleDesc, float64(s.IdleConns()))
	gauge(poolConstructingDesc, float64(s.ConstructingConns()))
	gauge(poolTotalDesc, float64(s.TotalConns()))
	gauge(poolMaxDesc, float64(s.MaxConns()))
	counter(poolAcquireCountDesc, float64(s.AcquireCount()))
	counter(poolAcquireSecondsDesc, s.AcquireDuration().Seconds())
	counter(poolEmptyAcquireDesc, float64(s.EmptyAcquireCount()))
	counter(poolEmptyWaitDesc, s.EmptyAcquireWaitTime().Seconds())
	counter(poolCanceledDesc, float64(s.CanceledAcquireCount()))
	counter(poolNewConnsDesc, float64(s.NewConnsCount()))
}
