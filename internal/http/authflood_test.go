package httpapi_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
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
	"github.com/idemref/payments/internal/clientaddr"
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
	return floodServerWith(tb, httpapi.Config{AuthLookups: lookups, AuthLookupsTotal: total, AuthCacheTTL: 10 * time.Second})
}

// floodServerWith is floodServer with the budgets, the auth cache and the
// trusted proxies of cfg.
func floodServerWith(tb testing.TB, cfg httpapi.Config) (url string, queries *queryCounter, validKey string) {
	tb.Helper()
	_, dbURL := testdb.NewPool(tb)
	poolCfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		tb.Fatal(err)
	}
	db.Configure(poolCfg)
	queries = &queryCounter{}
	poolCfg.ConnConfig.Tracer = queries
	pool, err := pgxpool.NewWithConfig(tb.Context(), poolCfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	if _, validKey, err = tenants.Create(tb.Context(), pool, "flood "+uuid.NewString()); err != nil {
		tb.Fatal(err)
	}
	cfg.Pool, cfg.Idem, cfg.Logger = pool, idem.NewStore(pool, idem.Config{}), slog.New(slog.DiscardHandler)
	cfg.RequestTimeout, cfg.OpenAPI = 10*time.Second, apispec.OpenAPI
	srv := httptest.NewServer(httpapi.NewHandler(cfg))
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
	res, err := fetchOrders(client, url, apiKey, "")
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// fetchOrders is GET /v1/orders with apiKey, and X-Forwarded-For when
// forwardedFor is not empty (a trusted proxy naming its client).
func fetchOrders(client *http.Client, url, apiKey, forwardedFor string) (response, error) {
	req, err := http.NewRequest(http.MethodGet, url+"/v1/orders", nil)
	if err != nil {
		return response{}, err
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	if forwardedFor != "" {
		req.Header.Set("X-Forwarded-For", forwardedFor)
	}
	res, err := client.Do(req)
	if err != nil {
		return response{}, err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return response{status: res.StatusCode, header: res.Header}, nil
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

// R5 at any concurrency: the budgets bound the lookups that find no tenant
// however many requests are in flight at once. A budget checked before the
// lookup and charged after it lets through every request in flight while
// one token is left, at the burst and again at each token the budget
// refills. Here made-up keys, each new, go flat out for two seconds over 1,
// 4, 16 and 64 connections, from one address and from 50 (named by a
// trusted proxy), with the default budgets; the statements the API's pool
// sent (each one a lookup) stay within what the budgets allow for the time
// the flood took, plus a few for its rounding.
func TestUnknownKeyBudgetHoldsAtAnyConcurrency(t *testing.T) {
	t.Parallel()
	proxies := trustLoopbackProxy(t)
	cfg := httpapi.Config{AuthCacheTTL: 10 * time.Second, Clients: proxies}
	perClient, total := httpapi.DefaultAuthLookups, httpapi.DefaultAuthLookupsTotal
	const duration, addresses, slack = 2 * time.Second, 50, 3
	for _, conns := range []int{1, 4, 16, 64} {
		t.Run(fmt.Sprintf("OneAddress/%dConnections", conns), func(t *testing.T) {
			url, queries, _ := floodServerWith(t, cfg)
			attacker := clientFrom("127.0.0.5")
			f := madeUpKeyFlood(t, url, queries, duration, conns, func(int) (*http.Client, string) { return attacker, "" })
			// The address's budget: a burst, then a rate.
			f.check(t, "one address", conns, float64(perClient.Burst)+perClient.Rate*f.elapsed.Seconds()+slack)
		})
		t.Run(fmt.Sprintf("FiftyAddresses/%dConnections", conns), func(t *testing.T) {
			url, queries, _ := floodServerWith(t, cfg)
			proxy := clientFrom("127.0.0.1")
			f := madeUpKeyFlood(t, url, queries, duration, conns, func(i int) (*http.Client, string) {
				return proxy, fmt.Sprintf("198.51.100.%d", 1+i%addresses)
			})
			// The total's burst and rate, and past it one lookup per address
			// that had sent no unknown key yet.
			f.check(t, "50 addresses", conns, float64(total.Burst)+total.Rate*f.elapsed.Seconds()+addresses+slack)
		})
	}
}

// R5 under a wide flood: a client flagged for an unknown key stays flagged
// for its whole window (10 minutes), however many other addresses flood
// meanwhile, and memory stays bounded. Here the budget remembers at most 8
// clients and its per-client buckets refill in a millisecond, so a bound
// kept by dropping the buckets that refilled forgets every flagged client
// as soon as new ones come. Past the bound, the clients it has no room for
// share one budget, as one client: one lookup between them, then flagged
// together.
func TestFlaggedClientsStayFlaggedUnderAWideFlood(t *testing.T) {
	t.Parallel()
	proxies := trustLoopbackProxy(t)
	cfg := httpapi.Config{AuthCacheTTL: 10 * time.Second, Clients: proxies,
		AuthLookups: httpapi.RateLimit{Rate: 1000, Burst: 1},
		// A total that does not refill while the test runs, spent by the
		// first lookup: past it, only a client never flagged is looked up.
		AuthLookupsTotal: httpapi.RateLimit{Rate: 0.0001, Burst: 1}}
	httpapi.LimitLookupClients(&cfg, 8)
	url, queries, _ := floodServerWith(t, cfg)
	proxy := clientFrom("127.0.0.1")
	// send sends one made-up key from each of the IPv6 clients first to
	// last (each its own /64) and returns the lookups they cost.
	send := func(first, last int) int64 {
		t.Helper()
		before := queries.n.Load()
		for i := first; i <= last; i++ {
			res, err := fetchOrders(proxy, url, unknownKey(), fmt.Sprintf("2001:db8:%x::1", i))
			if err != nil || (res.status != http.StatusUnauthorized && res.status != http.StatusTooManyRequests) {
				t.Fatalf("a made-up key = %d %v, want 401 or 429", res.status, err)
			}
		}
		return queries.n.Load() - before
	}
	if n := send(1, 8); n != 8 {
		t.Fatalf("8 new clients cost %d lookups, want one each", n)
	}
	time.Sleep(20 * time.Millisecond) // every client's bucket has refilled
	if n := send(9, 16); n != 1 {
		t.Errorf("8 more new clients, past the bound, cost %d lookups, want 1 between them", n)
	}
	if n := send(1, 8); n != 0 {
		t.Errorf("the 8 flagged clients again, after 8 others came, cost %d lookups, want 0: they were forgotten", n)
	}
}

// R5: the budgets never refuse a tenant's valid key for the lookups of its
// own requests in flight, however many. With every request looked up
// (AUTH_CACHE_TTL=0, as after a restart) and the total spent by a flood
// from elsewhere, one client sends a valid key over 64 connections at
// once: every request is served.
func TestValidKeyIsServedAtAnyConcurrency(t *testing.T) {
	t.Parallel()
	proxies := trustLoopbackProxy(t)
	url, _, valid := floodServerWith(t, httpapi.Config{Clients: proxies,
		AuthLookupsTotal: httpapi.RateLimit{Rate: 0.0001, Burst: 1}})
	proxy := clientFrom("127.0.0.1")
	if res, err := fetchOrders(proxy, url, unknownKey(), "198.51.100.1"); err != nil || res.status != http.StatusUnauthorized {
		t.Fatalf("the made-up key that spends the total = %d %v, want 401", res.status, err)
	}
	var served, refused atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range 5 {
				res, err := fetchOrders(proxy, url, valid, "198.51.100.2")
				switch {
				case err != nil:
					t.Error(err)
					return
				case res.status == http.StatusOK:
					served.Add(1)
				default:
					refused.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if served.Load() != 320 {
		t.Errorf("320 requests with a valid key over 64 connections: %d served, %d not; want every one served", served.Load(), refused.Load())
	}
}

// trustLoopbackProxy trusts 127.0.0.1 as a proxy that appends its client
// to X-Forwarded-For, so a test names clients the way a balancer does.
func trustLoopbackProxy(t *testing.T) *clientaddr.Resolver {
	t.Helper()
	proxies, err := clientaddr.Parse("127.0.0.1", clientaddr.XForwardedFor)
	if err != nil {
		t.Fatal(err)
	}
	return proxies
}

// flood is what a madeUpKeyFlood sent and what it cost.
type flood struct {
	requests, lookups int64
	elapsed           time.Duration
}

func (f flood) check(t *testing.T, from string, conns int, allowed float64) {
	t.Helper()
	t.Logf("%d made-up keys from %s over %d connections in %s: %d lookups, %.1f per 1,000 (allowed %.0f)",
		f.requests, from, conns, f.elapsed.Round(time.Millisecond), f.lookups, float64(f.lookups)*1000/float64(f.requests), allowed)
	if float64(f.lookups) > allowed {
		t.Errorf("%d made-up keys from %s over %d connections cost %d lookups, want at most %.0f", f.requests, from, conns, f.lookups, allowed)
	}
}

// madeUpKeyFlood sends made-up keys, each new, over conns connections at
// once for d: request i through the client and with the X-Forwarded-For
// (none when empty) that from(i) gives. Every answer must be 401 or 429.
// The lookups are the statements the API's pool sent meanwhile.
func madeUpKeyFlood(t *testing.T, url string, queries *queryCounter, d time.Duration, conns int, from func(i int) (*http.Client, string)) flood {
	t.Helper()
	before, start := queries.n.Load(), time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			for time.Since(start) < d {
				client, forwardedFor := from(int(next.Add(1)) - 1)
				res, err := fetchOrders(client, url, unknownKey(), forwardedFor)
				if err != nil || (res.status != http.StatusUnauthorized && res.status != http.StatusTooManyRequests) {
					t.Errorf("a made-up key = %d %v, want 401 or 429", res.status, err)
					return
				}
			}
		})
	}
	wg.Wait()
	return flood{requests: next.Load(), lookups: queries.n.Load() - before, elapsed: time.Since(start)}
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
