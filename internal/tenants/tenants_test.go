package tenants_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// keyPattern is the published key format: sk_<tenant id as 32 hex>_<32
// random bytes as unpadded base64url>.
var keyPattern = regexp.MustCompile(`^sk_([0-9a-f]{32})_([A-Za-z0-9_-]{43})$`)

type bundle struct {
	name     string
	tx       pgx.Tx
	tenantID uuid.UUID
	key      string
}

// setup creates a tenant with a key inside a transaction rolled back when
// the test ends.
func setup(t *testing.T) *bundle {
	t.Helper()
	tx := testdb.Tx(t)
	// Names are unique, and parallel tests share the database: each its own.
	name := "Acme " + uuid.NewString()
	id, key, err := tenants.Create(t.Context(), tx, name)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return &bundle{name: name, tx: tx, tenantID: id, key: key}
}

func TestCreate(t *testing.T) {
	t.Parallel()

	t.Run("ReturnsKeyInPublishedFormatCarryingTenantID", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		m := keyPattern.FindStringSubmatch(b.key)
		if m == nil {
			t.Fatalf("key %q does not match %s", b.key, keyPattern)
		}
		if want := hex.EncodeToString(b.tenantID[:]); m[1] != want {
			t.Errorf("tenant part of the key = %s, want the tenant id %s", m[1], want)
		}
	})

	t.Run("StoresTheTenant", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var name string
		if err := b.tx.QueryRow(t.Context(), "SELECT name FROM tenants WHERE id = $1", b.tenantID).Scan(&name); err != nil {
			t.Fatalf("read tenant: %v", err)
		}
		if diff := cmp.Diff(b.name, name); diff != "" {
			t.Errorf("tenant name (-want +got):\n%s", diff)
		}
	})

	t.Run("StoresOnlyTheSHA256OfTheKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		rows, err := b.tx.Query(t.Context(), "SELECT key_hash FROM api_keys WHERE tenant_id = $1", b.tenantID)
		if err != nil {
			t.Fatalf("read api_keys: %v", err)
		}
		hashes, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
		if err != nil {
			t.Fatalf("read api_keys: %v", err)
		}
		sum := sha256.Sum256([]byte(b.key))
		if diff := cmp.Diff([][]byte{sum[:]}, hashes); diff != "" {
			t.Errorf("stored key hashes (-want +got):\n%s", diff)
		}
	})

	t.Run("NamesAreUnique", func(t *testing.T) {
		t.Parallel()
		tx := testdb.Tx(t)
		name := "Unique " + uuid.NewString()
		if _, _, err := tenants.Create(t.Context(), tx, name); err != nil {
			t.Fatal(err)
		}
		if _, _, err := tenants.Create(t.Context(), tx, name); !errors.Is(err, tenants.ErrNameTaken) {
			t.Fatalf("second Create(%q) = %v, want ErrNameTaken", name, err)
		}
	})

	t.Run("KeysAreUnique", func(t *testing.T) {
		t.Parallel()
		a, b := setup(t), setup(t)
		if a.tenantID == b.tenantID || a.key == b.key {
			t.Fatalf("two tenants share an id or a key: %v %q, %v %q", a.tenantID, a.key, b.tenantID, b.key)
		}
	})

	t.Run("RejectsEmptyName", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name       string
			tenantName string
		}{
			{name: "Empty", tenantName: ""},
			{name: "OnlySpaces", tenantName: "   "},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				tx := testdb.Tx(t)
				id, key, err := tenants.Create(t.Context(), tx, tt.tenantName)
				if err == nil {
					t.Errorf("Create(%q) = %v, %q, nil; want an error", tt.tenantName, id, key)
				}
				var n int
				if err := tx.QueryRow(t.Context(), "SELECT count(*) FROM tenants WHERE name = $1", tt.tenantName).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != 0 {
					t.Errorf("Create(%q) failed but left %d tenant rows", tt.tenantName, n)
				}
			})
		}
	})
}

