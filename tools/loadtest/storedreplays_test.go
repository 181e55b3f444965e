package main

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/tooling/pgtmp"
	"github.com/idemref/payments/internal/tooling/testkit"
)

// storedKey must be the key fillSQL writes for the same seed and row:
// a replay of a stored key sends it, and a different key would execute.
func TestStoredKeyIsTheFillsKey(t *testing.T) {
	ctx := context.Background()
	cluster := testkit.Postgres(ctx, t, pgtmp.Options{Fast: true})
	conn, err := pgx.Connect(ctx, cluster.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// fillSQL's expression for a row's key.
	const key = `SELECT (CASE WHEN $3::bool
	                     THEN overlay(md5($1::text || $2::bigint) PLACING lpad(to_hex($2::bigint), 12, '0') FROM 1 FOR 12)
	                     ELSE md5($1::text || $2::bigint) END)::uuid::text`
	if !strings.Contains(strings.Join(strings.Fields(fillSQL), " "), "(CASE WHEN @timeOrdered::bool THEN overlay(md5(@seed::text || g) PLACING lpad(to_hex(g), 12, '0') FROM 1 FOR 12) ELSE md5(@seed::text || g) END)::uuid::text AS key") {
		t.Fatal("fillSQL no longer computes a key as this test does")
	}
	var previous string
	for _, g := range []int64{0, 1, 9, 10, 123_456, 19_999_999} {
		for _, timeOrdered := range []bool{false, true} {
			var want string
			if err := conn.QueryRow(ctx, key, "ab12cd34-", g, timeOrdered).Scan(&want); err != nil {
				t.Fatal(err)
			}
			got := storedKey("ab12cd34-", g, timeOrdered)
			if got != want {
				t.Errorf("row %d (time-ordered %t): storedKey %s, the fill's key %s", g, timeOrdered, got, want)
			}
			if timeOrdered && got <= previous {
				t.Errorf("row %d: time-ordered key %s sorts before the previous row's %s", g, got, previous)
			}
			if timeOrdered {
				previous = got
			}
		}
	}
	if v7 := uuid.Must(uuid.NewV7()).String(); v7 <= previous {
		t.Errorf("a version 7 key %s sorts before the fill's last %s", v7, previous)
	}
}

func TestParseBytes(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{"1GiB": 1 << 30, "512MiB": 512 << 20, "64KiB": 64 << 10, "1000": 1000, "1000B": 1000} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "1GB", "-1GiB", "0", "lots"} {
		if got, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) = %d, want an error", in, got)
		}
	}
}

func TestPerRequestReads(t *testing.T) {
	t.Parallel()
	c := ioCounters{keyRead: 150, keyHit: 850, dbRead: 200, dbHit: 1800}.minus(ioCounters{keyRead: 50, dbRead: 100})
	if k, d := c.perRequest(50); k != 2 || d != 2 {
		t.Errorf("perRequest(50) = %v, %v; want 2, 2", k, d)
	}
	if k, d := c.perRequest(0); k != 0 || d != 0 {
		t.Errorf("perRequest(0) = %v, %v; want 0, 0", k, d)
	}
}
