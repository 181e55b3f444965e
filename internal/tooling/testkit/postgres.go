package testkit

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/idemref/payments/internal/tooling/pgtmp"
)

// Postgres starts a private PostgreSQL with o (its data directory made
// here, Fast, logging to t) and stops it when the test ends: for tests
// that need a server of their own, such as a primary and its standby.
func Postgres(ctx context.Context, t *testing.T, o pgtmp.Options) *pgtmp.Cluster {
	t.Helper()
	dir := t.TempDir()
	// As root the server runs as another user, who must reach the data
	// directory; the parent t.TempDir makes is 0700.
	if os.Geteuid() == 0 {
		if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil { //nolint:gosec // a test server of its own, run as the postgres account
			t.Fatal(err)
		}
	}
	// Fast turns synchronous_commit off; o.Settings win over it.
	o.Dir, o.Fast, o.Logger = filepath.Join(dir, "data"), true, Logger(t)
	c, err := pgtmp.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	return c
}
