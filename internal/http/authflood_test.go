package httpapi_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	apispec "github.com/idemref/payments"
	"github.com/idemref/payments/internal/db"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/testdb"
)

// R5: unauthenticated traffic is cheap. A key the cache knows (it
// authenticated, or it did not, within AUTH_CACHE_TTL) costs no query; a
// key it does not know costs one lookup, and each lookup that finds no
// tenant costs the client's address a token, so a flood of made-up keys
// is answered 429 before any query once its address's tokens are spent.

// queryCounter counts the statements the API's pool sends.
type queryCounter struct{ n atomic.Int64 }

func (c *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// floodServer is the API over its own counted pool, with the given budgets
// of failed key lookups per client and in total, and a tenant's valid key.
func floodServer(tb testing.TB, lookups, total httpapi.RateLimit) (url string, queries *queryCounter, validKey string) {
	tb.Helper()
	_, dbURL := testdb.NewPool(tb)
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		tb.Fatal(err)
	}
	db.Configure(cfg)
	queries = &queryCounter{}
	cfg.ConnConfig.Tracer = queries
	pool, err := pgxpool.NewWithConfig(tb.Context(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	if _, validKey, err = tenants.Create(tb.Context(), pool, "flood "+uuid.NewString()); err != nil {
		tb.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.NewHandler(httpapi.Config{
		Pool: pool, Idem: idem.NewStore(pool, idem.Config{}), Logger: slog.New(slog.DiscardHandler),
		RequestTimeout: 10 * time.Second, OpenAPI: apispec.OpenAPI, AuthCacheTTL: 10 * time.Second, AuthLookups: lookups,
		AuthLookupsTotal: total,
	}))
	tb.Cleanup(srv.Close)
	return srv.URL, queries, validKey
}

// unknownKey is a well-formed API key of a tenant that does not exist: it
// passes every check but the database's.
func unknownKey() string {
	secret := make([]byte, 24)
	_, _ = rand.Read(secret)
	id := uuid.New()
	return "sk_" + hex.EncodeToString(id[:]) + "_" + hex.EncodeToString(secret)
}

// clientFrom returns a client whose connections come from the loopback
// address local (127.0.0.0/8 is all this machine's), so one test can be
// several client addresses.
func clientFrom(local string) *http.Client {
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	return &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext, MaxIdleConnsPerHost: 64}}
}

func getOrders(t testing.TB, client *http.Client, url, apiKey string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url+"/v1/orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return response{status: res.StatusCode, header: res.Header}
}

func TestUnknownKeysCostNoQueryOnceTheAddressIsThrottled(t *testing.T) {
	t.Parallel()
	// A budget that does not refill while the test runs: the figures are
	// exact, whatever the machine's speed.
	url, queries, valid := floodServer(t, httpapi.RateLimit{Rate: 0.0001, Burst: 5}, httpapi.RateLimit{Rate: 0.0001, Burst: 1000})
	attacker, bystander := clientFrom("127.0.0.2"), clientFrom("127.0.0.3")

	// The same wrong key again and again: one lookup, then the negative
	// cache answers 401 and the address's budget is not touched again.
	wrong := unknownKey()
	before := queries.n.Load()
	for range 20 {
		if res := getOrders(t, attacker, url, wrong); res.status != http.StatusUnauthorized {
			t.Fatalf("a repeated wrong key = %d, want 401", res.status)
		}
	}
	if n := queries.n.Load() - before; n != 1 {
		t.Errorf("20 requests with one wrong key cost %d queries, want 1", n)
	}

	// Made-up keys, each new: four more lookups use up the burst of five,
	// then 429 with Retry-After and no query at all.
	before = queries.n.Load()
	var unauthorized, throttled int
	for range 200 {
		res := getOrders(t, attacker, url, unknownKey())
		switch res.status {
		case http.StatusUnauthorized:
			unauthorized++
		case http.StatusTooManyRequests:
			throttled++
			if res.header.Get("Retry-After") == "" {
				t.Fatal("429 without Retry-After")
			}
		default:
			t.Fatalf("a made-up key = %d", res.status)
		}
	}
	if n := queries.n.Load() - before; unauthorized != 4 || throttled != 196 || n != 4 {
		t.Errorf("200 made-up keys: %d answered 401, %d answered 429, %d queries; want 4, 196 and 4", unauthorized, throttled, n)
	}

	// Another address is not held back, and a tenant's valid key works
	// from it.
	if res := getOrders(t, bystander, url, unknownKey()); res.status != http.StatusUnauthorized {
		t.Errorf("a made-up key from another address = %d, want 401", res.status)
	}
	if res := getOrders(t, bystander, url, valid); res.status != http.StatusOK {
		t.Errorf("a valid key from another address = %d, want 200", res.status)
	}
}

