// Package dbmigrate applies the embedded golang-migrate files in
// db/migrations to a database named by a postgres:// URL.
package dbmigrate

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5" // registers the pgx5:// driver
	"github.com/golang-migrate/migrate/v4/source/iofs"

	"github.com/idemref/payments/db/migrations"
)

// Up applies every migration not yet applied. Running it concurrently from
// several processes is safe: golang-migrate holds an advisory lock.
func Up(ctx context.Context, databaseURL string) error {
	return run(ctx, databaseURL, func(m *migrate.Migrate) error { return m.Up() })
}

// Down rolls back every migration: every table and every row goes.
func Down(ctx context.Context, databaseURL string) error {
	return run(ctx, databaseURL, func(m *migrate.Migrate) error { return m.Down() })
}

// DownSteps rolls back the last n applied migrations (n > 0).
func DownSteps(ctx context.Context, databaseURL string, n int) error {
	if n <= 0 {
		return fmt.Errorf("dbmigrate: want a positive number of migrations to roll back, got %d", n)
	}
	return run(ctx, databaseURL, func(m *migrate.Migrate) error { return m.Steps(-n) })
}

// Version reports the applied version and whether a failed migration left
// the schema dirty. Version 0 means no migration has been applied.
func Version(ctx context.Context, databaseURL string) (version uint, dirty bool, err error) {
	err = run(ctx, databaseURL, func(m *migrate.Migrate) error {
		version, dirty, err = m.Version()
		if errors.Is(err, migrate.ErrNilVersion) {
			return nil
		}
		return err
	})
	return version, dirty, err
}

func run(ctx context.Context, databaseURL string, step func(*migrate.Migrate) error) error {
	src, err := iofs.New(migrations.FS, ".")
	if err != nil {
		return fmt.Errorf("read embedded migrations: %w", err)
	}
	url, err := driverURL(databaseURL)
	if err != nil {
		return err
	}
	m, err := migrate.NewWithSourceInstance("iofs", src, url)
	if err != nil {
		return fmt.Errorf("open database for migrations: %w", err)
	}
	defer m.Close()

	// golang-migrate has no context support; GracefulStop makes a cancelled
	// context stop between two migrations instead of in the middle of one.
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			m.GracefulStop <- true
		case <-done:
		}
	}()

	if err := step(m); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// driverURL turns the usual postgres:// URL into the pgx5:// scheme that
// golang-migrate's pgx/v5 driver is registered under.
func driverURL(databaseURL string) (string, error) {
	for _, scheme := range []string{"postgres://", "postgresql://"} {
		if rest, ok := strings.CutPrefix(databaseURL, scheme); ok {
			return "pgx5://" + rest, nil
		}
	}
	return "", fmt.Errorf("DATABASE_URL must start with postgres:// or postgresql://")
}
