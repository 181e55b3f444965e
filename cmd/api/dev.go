//go:build !nodev

package main

import (
	"context"
	"io"
	"log/slog"

	"github.com/idemref/payments/internal/config"
	"github.com/idemref/payments/internal/tooling/devmode"
)

// dev is `make run`: it needs nothing set up. Start brings up what the
// variables do not name (a private PostgreSQL, an embedded NATS server,
// the processor simulator) and the demo tenant; serve runs the API on
// them and Ready prints the banner once it listens.
func dev(ctx context.Context, cfg config.Config, logger *slog.Logger, stdout io.Writer) error {
	env, err := devmode.Start(ctx, &cfg, logger)
	if err != nil {
		return err
	}
	defer env.Stop()
	return serve(ctx, cfg, logger, func(addr, admin string) { env.Ready(addr, admin, stdout) })
}
