package tenants

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/db/dbsqlc"
)

// The errors of key management. Each names what is wrong; the command line
// adds what to do.
var (
	// ErrTenantNotFound: no tenant has this id or name.
	ErrTenantNotFound = errors.New("no such tenant")
	// ErrKeyIDInvalid: a key id is 8 to 64 hex digits.
	ErrKeyIDInvalid = errors.New("a key id is 8 to 64 hex digits")
	// ErrKeyNotFound: none of the tenant's keys has this id.
	ErrKeyNotFound = errors.New("no such API key")
	// ErrKeyIDAmbiguous: several of the tenant's keys start with this id.
	ErrKeyIDAmbiguous = errors.New("the key id matches several keys")
	// ErrAlreadyRevoked: the key was revoked before; nothing changed.
	ErrAlreadyRevoked = errors.New("the API key was revoked already")
	// ErrLastLiveKey: revoking the key would leave its tenant without a
	// key that works, and the caller did not insist.
	ErrLastLiveKey = errors.New("it is the tenant's last key that works")
)

// keyIDDigits is how many hex digits of a key's SHA-256 its id shows: 32
// bits, enough to tell a tenant's few keys apart (Revoke refuses an id
// that matches several), and nothing an attacker can use: the hash of a
// 256-bit secret.
const keyIDDigits = 8

// KeyID names a key without revealing it: the first 8 hex digits of its
// SHA-256, which is all the database keeps of it. Whoever holds a key can
// compute its id (printf %s "$KEY" | sha256sum | cut -c1-8), so a leaked
// key is found in api key list without the database ever seeing it again.
func KeyID(key string) string {
	h := sha256.Sum256([]byte(key))
	return keyIDOf(h[:])
}

func keyIDOf(hash []byte) string { return hex.EncodeToString(hash)[:keyIDDigits] }

// Tenant is a tenant as an operator names it.
type Tenant struct {
	ID        uuid.UUID
	Name      string
	CreatedAt time.Time
}

// TenantSummary is a tenant with how many keys it has, and how many of
// them are not revoked.
type TenantSummary struct {
	Tenant
	LiveKeys, Keys int
}

// Key is an API key as an operator sees it: its id, never the key.
type Key struct {
	ID        string
	CreatedAt time.Time
	// LastUsedAt is stamped by a lookup that found the key, at most once a
	// minute, and a lookup happens only when a process's authentication
	// cache misses: a key in use is stamped at least every minute plus
	// AUTH_CACHE_TTL. Nil: not used since the stamp exists (migration 17).
	LastUsedAt *time.Time
	RevokedAt  *time.Time
	hash       []byte
}

// List returns every tenant, oldest first, with its key counts.
func List(ctx context.Context, q dbsqlc.DBTX) ([]TenantSummary, error) {
	rows, err := dbsqlc.New(q).TenantList(ctx)
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	out := make([]TenantSummary, 0, len(rows))
	for _, r := range rows {
		out = append(out, TenantSummary{
			Tenant:   Tenant{ID: r.ID, Name: r.Name, CreatedAt: r.CreatedAt},
			LiveKeys: int(r.LiveKeys), Keys: int(r.Keys),
		})
	}
	return out, nil
}

// Find returns the tenant whose id or name is ref: the id first, then, if
// no tenant has it, the name (a name may look like an id).
func Find(ctx context.Context, q dbsqlc.DBTX, ref string) (Tenant, error) {
	queries := dbsqlc.New(q)
	if id, err := uuid.Parse(ref); err == nil {
		t, err := queries.TenantGet(ctx, id)
		if err == nil {
			return Tenant{ID: t.ID, Name: t.Name, CreatedAt: t.CreatedAt}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return Tenant{}, fmt.Errorf("find tenant: %w", err)
		}
	}
	t, err := queries.TenantGetByName(ctx, ref)
	if errors.Is(err, pgx.ErrNoRows) {
		return Tenant{}, fmt.Errorf("%w: none has the id or name %q", ErrTenantNotFound, ref)
	}
	if err != nil {
		return Tenant{}, fmt.Errorf("find tenant: %w", err)
	}
	return Tenant{ID: t.ID, Name: t.Name, CreatedAt: t.CreatedAt}, nil
}

