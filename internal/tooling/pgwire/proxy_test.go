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

	"github.com/idemref/payments/internal/tooling/pgwire"
	"github.com/idemref/payments/internal/tooling/testdb"
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

// CutAtCommit loses the next COMMIT's answer, after or before the server
// got it, whichever way the client sends it: as a simple Query
// (pgx.Tx.Commit) or as the Execute of a prepared COMMIT queued behind the
// transaction's statements (a pipelined batch). The client sees an error
// either way; only the database tells what happened. The cut is one-shot:
// the next transaction commits as usual.
func TestCutAtCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	_, err := connect(t, b.url).Exec(ctx, "CREATE TABLE things (id int PRIMARY KEY)")
	must(t, err)

	tests := []struct {
		name      string
		mode      pgwire.CutMode
		commit    func(ctx context.Context, conn *pgx.Conn, id int) error
		committed bool
	}{
		{"SimpleQueryDelivered", pgwire.CommitDelivered, simpleCommit, true},
		{"SimpleQueryDropped", pgwire.CommitDropped, simpleCommit, false},
		{"PipelinedDelivered", pgwire.CommitDelivered, pipelinedCommit, true},
		{"PipelinedDropped", pgwire.CommitDropped, pipelinedCommit, false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := connect(t, b.url)
			// Prepare the statements first, so that the cut falls on a
			// steady-state transaction.
			must(t, tt.commit(ctx, conn, 100+i))

			b.proxy.CutAtCommit(tt.mode)
			err := tt.commit(ctx, conn, i)
			if err == nil {
				t.Fatal("commit succeeded through a cut connection")
			}
			t.Logf("commit through the cut connection: %v", err)
			if !conn.IsClosed() {
				t.Error("the cut connection is still open")
			}

			other := connect(t, b.url)
			var n int
			must(t, other.QueryRow(ctx, "SELECT count(*) FROM things WHERE id = $1", i).Scan(&n))
			if committed := n == 1; committed != tt.committed {
				t.Errorf("committed = %v, want %v", committed, tt.committed)
			}
			must(t, tt.commit(ctx, other, 200+i))
		})
	}
}

// simpleCommit inserts id in a transaction that pgx commits with a simple
// Query.
func simpleCommit(ctx context.Context, conn *pgx.Conn, id int) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "INSERT INTO things (id) VALUES ($1)", id); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// pipelinedCommit inserts id in a transaction sent whole in one batch:
// BEGIN, the INSERT and COMMIT, each an extended-protocol Execute.
func pipelinedCommit(ctx context.Context, conn *pgx.Conn, id int) error {
	var batch pgx.Batch
	batch.Queue("BEGIN")
	batch.Queue("INSERT INTO things (id) VALUES ($1)", id)
	batch.Queue("COMMIT")
	return conn.SendBatch(ctx, &batch).Close()
}
