package tenants_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/testdb"
)

func TestKeyID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sum := sha256.Sum256([]byte(b.key))
	if got, want := tenants.KeyID(b.key), hex.EncodeToString(sum[:])[:8]; got != want {
		t.Fatalf("KeyID = %q, want the first 8 hex digits of the key's SHA-256, %q", got, want)
	}
	keys, err := tenants.Keys(t.Context(), b.tx, b.tenantID)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0].ID != tenants.KeyID(b.key) {
		t.Fatalf("Keys = %+v, want the one key with the id %s", keys, tenants.KeyID(b.key))
	}
}

func TestFindAndList(t *testing.T) {
	t.Parallel()

	t.Run("FindsByIDOrName", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, ref := range []string{b.tenantID.String(), b.name} {
			got, err := tenants.Find(t.Context(), b.tx, ref)
			if err != nil || got.ID != b.tenantID || got.Name != b.name {
				t.Errorf("Find(%q) = %+v, %v; want %v %q", ref, got, err, b.tenantID, b.name)
			}
		}
	})

	t.Run("ANameThatLooksLikeAnID", func(t *testing.T) {
		t.Parallel()
		tx := testdb.Tx(t)
		name := uuid.NewString()
		id, _, err := tenants.Create(t.Context(), tx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := tenants.Find(t.Context(), tx, name); err != nil || got.ID != id {
			t.Fatalf("Find(%q) = %+v, %v; want the tenant named so, %v", name, got, err, id)
		}
	})

	t.Run("UnknownTenant", func(t *testing.T) {
		t.Parallel()
		tx := testdb.Tx(t)
		for _, ref := range []string{"nobody " + uuid.NewString(), uuid.NewString()} {
			if _, err := tenants.Find(t.Context(), tx, ref); !errors.Is(err, tenants.ErrTenantNotFound) {
				t.Errorf("Find(%q) = %v, want ErrTenantNotFound", ref, err)
			}
		}
	})

	t.Run("ListCountsKeys", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		second := createKey(t, b)
		if _, err := tenants.Revoke(t.Context(), b.tx, b.tenantID, tenants.KeyID(second), false); err != nil {
			t.Fatal(err)
		}
		if _, _, err := tenants.CreateKey(t.Context(), b.tx, b.tenantID); err != nil {
			t.Fatal(err)
		}
		all, err := tenants.List(t.Context(), b.tx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range all {
			if s.ID == b.tenantID {
				if s.Name != b.name || s.LiveKeys != 2 || s.Keys != 3 {
					t.Errorf("List: %+v, want %q with 2 live keys of 3", s, b.name)
				}
				return
			}
		}
		t.Fatalf("List has no tenant %v", b.tenantID)
	})
}

// createKey adds a key to b's tenant and returns it.
func createKey(t *testing.T, b *bundle) string {
	t.Helper()
	k, key, err := tenants.CreateKey(t.Context(), b.tx, b.tenantID)
	if err != nil {
		t.Fatalf("CreateKey: %v", err)
	}
	if k.ID != tenants.KeyID(key) || k.RevokedAt != nil || k.CreatedAt.IsZero() {
		t.Fatalf("CreateKey returned %+v for a key with the id %s", k, tenants.KeyID(key))
	}
	return key
}

func TestCreateKey(t *testing.T) {
	t.Parallel()

	t.Run("BothKeysWork", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		second := createKey(t, b)
		if !keyPattern.MatchString(second) || second == b.key {
			t.Fatalf("second key %q: not in the published format, or the first key again", second)
		}
		for _, key := range []string{b.key, second} {
			if got, err := tenants.Authenticate(t.Context(), b.tx, key); err != nil || got != b.tenantID {
				t.Errorf("Authenticate(key %s) = %v, %v; want %v", tenants.KeyID(key), got, err, b.tenantID)
			}
		}
	})

	t.Run("UnknownTenant", func(t *testing.T) {
		t.Parallel()
		tx := testdb.Tx(t)
		if _, _, err := tenants.CreateKey(t.Context(), tx, uuid.New()); !errors.Is(err, tenants.ErrTenantNotFound) {
			t.Fatalf("CreateKey(unknown tenant) = %v, want ErrTenantNotFound", err)
		}
	})
}

