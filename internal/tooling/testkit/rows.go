package testkit

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// RowsQuerier is what Rows reads from: a pool, a connection or a
// transaction.
type RowsQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Rows runs sql and returns its rows, each read into a T by column
// position, failing the test on any error: the one helper behind every
// test's "read these rows into those structs".
func Rows[T any](t testing.TB, q RowsQuerier, sql string, args ...any) []T {
	t.Helper()
	rows, err := q.Query(t.Context(), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[T])
	if err != nil {
		t.Fatal(err)
	}
	return out
}
