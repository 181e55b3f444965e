//go:build nodev

package main

import (
	"context"
	"errors"
	"io"
	"log/slog"

	"github.com/idemref/payments/internal/config"
)

// dev is left out of a binary built with -tags nodev (make image): with
// it go the private PostgreSQL, the embedded NATS server and the processor
// simulator, none of which a deployment runs (docs/deployment.md, "The
// binary"). The command still parses, and says why it is not there.
func dev(context.Context, config.Config, *slog.Logger, io.Writer) error {
	return errors.New("dev: this binary was built without development mode (-tags nodev, as make image builds it); build one with go build ./cmd/api, or run make run")
}