// R5 as a whole: made-up keys spread over 50 addresses cost a bounded
// number of lookups, not 50 bursts. Each address has a burst of 20, the
// flood a total of 100: past the total an address that sent an unknown key
// is refused before any query, and each address that had not yet sent one
// costs one lookup. A tenant's valid key from an address that sent none is
// looked up and served throughout: the total never starves it.
func TestUnknownKeysFromManyAddressesCostABoundedTotal(t *testing.T) {
	t.Parallel()
	// Budgets that do not refill while the test runs: the figures are
	// exact, whatever the machine's speed.
	url, queries, valid := floodServer(t, httpapi.RateLimit{Rate: 0.0001, Burst: 20}, httpapi.RateLimit{Rate: 0.0001, Burst: 100})
	const addresses, perAddress = 50, 20
	before := queries.n.Load()
	unauthorized := 0
	for i := range addresses {
		attacker := clientFrom(fmt.Sprintf("127.0.1.%d", 1+i))
		for range perAddress {
			switch res := getOrders(t, attacker, url, unknownKey()); res.status {
			case http.StatusUnauthorized:
				unauthorized++
			case http.StatusTooManyRequests:
			default:
				t.Fatalf("a made-up key = %d", res.status)
			}
		}
	}
	lookups := queries.n.Load() - before
	t.Logf("%d made-up keys from %d addresses: %d looked up, %d statements", addresses*perAddress, addresses, unauthorized, lookups)
	// The total (100), then one for each of the 45 addresses that came
	// after it was spent.
	if want := 100 + (addresses - 100/perAddress); unauthorized != want || lookups != int64(want) {
		t.Errorf("%d made-up keys from %d addresses: %d looked up, %d statements; want %d each", addresses*perAddress, addresses, unauthorized, lookups, want)
	}
	if res := getOrders(t, clientFrom("127.0.2.1"), url, valid); res.status != http.StatusOK {
		t.Errorf("a valid key from an address that sent no unknown key, during the flood = %d, want 200", res.status)
	}
}

// BenchmarkUnknownKeyFlood: eight clients on one address send well-formed
// keys of no tenant, each new, for the benchmark's time, with the default
// budget of failed lookups and without one (a budget too large to bind).
// It reports the PostgreSQL statements per 1,000 requests (the target is at
// most 20 with the budget) and checks its own traffic: every answer is a
// 401 or a 429, and the statements counted are the lookups of the 401s.
//
//	go test -run='^$' -bench=UnknownKeyFlood -benchtime=5s ./internal/http/
func BenchmarkUnknownKeyFlood(b *testing.B) {
	for _, tt := range []struct {
		name           string
		lookups, total httpapi.RateLimit
	}{
		{"WithoutBudget", httpapi.RateLimit{Rate: 1e9, Burst: 1e9}, httpapi.RateLimit{Rate: 1e9, Burst: 1e9}},
		{"DefaultBudget", httpapi.DefaultAuthLookups, httpapi.DefaultAuthLookupsTotal},
	} {
		b.Run(tt.name, func(b *testing.B) {
			url, queries, _ := floodServer(b, tt.lookups, tt.total)
			client := clientFrom("127.0.0.4")
			var unauthorized, throttled atomic.Int64
			before := queries.n.Load()
			b.ResetTimer()
			var next atomic.Int64
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					for next.Add(1) <= int64(b.N) {
						switch res := getOrders(b, client, url, unknownKey()); res.status {
						case http.StatusUnauthorized:
							unauthorized.Add(1)
						case http.StatusTooManyRequests:
							throttled.Add(1)
						default:
							b.Errorf("a made-up key = %d", res.status)
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			n := queries.n.Load() - before
			if n != unauthorized.Load() {
				b.Errorf("%d statements for %d lookups that answered 401", n, unauthorized.Load())
			}
			b.ReportMetric(float64(n)*1000/float64(b.N), "queries/1000req")
			b.ReportMetric(float64(throttled.Load())*100/float64(b.N), "%throttled")
			if testing.Verbose() {
				fmt.Println(strings.Join([]string{tt.name, fmt.Sprint(b.N), "requests,", fmt.Sprint(n), "queries"}, " "))
			}
		})
	}
}