func TestAuthenticate(t *testing.T) {
	t.Parallel()

	t.Run("ReturnsTheTenantOfTheKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		got, err := tenants.Authenticate(t.Context(), b.tx, b.key)
		if err != nil {
			t.Fatalf("Authenticate: %v", err)
		}
		if diff := cmp.Diff(b.tenantID, got); diff != "" {
			t.Errorf("tenant (-want +got):\n%s", diff)
		}
	})

	t.Run("TellsTenantsApart", func(t *testing.T) {
		t.Parallel()
		tx := testdb.Tx(t)
		idA, keyA, err := tenants.Create(t.Context(), tx, "A "+uuid.NewString())
		if err != nil {
			t.Fatal(err)
		}
		idB, keyB, err := tenants.Create(t.Context(), tx, "B "+uuid.NewString())
		if err != nil {
			t.Fatal(err)
		}
		for key, want := range map[string]uuid.UUID{keyA: idA, keyB: idB} {
			got, err := tenants.Authenticate(t.Context(), tx, key)
			if err != nil {
				t.Fatalf("Authenticate: %v", err)
			}
			if got != want {
				t.Errorf("Authenticate(key of %v) = %v", want, got)
			}
		}
	})

	t.Run("RejectsRevokedKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if _, err := b.tx.Exec(t.Context(), "UPDATE api_keys SET revoked_at = now() WHERE tenant_id = $1", b.tenantID); err != nil {
			t.Fatalf("revoke: %v", err)
		}
		if got, err := tenants.Authenticate(t.Context(), b.tx, b.key); !errors.Is(err, tenants.ErrUnauthenticated) {
			t.Errorf("Authenticate(revoked key) = %v, %v; want ErrUnauthenticated", got, err)
		}
	})

	t.Run("RejectsInvalidKeys", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, other, err := tenants.Create(t.Context(), b.tx, "Other")
		if err != nil {
			t.Fatal(err)
		}
		tenantHex, secret := splitKey(t, b.key)
		otherTenantHex, _ := splitKey(t, other)
		tests := []struct {
			name string
			key  string
		}{
			{name: "Empty", key: ""},
			{name: "PrefixOnly", key: "sk_"},
			{name: "WrongPrefix", key: "pk_" + tenantHex + "_" + secret},
			{name: "UpperCasePrefix", key: "SK_" + tenantHex + "_" + secret},
			{name: "NoPrefix", key: tenantHex + "_" + secret},
			{name: "TenantPartTooShort", key: "sk_" + tenantHex[:31] + "_" + secret},
			{name: "TenantPartTooLong", key: "sk_" + tenantHex + "0_" + secret},
			{name: "NoSecretSeparator", key: "sk_" + tenantHex},
			{name: "EmptySecret", key: "sk_" + tenantHex + "_"},
			{name: "NonHexTenantPart", key: "sk_" + strings.Repeat("g", 32) + "_" + secret},
			{name: "WrongSecret", key: "sk_" + tenantHex + "_" + strings.Repeat("A", 43)},
			{name: "TruncatedSecret", key: b.key[:len(b.key)-1]},
			{name: "TrailingGarbage", key: b.key + "x"},
			{name: "UpperCaseTenantHex", key: "sk_" + strings.ToUpper(tenantHex) + "_" + secret},
			{name: "AnotherTenantsIDWithThisSecret", key: "sk_" + otherTenantHex + "_" + secret},
			{name: "UnknownTenant", key: "sk_" + hex.EncodeToString(uuid.Nil[:]) + "_" + secret},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				// Not parallel: the subtests share the parent's transaction,
				// and a pgx connection runs one query at a time.
				got, err := tenants.Authenticate(t.Context(), b.tx, tt.key)
				if !errors.Is(err, tenants.ErrUnauthenticated) {
					t.Errorf("Authenticate(%q) = %v, %v; want ErrUnauthenticated", tt.key, got, err)
				}
			})
		}
	})
}

// splitKey returns the tenant part and the secret of a well-formed key.
func splitKey(t *testing.T, key string) (tenantHex, secret string) {
	t.Helper()
	m := keyPattern.FindStringSubmatch(key)
	if m == nil {
		t.Fatalf("key %q does not match %s", key, keyPattern)
	}
	return m[1], m[2]
}