func TestRevoke(t *testing.T) {
	t.Parallel()

	t.Run("RevokedKeyIsRefusedTheOtherWorks", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		second := createKey(t, b)
		k, err := tenants.Revoke(t.Context(), b.tx, b.tenantID, tenants.KeyID(b.key), false)
		if err != nil {
			t.Fatalf("Revoke: %v", err)
		}
		if k.ID != tenants.KeyID(b.key) || k.RevokedAt == nil {
			t.Fatalf("Revoke returned %+v, want the first key with its revocation time", k)
		}
		if _, err := tenants.Authenticate(t.Context(), b.tx, b.key); !errors.Is(err, tenants.ErrUnauthenticated) {
			t.Errorf("Authenticate(revoked key) = %v, want ErrUnauthenticated", err)
		}
		if got, err := tenants.Authenticate(t.Context(), b.tx, second); err != nil || got != b.tenantID {
			t.Errorf("Authenticate(second key) = %v, %v; want %v", got, err, b.tenantID)
		}
	})

	t.Run("TwiceSaysSoAndKeepsTheFirstTime", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		createKey(t, b)
		first, err := tenants.Revoke(t.Context(), b.tx, b.tenantID, tenants.KeyID(b.key), false)
		if err != nil {
			t.Fatal(err)
		}
		again, err := tenants.Revoke(t.Context(), b.tx, b.tenantID, tenants.KeyID(b.key), false)
		if !errors.Is(err, tenants.ErrAlreadyRevoked) {
			t.Fatalf("second Revoke = %v, want ErrAlreadyRevoked", err)
		}
		if again.RevokedAt == nil || !again.RevokedAt.Equal(*first.RevokedAt) {
			t.Errorf("second Revoke reports revoked at %v, want the first revocation's %v", again.RevokedAt, first.RevokedAt)
		}
	})

	t.Run("LastLiveKeyOnlyWithForce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if _, err := tenants.Revoke(t.Context(), b.tx, b.tenantID, tenants.KeyID(b.key), false); !errors.Is(err, tenants.ErrLastLiveKey) {
			t.Fatalf("Revoke(last live key) = %v, want ErrLastLiveKey", err)
		}
		if _, err := tenants.Authenticate(t.Context(), b.tx, b.key); err != nil {
			t.Fatalf("the refused revocation revoked the key: %v", err)
		}
		if _, err := tenants.Revoke(t.Context(), b.tx, b.tenantID, tenants.KeyID(b.key), true); err != nil {
			t.Fatalf("Revoke(last live key, force) = %v", err)
		}
		if _, err := tenants.Authenticate(t.Context(), b.tx, b.key); !errors.Is(err, tenants.ErrUnauthenticated) {
			t.Errorf("Authenticate(force-revoked key) = %v, want ErrUnauthenticated", err)
		}
	})

	t.Run("KeyIDs", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		createKey(t, b)
		sum := sha256.Sum256([]byte(b.key))
		full := hex.EncodeToString(sum[:])
		tests := []struct {
			name  string
			keyID string
			want  error
		}{
			{name: "TooShort", keyID: full[:7], want: tenants.ErrKeyIDInvalid},
			{name: "TooLong", keyID: full + "0", want: tenants.ErrKeyIDInvalid},
			{name: "NotHex", keyID: "zzzzzzzz", want: tenants.ErrKeyIDInvalid},
			{name: "TheKeyItself", keyID: b.key, want: tenants.ErrKeyIDInvalid},
			{name: "Unknown", keyID: unknownKeyID(full), want: tenants.ErrKeyNotFound},
			{name: "UnknownLonger", keyID: full[:8] + "x", want: tenants.ErrKeyIDInvalid},
			{name: "WholeHashUpperCase", keyID: strings.ToUpper(full), want: nil},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				// Not parallel: one transaction, one query at a time.
				_, err := tenants.Revoke(t.Context(), b.tx, b.tenantID, tt.keyID, false)
				if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
					t.Errorf("Revoke(%q) = %v, want %v", tt.keyID, err, tt.want)
				}
			})
		}
	})

	t.Run("UnknownTenant", func(t *testing.T) {
		t.Parallel()
		tx := testdb.Tx(t)
		if _, err := tenants.Revoke(t.Context(), tx, uuid.New(), "01234567", true); !errors.Is(err, tenants.ErrTenantNotFound) {
			t.Fatalf("Revoke(unknown tenant) = %v, want ErrTenantNotFound", err)
		}
	})

	// Two revocations at once of a tenant's last two live keys: one wins,
	// the other finds the key it would revoke the last one. Without the
	// tenant lock each could count the other's key live and both commit.
	t.Run("ConcurrentRevocationsLeaveALiveKey", func(t *testing.T) {
		t.Parallel()
		pool, _ := testdb.NewPool(t)
		for i := range 10 {
			tenant, first, err := tenants.Create(t.Context(), pool, "race "+uuid.NewString())
			if err != nil {
				t.Fatal(err)
			}
			_, second, err := tenants.CreateKey(t.Context(), pool, tenant)
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for j, key := range []string{first, second} {
				wg.Go(func() {
					_, errs[j] = tenants.Revoke(t.Context(), pool, tenant, tenants.KeyID(key), false)
				})
			}
			wg.Wait()
			var won, refused int
			for _, err := range errs {
				switch {
				case err == nil:
					won++
				case errors.Is(err, tenants.ErrLastLiveKey):
					refused++
				default:
					t.Fatalf("round %d: Revoke = %v", i, err)
				}
			}
			if won != 1 || refused != 1 {
				t.Fatalf("round %d: %d revocations succeeded and %d were refused, want 1 and 1 (errors %v)", i, won, refused, errs)
			}
		}
	})
}

