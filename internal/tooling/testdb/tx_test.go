package testdb_test

import (
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/tooling/testdb"
)

func TestTx(t *testing.T) {
	t.Parallel()

	t.Run("RowsAreInvisibleToAnotherTxAndGoneAfterCleanup", func(t *testing.T) {
		t.Parallel()
		other := testdb.Tx(t)
		id := uuid.New()
		t.Run("writer", func(t *testing.T) {
			tx := testdb.Tx(t)
			insertTenant(t, tx, id)
			if !tenantExists(t, tx, id) {
				t.Fatal("the writing transaction does not see its own row")
			}
			if tenantExists(t, other, id) {
				t.Fatal("another Tx sees a row that was never committed")
			}
		})
		if tenantExists(t, testdb.Tx(t), id) {
			t.Fatal("a row written in a Tx is still there after its test ended")
		}
	})

	t.Run("TwoTxShareOneDatabase", func(t *testing.T) {
		t.Parallel()
		a, b := currentDatabase(t, testdb.Tx(t)), currentDatabase(t, testdb.Tx(t))
		if a != b {
			t.Fatalf("two Tx are on databases %s and %s, want one shared database", a, b)
		}
	})

	t.Run("IsMigrated", func(t *testing.T) {
		t.Parallel()
		var rows int
		if err := testdb.Tx(t).QueryRow(t.Context(), "SELECT count(*) FROM schema_migrations").Scan(&rows); err != nil {
			t.Fatalf("schema_migrations: %v", err)
		}
		if rows == 0 {
			t.Fatal("schema_migrations is empty")
		}
	})

	t.Run("NestedTransactionsCommitAsSavepoints", func(t *testing.T) {
		t.Parallel()
		tx := testdb.Tx(t)
		nested, err := tx.Begin(t.Context())
		if err != nil {
			t.Fatalf("begin nested: %v", err)
		}
		id := uuid.New()
		insertTenant(t, nested, id)
		if err := nested.Commit(t.Context()); err != nil {
			t.Fatalf("commit nested: %v", err)
		}
		if !tenantExists(t, tx, id) {
			t.Fatal("a row committed in a savepoint is not visible in the enclosing Tx")
		}
	})

	t.Run("CommitIsRefused", func(t *testing.T) {
		t.Parallel()
		other := testdb.Tx(t)
		id := uuid.New()
		tx := testdb.Tx(t)
		insertTenant(t, tx, id)
		if err := tx.Commit(t.Context()); !errors.Is(err, testdb.ErrCommit) {
			t.Fatalf("Commit = %v, want ErrCommit", err)
		}
		if tenantExists(t, other, id) {
			t.Fatal("a refused Commit made the row visible to another Tx")
		}
	})

	t.Run("EarlyRollbackIsAllowed", func(t *testing.T) {
		t.Parallel()
		tx := testdb.Tx(t)
		// The cleanup's second rollback must not fail the test.
		if err := tx.Rollback(t.Context()); err != nil {
			t.Fatalf("Rollback: %v", err)
		}
	})
}

func insertTenant(t *testing.T, tx pgx.Tx, id uuid.UUID) {
	t.Helper()
	if _, err := tx.Exec(t.Context(), "INSERT INTO tenants (id, name) VALUES ($1, 'testdb')", id); err != nil {
		t.Fatalf("insert tenant: %v", err)
	}
}

func tenantExists(t *testing.T, tx pgx.Tx, id uuid.UUID) bool {
	t.Helper()
	var ok bool
	if err := tx.QueryRow(t.Context(), "SELECT EXISTS (SELECT 1 FROM tenants WHERE id = $1)", id).Scan(&ok); err != nil {
		t.Fatalf("look up tenant: %v", err)
	}
	return ok
}

func currentDatabase(t *testing.T, tx pgx.Tx) string {
	t.Helper()
	var name string
	if err := tx.QueryRow(t.Context(), "SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	return name
}
