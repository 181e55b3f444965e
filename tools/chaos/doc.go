// Command chaos builds a small production-shaped deployment from real
// binaries on this machine and runs fault scenarios against it, then
// checks that nothing acknowledged was lost, nothing ran twice and no
// order was charged twice (T8, D1–D5):
//
//	PostgreSQL primary ──streaming, synchronous──▶ standby      (postgres.go)
//	     ▲ PgBouncer (transaction mode), one per node          (postgres.go)
//	     │
//	toxiproxy links: API→PgBouncer, API→processor, API→NATS     (faults.go)
//	     │
//	2–3 `api serve` processes, the processor simulator          (deploy.go)
//	     │
//	NATS JetStream, 3 nodes, the stream at 3 replicas            (nats.go)
//
// Clients that retry with the same key drive orders and payments through
// the APIs (load.go); each scenario injects its fault (scenarios.go); the
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
