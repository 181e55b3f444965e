// Package tenants owns tenants and their API keys: creating a tenant with a
// fresh key, and turning a presented key back into a tenant id. Keys are
// stored as SHA-256 hashes only.
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
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return uuid.Nil, "", err
	}
	key := keyPrefix + hex.EncodeToString(id[:]) + "_" + base64.RawURLEncoding.EncodeToString(secret)
	hash := sha256.Sum256([]byte(key))
	err = db.WithTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		if _, err := q.TenantCreate(ctx, dbsqlc.TenantCreateParams{ID: id, Name: name}); err != nil {
			return err
		}
		return q.APIKeyCreate(ctx, dbsqlc.APIKeyCreateParams{TenantID: id, KeyHash: hash[:]})
	})
	if db.IsUniqueViolation(err, "tenants_name_key") {
		return uuid.Nil, "", fmt.Errorf("%w: %q", ErrNameTaken, name)
	}
	if err != nil {
		return uuid.Nil, "", fmt.Errorf("create tenant: %w", err)
	}
	return id, key, nil
}

// Authenticate returns the tenant that owns key. It returns
// ErrUnauthenticated for a key that is malformed, unknown or revoked, and
// any other error when the lookup itself failed (the caller must then fail
// closed, not treat the request as anonymous).
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
