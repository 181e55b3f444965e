package pgwire_test

import (
	"context"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/pgwire"
	"github.com/idemref/payments/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

type bundle struct {
	proxy *pgwire.Proxy
	url   string // the test database, through the proxy
}

func setup(t *testing.T) *bundle {
	t.Helper()
	_, dbURL := testdb.NewPool(t)
	cfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pgwire.Listen(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	u, err := p.URL(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{proxy: p, url: u}
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// measure runs fn and returns the counts of the traffic it caused.
func measure(t *testing.T, p *pgwire.Proxy, fn func() error) pgwire.Counts {
	t.Helper()
	c, err := p.Measure(t.Context(), fn)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestCounts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := connect(t, b.url)
	ctx := t.Context()
	must(t, conn.QueryRow(ctx, "SELECT 1").Scan(new(int)))
	_, err := conn.Exec(ctx, "CREATE TABLE things (id int PRIMARY KEY, name text NOT NULL)")
	must(t, err)

	tests := []struct {
		name string
		run  func() error
		want pgwire.Counts
	}{
		{"PlainQueryIsOneRoundTrip", func() error {
			return conn.QueryRow(ctx, "SELECT 1").Scan(new(int))
		}, pgwire.Counts{RoundTrips: 1, Statements: 1}},
		{"QueryWithArgumentsIsOneRoundTrip", func() error {
			return conn.QueryRow(ctx, "SELECT $1::int", 7).Scan(new(int))
		}, pgwire.Counts{RoundTrips: 1, Statements: 1}},
		{"BatchOfThreeIsOneRoundTrip", func() error {
			var batch pgx.Batch
			batch.Queue("SELECT 1")
			batch.Queue("SELECT $1::int", 2)
			batch.Queue("SELECT count(*) FROM things")
			return conn.SendBatch(ctx, &batch).Close()
		}, pgwire.Counts{RoundTrips: 1, Statements: 3}},
		{"TransactionIsThreeRoundTrips", func() error {
			tx, err := conn.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "INSERT INTO things (id, name) VALUES ($1, $2) ON CONFLICT DO NOTHING", 1, "one"); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}, pgwire.Counts{RoundTrips: 3, Statements: 3}},
		{"SimpleQueryOfTwoStatementsIsOneStatement", func() error {
			_, err := conn.PgConn().Exec(ctx, "SELECT 1; SELECT 2").ReadAll()
			return err
		}, pgwire.Counts{RoundTrips: 1, Statements: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The first run may prepare statements (an extra round trip
			// each, cached per connection); the second is the steady state.
			must(t, tt.run())
			got := measure(t, b.proxy, tt.run)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("counts (-want +got):\n%s", diff)
			}
		})
	}

	t.Run("FirstUseOfAStatementPreparesIt", func(t *testing.T) {
		got := measure(t, b.proxy, func() error {
			return conn.QueryRow(ctx, "SELECT 'never seen before'::text").Scan(new(string))
		})
		if diff := cmp.Diff(pgwire.Counts{RoundTrips: 2, Statements: 1}, got); diff != "" {
			t.Errorf("counts (-want +got):\n%s", diff)
		}
	})
}

func TestConnectionsAreCountedApart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	b.proxy.Reset()
	conn1 := connect(t, b.url)
	conn2 := connect(t, b.url)
	for range 2 {
		must(t, conn1.QueryRow(ctx, "SELECT 1").Scan(new(int)))
	}
	for range 3 {
		_, err := conn2.Exec(ctx, "SELECT 1")
		must(t, err)
	}
	must(t, b.proxy.WaitQuiet(ctx, 20*time.Millisecond))
	s := b.proxy.Snapshot()
	if len(s.Conns) != 2 {
		t.Fatalf("connections = %d, want 2: %+v", len(s.Conns), s.Conns)
	}
	// conn1's QueryRow prepares SELECT 1 first: one more round trip, no
	// statement. conn2's Exec without arguments is a simple Query.
	want := []pgwire.Counts{
		{Connections: 1, RoundTrips: 3, Statements: 2},
		{Connections: 1, RoundTrips: 3, Statements: 3},
	}
	for i, c := range s.Conns {
		if diff := cmp.Diff(want[i], c.Counts); diff != "" {
			t.Errorf("connection %d (-want +got):\n%s", c.ID, diff)
		}
	}
	if diff := cmp.Diff(pgwire.Counts{Connections: 2, RoundTrips: 6, Statements: 5}, s.Total); diff != "" {
		t.Errorf("total (-want +got):\n%s", diff)
	}

	b.proxy.Reset()
	s = b.proxy.Snapshot()
	if s.Total != (pgwire.Counts{}) || len(s.Conns) != 2 || s.Conns[0].Counts != (pgwire.Counts{}) {
		t.Errorf("after Reset: %+v", s)
	}
}

func TestRecordsStatementsByRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	conn := connect(t, b.url)
	b.proxy.Reset()
	b.proxy.Record(true)
	tx, err := conn.Begin(ctx)
	must(t, err)
	var batch pgx.Batch
	batch.Queue("SELECT $1::int", 1)
	batch.Queue("SELECT $1::text", "two")
	must(t, tx.SendBatch(ctx, &batch).Close())
	must(t, tx.Commit(ctx))
	must(t, b.proxy.WaitQuiet(ctx, 20*time.Millisecond))

	var got []string
	rt := map[string]int64{}
	for _, s := range b.proxy.Statements() {
		got = append(got, string(s.Kind)+" "+s.SQL)
		rt[s.SQL] = s.RoundTrip
	}
	want := []string{"Q begin", "E SELECT $1::int", "E SELECT $1::text", "Q commit"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("statements (-want +got):\n%s", diff)
	}
	if rt["SELECT $1::int"] != rt["SELECT $1::text"] {
		t.Errorf("the batch's statements were sent in round trips %d and %d, want one", rt["SELECT $1::int"], rt["SELECT $1::text"])
	}
}

// sslmode=prefer asks for encryption first; the throwaway server has none
// and answers 'N' with one unframed byte, after which the startup goes on
// in the clear and is counted like any other.
func TestSSLRequestRefusedIsCounted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	u, err := url.Parse(b.url)
	must(t, err)
	q := u.Query()
	q.Set("sslmode", "prefer")
	u.RawQuery = q.Encode()
	conn := connect(t, u.String())
	must(t, conn.QueryRow(ctx, "SELECT 1").Scan(new(int)))
	got := measure(t, b.proxy, func() error { return conn.QueryRow(ctx, "SELECT 1").Scan(new(int)) })
	if diff := cmp.Diff(pgwire.Counts{RoundTrips: 1, Statements: 1}, got); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
	if s := b.proxy.Snapshot(); s.Total.Opaque != 0 {
		t.Errorf("opaque connections = %d, want 0", s.Total.Opaque)
	}
}
