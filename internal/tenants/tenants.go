// Package tenants owns tenants and their API keys: creating a tenant with a
// fresh key, turning a presented key back into a tenant id, and managing
// keys: listing tenants, a second key for rotation with overlap,
// listing a tenant's keys, revoking one. Keys are stored as SHA-256 hashes
// only and shown once, when created; operators name a key by its KeyID.
// A revoked key stops working within the authentication cache's TTL
// (Cache).
package tenants

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/db/dbsqlc"
)

// ErrUnauthenticated: the presented key is malformed, unknown or revoked.
var ErrUnauthenticated = errors.New("missing or invalid API key")

// keyPrefix starts every API key: sk_<tenant id as 32 hex>_<secret>.
const keyPrefix = "sk_"

// ErrNameTaken: another tenant has this name (names are unique).
var ErrNameTaken = errors.New("a tenant with this name exists already")

// Create makes a tenant and its first API key, and returns the tenant id and
// the key. The key is shown this once; only its hash is stored. A name in
// use is ErrNameTaken.
func Create(ctx context.Context, pool db.Beginner, name string) (uuid.UUID, string, error) {
	if strings.TrimSpace(name) == "" {
		return uuid.Nil, "", errors.New("tenant name must not be empty")
	}
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.Nil, "", err
	}
	key, hash := newKey(id)
	err = db.WithTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		if _, err := q.TenantCreate(ctx, dbsqlc.TenantCreateParams{ID: id, Name: name}); err != nil {
			return err
		}
		_, err := q.APIKeyCreate(ctx, dbsqlc.APIKeyCreateParams{TenantID: id, KeyHash: hash[:]})
		return err
	})
	if db.IsUniqueViolation(err, "tenants_name_key") {
		return uuid.Nil, "", fmt.Errorf("%w: %q", ErrNameTaken, name)
	}
	if err != nil {
		return uuid.Nil, "", fmt.Errorf("create tenant: %w", err)
	}
	return id, key, nil
}

// newKey returns a fresh key for tenant and its SHA-256, the only thing
// stored: sk_<tenant id as 32 hex>_<32 random bytes as unpadded base64url>.
// The secret has 256 bits of entropy, so a fast hash is enough.
func newKey(tenant uuid.UUID) (string, [sha256.Size]byte) {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret) // crypto/rand.Read never returns an error
	key := keyPrefix + hex.EncodeToString(tenant[:]) + "_" + base64.RawURLEncoding.EncodeToString(secret)
	return key, sha256.Sum256([]byte(key))
}

// Authenticate returns the tenant that owns key. It returns
// ErrUnauthenticated for a key that is malformed, unknown or revoked, and
// any other error when the lookup itself failed (the caller must then fail
// closed, not treat the request as anonymous).
//
// The lookup also stamps the key's last use when the stamp is more than a
// minute old (APIKeyAuthenticate): in the same statement, so it costs no
// round trip, and behind the Cache it runs once per key, process and
// AUTH_CACHE_TTL, never per request.
func Authenticate(ctx context.Context, q dbsqlc.DBTX, key string) (uuid.UUID, error) {
	tenantHex, _, ok := strings.Cut(strings.TrimPrefix(key, keyPrefix), "_")
	if !strings.HasPrefix(key, keyPrefix) || !ok || len(tenantHex) != 32 {
		return uuid.Nil, ErrUnauthenticated
	}
	raw, err := hex.DecodeString(tenantHex)
	if err != nil {
		return uuid.Nil, ErrUnauthenticated
	}
	tenantID, err := uuid.FromBytes(raw)
	if err != nil {
		return uuid.Nil, ErrUnauthenticated
	}
	hash := sha256.Sum256([]byte(key))
	id, err := dbsqlc.New(q).APIKeyAuthenticate(ctx, dbsqlc.APIKeyAuthenticateParams{TenantID: tenantID, KeyHash: hash[:]})
	if errors.Is(err, pgx.ErrNoRows) {
		return uuid.Nil, ErrUnauthenticated
	}
	if err != nil {
		return uuid.Nil, fmt.Errorf("authenticate: %w", err)
	}
	return id, nil
}
