package testkit

import (
	"net"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/tooling/pgwire"
)

// WireProxy puts a pgwire proxy (counting round trips and statements, and
// able to lose a COMMIT) in front of the database at databaseURL, closed
// when the test ends, and returns it with a pool configuration that
// connects through it, for the caller to adjust and open.
func WireProxy(t testing.TB, databaseURL string) (*pgwire.Proxy, *pgxpool.Config) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	wire, err := pgwire.Listen(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = wire.Close() })
	proxied, err := wire.URL(databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	if cfg, err = pgxpool.ParseConfig(proxied); err != nil {
		t.Fatal(err)
	}
	return wire, cfg
}
