-- name: TenantCreate :one
INSERT INTO tenants (id, name) VALUES (@id, @name)
RETURNING *;

-- name: APIKeyCreate :exec
INSERT INTO api_keys (tenant_id, key_hash) VALUES (@tenant_id, @key_hash);

-- name: APIKeyAuthenticate :one
-- The tenant id comes from the key's prefix; the hash proves the secret.
SELECT tenant_id FROM api_keys
WHERE tenant_id = @tenant_id AND key_hash = @key_hash AND revoked_at IS NULL;
