CREATE TABLE orders (
    tenant_id   uuid        NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id          uuid        NOT NULL,
    -- The client's natural key. Its unique constraint is the backstop (N1)
    -- for a client that minted a new idempotency key for the same order.
    reference   text        NOT NULL CHECK (length(reference) BETWEEN 1 AND 128),
    customer_id text        NOT NULL CHECK (length(customer_id) BETWEEN 1 AND 128),
    amount      bigint      NOT NULL CHECK (amount > 0),
    currency    text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    description text        NOT NULL DEFAULT '',
    metadata    jsonb       NOT NULL DEFAULT '{}',
    status      text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'paid')),
    amount_paid bigint      NOT NULL DEFAULT 0 CHECK (amount_paid >= 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id),
    CONSTRAINT orders_tenant_reference_key UNIQUE (tenant_id, reference)
);

-- Keyset pagination: newest first within a tenant.
CREATE INDEX orders_tenant_created_idx ON orders (tenant_id, created_at DESC, id DESC);