// CreateKey makes another key for tenant, which then has one more live
// key: the first step of a rotation, where old and new keys both work
// until the old one is revoked. It returns the key, shown this once, and
// what the listing will show of it.
func CreateKey(ctx context.Context, q dbsqlc.DBTX, tenant uuid.UUID) (Key, string, error) {
	key, hash := newKey(tenant)
	created, err := dbsqlc.New(q).APIKeyCreate(ctx, dbsqlc.APIKeyCreateParams{TenantID: tenant, KeyHash: hash[:]})
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.ConstraintName == "api_keys_tenant_id_fkey" {
		return Key{}, "", fmt.Errorf("%w: none has the id %s", ErrTenantNotFound, tenant)
	}
	if err != nil {
		return Key{}, "", fmt.Errorf("create key: %w", err)
	}
	return Key{ID: keyIDOf(hash[:]), CreatedAt: created, hash: hash[:]}, key, nil
}

// Keys returns tenant's keys, revoked ones included, oldest first.
func Keys(ctx context.Context, q dbsqlc.DBTX, tenant uuid.UUID) ([]Key, error) {
	rows, err := dbsqlc.New(q).APIKeyList(ctx, tenant)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	keys := make([]Key, 0, len(rows))
	for _, r := range rows {
		keys = append(keys, Key{ID: keyIDOf(r.KeyHash), CreatedAt: r.CreatedAt, LastUsedAt: r.LastUsedAt, RevokedAt: r.RevokedAt, hash: r.KeyHash})
	}
	return keys, nil
}

// Revoke revokes tenant's key whose id starts with keyID (8 to 64 hex
// digits; KeyID gives 8) and returns it. Requests with it are refused
// once each process's authentication cache entry for it expires: within
// AUTH_CACHE_TTL (Cache).
//
// A key revoked already is ErrAlreadyRevoked, returned with the key and
// its first revocation time: the wanted state holds, and the caller
// decides whether that is an error. The tenant's last live key is
// ErrLastLiveKey unless force: revoking it locks the tenant out until a
// new key is created. An id no key has is ErrKeyNotFound, one several keys
// start with ErrKeyIDAmbiguous.
//
// The tenant's row is locked (TenantLockKeys) while the keys are counted
// and one revoked, so two revocations at once cannot each leave the other
// key live; the revoking UPDATE is guarded by revoked_at IS NULL all the
// same, and a write that matched nothing is a key revoked meanwhile by
// someone who took no lock (psql).
func Revoke(ctx context.Context, pool db.Beginner, tenant uuid.UUID, keyID string, force bool) (Key, error) {
	keyID = strings.ToLower(keyID)
	if len(keyID) < keyIDDigits || len(keyID) > 2*sha256.Size || strings.Trim(keyID, "0123456789abcdef") != "" {
		return Key{}, fmt.Errorf("%w, got %q", ErrKeyIDInvalid, keyID)
	}
	var revoked Key
	err := db.WithTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		if _, err := q.TenantLockKeys(ctx, tenant); errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: none has the id %s", ErrTenantNotFound, tenant)
		} else if err != nil {
			return err
		}
		keys, err := Keys(ctx, tx, tenant)
		if err != nil {
			return err
		}
		var matches []Key
		live := 0
		for _, k := range keys {
			if strings.HasPrefix(hex.EncodeToString(k.hash), keyID) {
				matches = append(matches, k)
			}
			if k.RevokedAt == nil {
				live++
			}
		}
		switch {
		case len(matches) == 0:
			return fmt.Errorf("%w: the tenant has no key with the id %s", ErrKeyNotFound, keyID)
		case len(matches) > 1:
			var longer []string
			for _, k := range matches {
				longer = append(longer, hex.EncodeToString(k.hash)[:2*keyIDDigits])
			}
			return fmt.Errorf("%w: %s starts %s", ErrKeyIDAmbiguous, keyID, strings.Join(longer, " and "))
		}
		revoked = matches[0]
		switch {
		case revoked.RevokedAt != nil:
			return ErrAlreadyRevoked
		case live == 1 && !force:
			return ErrLastLiveKey
		}
		at, err := q.APIKeyRevoke(ctx, dbsqlc.APIKeyRevokeParams{TenantID: tenant, KeyHash: revoked.hash})
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrAlreadyRevoked
		}
		if err != nil {
			return err
		}
		revoked.RevokedAt = at
		return nil
	})
	switch {
	case errors.Is(err, ErrAlreadyRevoked):
		return revoked, err
	case errors.Is(err, ErrTenantNotFound), errors.Is(err, ErrKeyNotFound), errors.Is(err, ErrKeyIDAmbiguous), errors.Is(err, ErrLastLiveKey):
		return Key{}, err
	case err != nil:
		return Key{}, fmt.Errorf("revoke key: %w", err)
	}
	return revoked, nil
}
