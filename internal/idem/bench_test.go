package idem

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/testdb"
)

// benchOrder is shaped like an order request.
type benchOrder struct {
	Reference   string            `json:"reference"`
	CustomerID  string            `json:"customer_id"`
	Amount      int64             `json:"amount"`
	Currency    string            `json:"currency"`
	Description string            `json:"description"`
	Metadata    map[string]string `json:"metadata"`
}

var benchBody = []byte(`{"reference":"order-1001","customer_id":"cus_42","amount":2500,"currency":"EUR",
	"description":"Caf\u00e9 au lait","metadata":{"channel":"web","campaign":"winter"}}`)

// BenchmarkDecodeAndFingerprint measures the work done on every request
// before the claim (F1-F4): strict decoding and the canonical hash.
func BenchmarkDecodeAndFingerprint(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		var req benchOrder
		if err := DecodeStrict(benchBody, &req); err != nil {
			b.Fatal(err)
		}
		if _, err := Fingerprint("POST /v1/orders", nil, &req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExecute compares, on one database, a write under a new key
// (claim + write + record in one transaction), the replay of a completed
// key, and the same write without any idempotency (the baseline, in a
// pipelined transaction like Execute's), so the cost of the pattern reads
// as a ratio.
func BenchmarkExecute(b *testing.B) {
	pool, _ := testdb.NewPool(b)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE scratch (tenant_id uuid NOT NULL, v text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	tenant, _, err := tenants.Create(ctx, pool, "bench")
	if err != nil {
		b.Fatal(err)
	}
	store := NewStore(pool, Config{})
	fp, err := Fingerprint("POST /bench", nil, map[string]int{"a": 1})
	if err != nil {
		b.Fatal(err)
	}
	response := Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"ok":true}`)}
	write := func(ctx context.Context, tx UndoableTx) (Response, error) {
		_, err := tx.Exec(ctx, `INSERT INTO scratch (tenant_id, v) VALUES ($1, 'x')`, tenant)
		return response, err
	}

	b.Run("Baseline", func(b *testing.B) {
		for b.Loop() {
			if err := db.WithPipelinedTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
				_, err := write(ctx, tx)
				return err
			}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("NewKey", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			c := Claim{TenantID: tenant, Endpoint: "POST /bench", Key: fmt.Sprintf("new-%d", i), Fingerprint: fp}
			if _, _, err := store.Execute(ctx, c, write); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Replay", func(b *testing.B) {
		c := Claim{TenantID: tenant, Endpoint: "POST /bench", Key: "replayed", Fingerprint: fp}
		if _, _, err := store.Execute(ctx, c, write); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, replayed, err := store.Execute(ctx, c, write); err != nil || !replayed {
				b.Fatal(err, replayed)
			}
		}
	})
}
