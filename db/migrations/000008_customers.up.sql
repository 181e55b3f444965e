-- Customers are created and replaced with PUT /v1/customers/{id}: the
-- client chooses the id, so a retried PUT targets the same row and needs no
-- idempotency key (the first alternative of N2). The primary key is the
-- whole deduplication.
CREATE TABLE customers (
    tenant_id  uuid        NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id         uuid        NOT NULL,
    name       text        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    email      text        NOT NULL CHECK (length(email) BETWEEN 3 AND 254),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id)
);
