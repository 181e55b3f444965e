// Command chaos builds a small production-shaped deployment from real
// binaries on this machine and runs fault scenarios against it, then
// checks that nothing acknowledged was lost, nothing ran twice and no
// order was charged twice (T8, D1–D6):
//
//	etcd, 3 members ◀── Patroni × 2: leader key, TTL          (etcd.go, patroni.go)
//	PostgreSQL leader ──streaming, synchronous──▶ standby       (patroni.go)
//	     ▲ PgBouncer (transaction mode), one per member        (postgres.go)
//	     │
//	toxiproxy links: API→PgBouncer, API→processor, API→NATS,    (faults.go)
//	  each member→etcd, member↔member (replication, REST API)
//	     │
//	2–3 `api serve` processes, the processor simulator          (deploy.go)
//	     │
//	NATS JetStream, 3 nodes, the stream at 3 replicas            (nats.go)
//
// Clients that retry with the same key drive orders and payments through
// the APIs (load.go); each scenario injects its fault (scenarios.go, and
// orchestrator.go for Patroni's own: the split brain, the rejoin, the
// switchover, etcd's loss of a member) and Patroni does the rest; the
// checker then compares what the clients were told with the database and
// the processor's record of calls (check.go).
//
// Run it with make chaos (every scenario, long mode) or make chaos
// CHAOS_FLAGS=-short (what CI runs). The last line, for scripts:
//
//	chaos: scenarios=N failed=F acked=A lost=L duplicated=D double_charged=C
//
// See docs/deployment.md for the settings each guarantee relies on.
package main
