// Package dbmigrate applies the embedded golang-migrate files in
// db/migrations to a database named by a postgres:// URL.
package dbmigrate

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5" // registers the pgx5:// driver
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemref/payments/db/migrations"
)

// Up applies every migration not yet applied. Running it concurrently from
// several processes is safe: golang-migrate holds an advisory lock.
//
// A database a newer release migrated past this binary's last migration
// (a rollback of the code, or the previous release's migration Job rerun
// during a rolling upgrade) is left alone, as up to date: migrations only
// expand within a release (docs/forking.md, "Upgrades without
// downtime"), so this release's code runs on the newer schema, and
// golang-migrate itself would fail, finding no file for the version.
// A dirty database is never in that case: it fails as golang-migrate says.
func Up(ctx context.Context, databaseURL string) error {
	latest, err := Latest()
	if err != nil {
		return err
	}
	return run(ctx, databaseURL, func(m *migrate.Migrate) error {
		if v, dirty, err := m.Version(); err == nil && !dirty && v > latest {
			return nil
		}
		return m.Up()
	})
}

// Latest is the version of the last migration this binary carries: the
// schema its code was written for.
func Latest() (uint, error) {
	src, err := iofs.New(migrations.FS, ".")
	if err != nil {
		return 0, fmt.Errorf("read embedded migrations: %w", err)
	}
	defer src.Close()
	v, err := src.First()
	if err != nil {
		return 0, fmt.Errorf("read embedded migrations: %w", err)
	}
	for {
		next, err := src.Next(v)
		if errors.Is(err, fs.ErrNotExist) {
			return v, nil
		}
		if err != nil {
			return 0, fmt.Errorf("read embedded migrations: %w", err)
		}
		v = next
	}
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

// ErrSchemaBehind: the database lacks migrations this binary's code needs.
var ErrSchemaBehind = errors.New("the database schema is older than this binary")

// Querier is what CheckApplied reads schema_migrations through (a pool).
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// CheckApplied returns ErrSchemaBehind, saying what to run, unless every
// migration this binary carries is applied and none failed halfway: the
// code's queries were written for that schema. A newer schema passes (a
// newer release migrated it: see Up). It reads the one row golang-migrate
// keeps, with no lock, so it works through a pooler.
func CheckApplied(ctx context.Context, q Querier) error {
	latest, err := Latest()
	if err != nil {
		return err
	}
	var version int64
	var dirty bool
	err = q.QueryRow(ctx, `SELECT version, dirty FROM schema_migrations`).Scan(&version, &dirty)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P01", errors.Is(err, pgx.ErrNoRows): // 42P01: undefined_table
		return fmt.Errorf("%w: no migration was applied; run api migrate up first (deploy/kubernetes/base/migrate-job.yaml)", ErrSchemaBehind)
	case err != nil:
		return fmt.Errorf("read the schema version: %w", err)
	case dirty:
		return fmt.Errorf("%w: migration %d failed halfway (schema_migrations is dirty); see docs/forking.md, \"Upgrades without downtime\"", ErrSchemaBehind, version)
	case version < 0 || uint64(version) < uint64(latest):
		return fmt.Errorf("%w: it is at migration %d and this binary needs %d; run api migrate up first (deploy/kubernetes/base/migrate-job.yaml)", ErrSchemaBehind, version, latest)
	}
	return nil
}
