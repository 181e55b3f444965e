package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/tooling/harness"
	"github.com/idemref/payments/internal/tooling/pgtmp"
)

// startDatabase starts a private PostgreSQL in dir with its durability
// defaults (pgtmp without Fast: fsync, synchronous_commit and
// full_page_writes on), creates the database "payments" and checks that
// the settings really are on: a benchmark of writes on a server that does
// not flush them measures nothing worth comparing.
func startDatabase(ctx context.Context, dir string) (*pgtmp.Cluster, map[string]string, error) {
	cluster, err := pgtmp.Start(ctx, pgtmp.Options{Dir: dir})
	if err != nil {
		return nil, nil, err
	}
	conn, err := pgx.Connect(ctx, cluster.URL("postgres"))
	if err != nil {
		_ = cluster.Stop()
		return nil, nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	settings := map[string]string{}
	for _, name := range []string{"server_version", "fsync", "synchronous_commit", "full_page_writes"} {
		var v string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			_ = cluster.Stop()
			return nil, nil, err
		}
		settings[name] = v
	}
	for _, name := range []string{"fsync", "synchronous_commit", "full_page_writes"} {
		if settings[name] != "on" {
			_ = cluster.Stop()
			return nil, nil, fmt.Errorf("PostgreSQL runs with %s=%s; the benchmark needs durability on", name, settings[name])
		}
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE payments"); err != nil {
		_ = cluster.Stop()
		return nil, nil, err
	}
	return cluster, settings, nil
}

// memory reads p's peak and current resident set size, in
// bytes, from /proc (Linux only).
func memory(p *harness.Process) (peak, current int64, err error) {
	status, err := procStatus(p.Pid())
	if err != nil {
		return 0, 0, err
	}
	kb := func(name string) (int64, error) {
		n, err := strconv.ParseInt(strings.TrimSuffix(status[name], " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse %s in /proc/%d/status: %w", name, p.Pid(), err)
		}
		return n << 10, nil
	}
	if peak, err = kb("VmHWM"); err != nil {
		return 0, 0, err
	}
	current, err = kb("VmRSS")
	return peak, current, err
}

// procStatus reads /proc/PID/status (Linux only) as name: value.
func procStatus(pid int) (map[string]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	fields := map[string]string{}
	for line := range strings.SplitSeq(string(b), "\n") {
		if name, value, ok := strings.Cut(line, ":"); ok {
			fields[name] = strings.TrimSpace(value)
		}
	}
	return fields, nil
}