// The lookup stamps last_used_at when the stamp is missing or more than a
// minute old, and otherwise writes nothing; a revoked key is not stamped.
func TestAuthenticateStampsLastUse(t *testing.T) {
	t.Parallel()
	lastUsed := func(t *testing.T, b *bundle, key string) *time.Time {
		t.Helper()
		var at *time.Time
		sum := sha256.Sum256([]byte(key))
		if err := b.tx.QueryRow(t.Context(), "SELECT last_used_at FROM api_keys WHERE tenant_id = $1 AND key_hash = $2", b.tenantID, sum[:]).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	set := func(t *testing.T, b *bundle, sql string) {
		t.Helper()
		if _, err := b.tx.Exec(t.Context(), "UPDATE api_keys SET "+sql+" WHERE tenant_id = $1", b.tenantID); err != nil {
			t.Fatal(err)
		}
	}
	// now() inside the test's transaction is the transaction's start.
	txNow := func(t *testing.T, b *bundle) time.Time {
		t.Helper()
		var now time.Time
		if err := b.tx.QueryRow(t.Context(), "SELECT now()").Scan(&now); err != nil {
			t.Fatal(err)
		}
		return now
	}
	authenticate := func(t *testing.T, b *bundle) {
		t.Helper()
		if _, err := tenants.Authenticate(t.Context(), b.tx, b.key); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("NeverUsed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if at := lastUsed(t, b, b.key); at != nil {
			t.Fatalf("a new key was last used at %v, want never", at)
		}
		authenticate(t, b)
		if at, now := lastUsed(t, b, b.key), txNow(t, b); at == nil || !at.Equal(now) {
			t.Fatalf("last_used_at = %v, want %v", at, now)
		}
	})

	t.Run("StampedWithinTheMinuteStays", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		set(t, b, "last_used_at = now() - interval '30 seconds'")
		want := lastUsed(t, b, b.key)
		authenticate(t, b)
		if diff := cmp.Diff(want, lastUsed(t, b, b.key)); diff != "" {
			t.Fatalf("a stamp 30 s old was rewritten (-want +got):\n%s", diff)
		}
	})

	t.Run("StampedOverAMinuteAgoMoves", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		set(t, b, "last_used_at = now() - interval '2 minutes'")
		authenticate(t, b)
		if at, now := lastUsed(t, b, b.key), txNow(t, b); at == nil || !at.Equal(now) {
			t.Fatalf("last_used_at = %v, want %v", at, now)
		}
	})

	t.Run("RevokedKeyIsNotStamped", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		set(t, b, "revoked_at = now()")
		if _, err := tenants.Authenticate(t.Context(), b.tx, b.key); !errors.Is(err, tenants.ErrUnauthenticated) {
			t.Fatalf("Authenticate(revoked) = %v", err)
		}
		if at := lastUsed(t, b, b.key); at != nil {
			t.Fatalf("a revoked key's lookup stamped it at %v", at)
		}
	})

	// The stamp never waits: with the key's row locked by another
	// transaction (a revocation in flight, an operator in psql), the
	// lookup answers at once and leaves the stamp to a later one.
	t.Run("NeverWaitsForALock", func(t *testing.T) {
		t.Parallel()
		pool, _ := testdb.NewPool(t)
		tenant, key, err := tenants.Create(t.Context(), pool, "locked")
		if err != nil {
			t.Fatal(err)
		}
		locked := make(chan struct{})
		release := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- db.WithTx(context.Background(), pool, func(ctx context.Context, tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "SELECT 1 FROM api_keys WHERE tenant_id = $1 FOR UPDATE", tenant); err != nil {
					return err
				}
				close(locked)
				<-release
				return nil
			})
		}()
		<-locked
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		got, err := tenants.Authenticate(ctx, pool, key)
		close(release)
		if err != nil || got != tenant {
			t.Fatalf("Authenticate with the key's row locked = %v, %v; want %v at once", got, err, tenant)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		var at *time.Time
		if err := pool.QueryRow(t.Context(), "SELECT last_used_at FROM api_keys WHERE tenant_id = $1", tenant).Scan(&at); err != nil {
			t.Fatal(err)
		}
		if at != nil {
			t.Errorf("the lookup stamped a locked row (%v): did it wait for the lock?", at)
		}
	})
}

// unknownKeyID is a well-formed key id that names no key whose hash is
// full: 00000000, or ffffffff when the hash happens to start with that.
func unknownKeyID(full string) string {
	if strings.HasPrefix(full, "00000000") {
		return "ffffffff"
	}
	return "00000000"
}
