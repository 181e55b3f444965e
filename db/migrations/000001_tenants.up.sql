-- Tenants and their API keys. The tenant comes from authentication, never
-- from a request body (K2), and every key of every table leads with
-- tenant_id so one request only touches one tenant's rows.
CREATE TABLE tenants (
    id         uuid        PRIMARY KEY,
    name       text        NOT NULL CHECK (name <> ''),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- API keys are stored as SHA-256 hashes, never in clear. The key itself
-- carries the tenant id (sk_<tenant>_<secret>), so the lookup stays on the
-- (tenant_id, ...) primary key like every other table. The secret has 256
-- bits of entropy, which is why a fast hash is enough here (slow password
-- hashes exist for low-entropy secrets).
CREATE TABLE api_keys (
    tenant_id  uuid        NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key_hash   bytea       NOT NULL CHECK (length(key_hash) = 32),
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz,
    PRIMARY KEY (tenant_id, key_hash)
);
