package httpapi_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apispec "github.com/idemref/payments"
	httpapi "github.com/idemref/payments/internal/http"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/testdb"
)

// R1: one tenant floods the API with 64 connections creating orders while
// a quiet tenant reads one order at a time. Without the rate limit the
// flood takes the shared pool and CPU and the quiet tenant waits; with it
// the flood gets cheap 429s and the quiet tenant's latency stays close to
// idle, to the extent the 429s themselves leave CPU: here the flood's 64
// clients share the API's two cores. Reports the quiet tenant's median and p90 latency; the flood
// checks its own traffic (2xx and 429 counts), so a flood that never ran
// cannot pass for a fast quiet tenant.
//
//	go test -run='^$' -bench=QuietTenant -count=5 ./internal/http/
func BenchmarkQuietTenantUnderFlood(b *testing.B) {
	limit := httpapi.RateLimit{Rate: httpapi.DefaultRateLimit, Burst: httpapi.DefaultRateBurst}
	for _, tt := range []struct {
		name  string
		flood bool
		limit httpapi.RateLimit
		// backOff: the flood's clients wait Retry-After (1 s) after a 429,
		// as a well-behaved SDK does; without it they resend at once, as a
		// hostile client does.
		backOff bool
	}{
		{"Idle", false, httpapi.RateLimit{}, false},
		{"FloodWithoutLimit", true, httpapi.RateLimit{}, false},
		{"FloodWithLimit", true, limit, false},
		{"FloodWithLimitClientsBackOff", true, limit, true},
	} {
		b.Run(tt.name, func(b *testing.B) {
			pool, _ := testdb.NewPool(b)
			_, loud, err := tenants.Create(b.Context(), pool, "loud")
			if err != nil {
				b.Fatal(err)
			}
			_, quiet, err := tenants.Create(b.Context(), pool, "quiet")
			if err != nil {
				b.Fatal(err)
			}
			srv := httptest.NewServer(httpapi.NewHandler(httpapi.Config{
				Pool: pool, Idem: idem.NewStore(pool, idem.Config{}), Logger: slog.New(slog.DiscardHandler),
				RequestTimeout: 10 * time.Second, OpenAPI: apispec.OpenAPI, RateLimit: tt.limit, AuthCacheTTL: 10 * time.Second,
			}))
			b.Cleanup(srv.Close)
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
			send := func(ctx context.Context, method, path, apiKey, key, body string) (int, error) {
				req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, strings.NewReader(body))
				if err != nil {
					return 0, err
				}
				req.Header.Set("Authorization", "Bearer "+apiKey)
				if key != "" {
					req.Header.Set(idem.HeaderName, key)
					req.Header.Set("Content-Type", "application/json")
				}
				res, err := client.Do(req)
				if err != nil {
					return 0, err
				}
				res.Body.Close()
				return res.StatusCode, nil
			}
			status, err := send(b.Context(), http.MethodPost, "/v1/orders", quiet, "quiet-order", orderBody("quiet-1"))
			if err != nil || status != http.StatusCreated {
				b.Fatalf("quiet tenant's order: %d %v", status, err)
			}

			ctx, stop := context.WithCancel(b.Context())
			var wg sync.WaitGroup
			var ok2xx, limited, other atomic.Int64
			if tt.flood {
				for w := range 64 {
					wg.Go(func() {
						for i := 0; ctx.Err() == nil; i++ {
							ref := fmt.Sprintf("loud-%d-%d", w, i)
							status, err := send(ctx, http.MethodPost, "/v1/orders", loud, ref, orderBody(ref))
							switch {
							case err != nil:
							case status < 300:
								ok2xx.Add(1)
							case status == http.StatusTooManyRequests:
								limited.Add(1)
								if tt.backOff {
									select {
									case <-ctx.Done():
									case <-time.After(time.Second):
									}
								}
							default:
								other.Add(1)
							}
						}
					})
				}
				time.Sleep(200 * time.Millisecond) // let the flood build up before measuring
			}

			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				status, err := send(b.Context(), http.MethodGet, "/v1/orders?limit=1", quiet, "", "")
				lat = append(lat, time.Since(start))
				if err != nil || status != http.StatusOK {
					b.Fatalf("quiet tenant's read: %d %v", status, err)
				}
			}
			b.StopTimer()
			stop()
			wg.Wait()

			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*9/10].Microseconds())/1000, "p90-ms")
			if tt.flood {
				if ok2xx.Load() == 0 {
					b.Fatalf("the flood created nothing: 2xx=%d 429=%d other=%d", ok2xx.Load(), limited.Load(), other.Load())
				}
				if tt.limit.Rate > 0 && limited.Load() == 0 {
					b.Fatal("the flood was never limited")
				}
				b.ReportMetric(float64(ok2xx.Load()), "flood-2xx")
				b.ReportMetric(float64(limited.Load()), "flood-429")
			}
		})
	}
}
