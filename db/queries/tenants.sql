-- name: TenantCreate :one
INSERT INTO tenants (id, name) VALUES (@id, @name)
RETURNING *;

-- name: TenantGet :one
SELECT * FROM tenants WHERE id = @id;

-- name: TenantGetByName :one
SELECT * FROM tenants WHERE name = @name;

-- name: TenantList :many
-- Every tenant with how many keys it has and how many of them still work,
-- oldest first: an operator's listing, not a request path.
SELECT t.id, t.name, t.created_at,
       count(k.key_hash) FILTER (WHERE k.revoked_at IS NULL) AS live_keys,
       count(k.key_hash) AS keys
FROM tenants t
LEFT JOIN api_keys k ON k.tenant_id = t.id
GROUP BY t.id
ORDER BY t.created_at, t.id;

-- name: TenantLockKeys :one
-- Taken by a revocation before it counts the tenant's live keys, so two
-- revocations of a tenant's last two keys cannot both see the other key
-- live and lock the tenant out together. FOR NO KEY UPDATE, not FOR
-- UPDATE: the foreign keys of orders, payments and idempotency keys take
-- FOR KEY SHARE on the tenant, which this does not block.
SELECT id FROM tenants WHERE id = @id FOR NO KEY UPDATE;

-- name: APIKeyCreate :one
INSERT INTO api_keys (tenant_id, key_hash) VALUES (@tenant_id, @key_hash)
RETURNING created_at;

-- name: APIKeyList :many
SELECT key_hash, created_at, last_used_at, revoked_at FROM api_keys
WHERE tenant_id = @tenant_id
ORDER BY created_at, key_hash;

-- name: APIKeyRevoke :one
-- Guarded: a key revoked already matches nothing (pgx.ErrNoRows), and its
-- first revocation time stays.
UPDATE api_keys SET revoked_at = now()
WHERE tenant_id = @tenant_id AND key_hash = @key_hash AND revoked_at IS NULL
RETURNING revoked_at;

-- name: APIKeyAuthenticate :one
-- The tenant id comes from the key's prefix; the hash proves the secret.
-- The same statement stamps last_used_at when it is older than a minute,
-- so knowing when a key was last used costs no round trip: the lookup runs
-- only on an authentication cache miss (once per key, process and
-- AUTH_CACHE_TTL), and writes at most once a minute per key whatever the
-- number of processes. SKIP LOCKED: the stamp never waits, not for another
-- process stamping the same key nor for a revocation in flight; a lookup
-- that would wait skips it, and the next one stamps.
WITH live AS (
    SELECT k.tenant_id FROM api_keys k
    WHERE k.tenant_id = @tenant_id AND k.key_hash = @key_hash AND k.revoked_at IS NULL
), stamp AS (
    UPDATE api_keys u SET last_used_at = now()
    WHERE (u.tenant_id, u.key_hash) IN (
        SELECT s.tenant_id, s.key_hash FROM api_keys s
        WHERE s.tenant_id = @tenant_id AND s.key_hash = @key_hash AND s.revoked_at IS NULL
          AND (s.last_used_at IS NULL OR s.last_used_at < now() - interval '1 minute')
        FOR NO KEY UPDATE SKIP LOCKED)
)
SELECT tenant_id FROM live;
