package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemref/payments/internal/tooling/devmode"
)

// The ports of the private PostgreSQL, the embedded NATS and the simulator
// survive a restart when free, so the banner's psql and nats lines stay
// right; a port taken meanwhile is replaced by a free one.
func TestDevReusesItsPortsWhenFree(t *testing.T) {
	dir := t.TempDir()
	// Run as root, PostgreSQL runs as postgres, who must reach .dev/postgres.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(dir)
	first := runDevOnce(t)
	if first.Postgres == 0 || first.NATS == 0 || first.Simulator == 0 {
		t.Fatalf("%s after the first start = %+v, want every port", devmode.PortsFile, first)
	}
	if second := runDevOnce(t); second != first {
		t.Fatalf("ports after a restart = %+v, want the first run's %+v", second, first)
	}

	// Something else now listens on the NATS port.
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(first.NATS)))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	third := runDevOnce(t)
	if third.NATS == first.NATS || third.NATS == 0 {
		t.Errorf("NATS port with %d taken = %d, want another", first.NATS, third.NATS)
	}
	if third.Postgres != first.Postgres || third.Simulator != first.Simulator {
		t.Errorf("ports with only NATS's taken = %+v, want PostgreSQL's and the simulator's kept from %+v", third, first)
	}
}

// runDevOnce runs api dev in this process until its banner is printed,
// stops it and returns the ports it kept.
func runDevOnce(t *testing.T) devmode.Ports {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"dev"}, func(k string) string {
			return map[string]string{"ADDR": "127.0.0.1:0"}[k]
		}, &stdout, &syncBuffer{})
	}()
	deadline := time.After(2 * time.Minute)
	for !strings.Contains(stdout.String(), "Press Ctrl-C to stop.") {
		select {
		case err := <-done:
			cancel()
			t.Fatalf("api dev ended before its banner: %v", err)
		case <-deadline:
			cancel()
			t.Fatal("api dev printed no banner within 2 minutes")
		case <-time.After(50 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("api dev stopped with %v", err)
	}
	return devmode.ReadPorts()
}

// syncBuffer is a bytes.Buffer that dev's goroutine writes while the test
// reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
