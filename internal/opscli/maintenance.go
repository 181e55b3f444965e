package opscli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/config"
	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/dbmigrate"
	"github.com/idemref/payments/internal/reaper"
)

// NewReaper builds the reaper from cfg.
func NewReaper(pool *pgxpool.Pool, cfg config.Config, logger *slog.Logger) *reaper.Reaper {
	return reaper.New(pool, reaper.Config{Interval: cfg.ReaperInterval, Batch: cfg.ReaperBatch, Duty: cfg.ReaperDuty, MessageRetention: cfg.MessageRetention, Logger: logger})
}

// RunReaper makes one reaper pass and prints its counts, or with loop runs
// the reaper every REAPER_INTERVAL until ctx is cancelled.
func RunReaper(ctx context.Context, cfg config.Config, logger *slog.Logger, loop bool, stdout io.Writer) error {
	if loop && cfg.ReaperInterval <= 0 {
		return errors.New("REAPER_INTERVAL must be positive for reap --loop")
	}
	pool, err := db.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	r := NewReaper(pool, cfg, logger)
	if loop {
		logger.Info("reaper running", slog.Duration("interval", cfg.ReaperInterval), slog.Int("batch", cfg.ReaperBatch))
		r.Run(ctx)
		return nil
	}
	res, err := r.RunOnce(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "pruned %d\ndeleted %d\nmessages deleted %d\noutbox deleted %d\n", res.Pruned, res.Deleted, res.Messages, res.Outbox)
	return nil
}

// Migrate applies every migration ("up"), or rolls back steps of them
// (steps > 0) or all of them (steps < 0, "down --all"). databaseURL must
// reach PostgreSQL directly: the migrations hold a session advisory lock,
// which a pooler in transaction mode would lose between statements.
func Migrate(ctx context.Context, databaseURL, direction string, steps int, logger *slog.Logger) error {
	var err error
	switch {
	case direction == "up":
		err = dbmigrate.Up(ctx, databaseURL)
	case steps < 0:
		err = dbmigrate.Down(ctx, databaseURL)
	default:
		err = dbmigrate.DownSteps(ctx, databaseURL, steps)
	}
	if err != nil {
		return err
	}
	version, _, err := dbmigrate.Version(ctx, databaseURL)
	if err != nil {
		return err
	}
	if latest, err := dbmigrate.Latest(); err == nil && direction == "up" && version > latest {
		logger.Warn("the schema is newer than this binary: a later release migrated it, nothing was applied, and this binary runs on it (migrations only expand within a release)",
			slog.Uint64("version", uint64(version)), slog.Uint64("binary_version", uint64(latest)))
		return nil
	}
	logger.Info("migrated", slog.String("direction", direction), slog.Uint64("version", uint64(version)))
	return nil
}
