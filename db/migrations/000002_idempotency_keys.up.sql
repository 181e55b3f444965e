-- One row per idempotency key, scoped by tenant and endpoint (K2).
-- The primary key is what makes the claim (INSERT ... ON CONFLICT DO NOTHING)
-- a claim: the unique index decides which request owns the key (L1).
CREATE TABLE idempotency_keys (
    tenant_id           uuid        NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    -- Method plus route template ("POST /v1/orders"), never the concrete path.
    endpoint            text        NOT NULL CHECK (endpoint <> ''),
    idem_key            text        NOT NULL CHECK (length(idem_key) BETWEEN 1 AND 255),
    -- SHA-256 of the canonical request (F1) and the version of the algorithm
    -- that produced it (F3). The raw body is never stored (E2).
    fingerprint         bytea       NOT NULL CHECK (length(fingerprint) = 32),
    fingerprint_version smallint    NOT NULL,
    state               text        NOT NULL DEFAULT 'in_progress'
                                    CHECK (state IN ('in_progress', 'completed')),
    -- The recorded response (L3): exact status, the headers that matter and
    -- the exact body bytes (bytea, not jsonb, so replay is byte for byte).
    response_status     integer,
    response_headers    jsonb,
    response_body       bytea,
    created_at          timestamptz NOT NULL DEFAULT now(),
    completed_at        timestamptz,
    -- Retention (E1): rows may be deleted after this instant.
    expires_at          timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, endpoint, idem_key),
    CONSTRAINT idempotency_keys_completed_has_response CHECK (
        state <> 'completed'
        OR (response_status IS NOT NULL AND response_headers IS NOT NULL
            AND response_body IS NOT NULL AND completed_at IS NOT NULL)
    )
);

-- The expiry job deletes in bounded batches ordered by expires_at.
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);
