package db_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/tooling/testdb"
)

// TestUUIDCodec: every pool encodes uuid.UUID as 16 bytes and scans it
// back without a string in between, and the values PostgreSQL sees and
// returns are the same as through driver.Valuer and sql.Scanner: in
// binary and text format, NULL for a nil *uuid.UUID and back, and in
// uuid[] parameters.
func TestUUIDCodec(t *testing.T) {
	pool, _ := testdb.NewPool(t)
	ctx := t.Context()
	id := uuid.MustParse("0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0ff")

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	m := conn.Conn().TypeMap()
	for _, f := range []int16{pgtype.BinaryFormatCode, pgtype.TextFormatCode} {
		if plan := fmt.Sprintf("%T", m.PlanEncode(pgtype.UUIDOID, f, id)); !strings.HasPrefix(plan, "db.encodeUUID") {
			t.Errorf("format %d: uuid.UUID is encoded by %s, not by the registered codec", f, plan)
		}
		if plan := fmt.Sprintf("%T", m.PlanScan(pgtype.UUIDOID, f, &id)); !strings.HasPrefix(plan, "db.scanUUID") {
			t.Errorf("format %d: *uuid.UUID is scanned by %s, not by the registered codec", f, plan)
		}
	}

	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			var text string
			var back uuid.UUID
			if err := conn.QueryRow(ctx, "SELECT $1::uuid::text, $1::uuid", mode, id).Scan(&text, &back); err != nil {
				t.Fatal(err)
			}
			if text != id.String() || back != id {
				t.Errorf("sent %s; PostgreSQL saw %s and returned %s", id, text, back)
			}

			var null, some *uuid.UUID
			var isNull bool
			if err := conn.QueryRow(ctx, "SELECT $1::uuid IS NULL, $1::uuid, $2::uuid", mode, (*uuid.UUID)(nil), &id).Scan(&isNull, &null, &some); err != nil {
				t.Fatal(err)
			}
			if !isNull || null != nil {
				t.Errorf("a nil *uuid.UUID: IS NULL %t, scanned back as %v; want true, nil", isNull, null)
			}
			if some == nil || *some != id {
				t.Errorf("a *uuid.UUID scanned back as %v, want %s", some, id)
			}

			if err := conn.QueryRow(ctx, "SELECT NULL::uuid", mode).Scan(&back); err == nil {
				t.Error("NULL scanned into a uuid.UUID without an error")
			}

			other := uuid.MustParse("00000000-0000-4000-8000-000000000001")
			var joined string
			if err := conn.QueryRow(ctx, "SELECT array_to_string($1::uuid[], ',')", mode, []uuid.UUID{id, other}).Scan(&joined); err != nil {
				t.Fatal(err)
			}
			if want := id.String() + "," + other.String(); joined != want {
				t.Errorf("uuid[]: PostgreSQL saw %s, want %s", joined, want)
			}
		})
	}
}

// BenchmarkUUID: encoding a uuid.UUID parameter and scanning a uuid
// column, through driver.Valuer and sql.Scanner (pgx's default) and
// through the registered codec.
func BenchmarkUUID(b *testing.B) {
	id := uuid.New()
	wire := id[:]
	for _, registered := range []bool{false, true} {
		m := pgtype.NewMap()
		name := "Valuer"
		if registered {
			db.RegisterUUID(m)
			name = "Codec"
		}
		b.Run(name, func(b *testing.B) {
			buf := make([]byte, 0, 64)
			var back uuid.UUID
			for b.Loop() {
				out, err := m.Encode(pgtype.UUIDOID, pgtype.BinaryFormatCode, id, buf[:0])
				if err != nil || len(out) != 16 {
					b.Fatal(out, err)
				}
				if err := m.Scan(pgtype.UUIDOID, pgtype.BinaryFormatCode, wire, &back); err != nil || back != id {
					b.Fatal(back, err)
				}
			}
		})
	}
}
