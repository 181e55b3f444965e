package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/processor/simproc"
	"github.com/idemref/payments/internal/tooling/processorsim"
)

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		vars    map[string]string
		want    config
		wantErr bool
	}{
		{name: "Defaults", want: config{Addr: ":8090"}},
		{
			name: "AllSet",
			vars: map[string]string{"PROCESSOR_ADDR": "127.0.0.1:9000", "PROCESSOR_IGNORE_IDEMPOTENCY_KEYS": "true", "PROCESSOR_LATENCY": "250ms"},
			want: config{Addr: "127.0.0.1:9000", IgnoreIdempotencyKeys: true, Latency: 250 * time.Millisecond},
		},
		{name: "BadBool", vars: map[string]string{"PROCESSOR_IGNORE_IDEMPOTENCY_KEYS": "yes please"}, wantErr: true},
		{name: "BadLatency", vars: map[string]string{"PROCESSOR_LATENCY": "soon"}, wantErr: true},
		{name: "NegativeLatency", vars: map[string]string{"PROCESSOR_LATENCY": "-1s"}, wantErr: true},
		{name: "LatencyAtMaxExecution", vars: map[string]string{"PROCESSOR_LATENCY": "30s"}, want: config{Addr: ":8090", Latency: processorsim.MaxExecution}},
		{name: "LatencyAboveMaxExecution", vars: map[string]string{"PROCESSOR_LATENCY": "30.001s"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := loadConfig(env(tt.vars))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

// syncBuffer lets the test read the logs the server goroutine writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestRun(t *testing.T) {
	t.Parallel()

	t.Run("ServesUntilCancelledThenStopsCleanly", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var logs syncBuffer
		urlc := make(chan string, 1)
		errc := make(chan error, 1)
		go func() {
			errc <- run(ctx, env(map[string]string{"PROCESSOR_ADDR": "127.0.0.1:0", "PROCESSOR_IGNORE_IDEMPOTENCY_KEYS": "true"}), &logs,
				func(url string) { urlc <- url })
		}()
		var url string
		select {
		case url = <-urlc:
		case err := <-errc:
			t.Fatalf("run returned before listening: %v", err)
		}

		client := simproc.NewClient(url, 0)
		req := processor.ChargeRequest{Amount: 1000, Currency: "EUR", PaymentMethod: processorsim.PaymentMethodVisa}
		for range 2 {
			if _, err := client.CreateCharge(ctx, req, "k1"); err != nil {
				t.Fatal(err)
			}
		}
		charges, err := client.ChargesByIdempotencyKey(ctx, "k1")
		if err != nil {
			t.Fatal(err)
		}
		if got := len(charges); got != 2 {
			t.Errorf("charges under one key with keys ignored = %d, want 2", got)
		}

		cancel()
		if err := <-errc; err != nil {
			t.Fatalf("run: %v", err)
		}
		for _, msg := range []string{`"msg":"processor call"`, `"msg":"shutting down"`, `"msg":"processor simulator stopped"`} {
			if !strings.Contains(logs.String(), msg) {
				t.Errorf("logs lack %s:\n%s", msg, logs.String())
			}
		}
	})

	t.Run("PortInUseIsAnError", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		err = run(context.Background(), env(map[string]string{"PROCESSOR_ADDR": ln.Addr().String()}), &syncBuffer{}, nil)
		if err == nil || !strings.Contains(err.Error(), "listen") {
			t.Errorf("err = %v, want a listen error", err)
		}
	})
}
