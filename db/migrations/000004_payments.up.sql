-- Multi-step idempotency (S1, S3). A payment calls an external processor,
-- so its key cannot be claimed, executed and recorded in one transaction.
-- The key row then also carries:
--   recovery_point    the last step committed; a retry or the completer
--                     resumes from it instead of starting over;
--   locked_until      the lease: until then the attempt that holds it owns
--                     the key and duplicates get 409;
--   lease_generation  the fencing token: incremented by every takeover and
--                     checked by every step's write, so an attempt whose
--                     lease was taken over cannot overwrite anything;
--   resource_id       the payment or refund the key created.
ALTER TABLE idempotency_keys
    ADD COLUMN recovery_point   text,
    ADD COLUMN locked_until     timestamptz,
    ADD COLUMN lease_generation bigint NOT NULL DEFAULT 0,
    ADD COLUMN resource_id      uuid;

-- The completer looks for expired leases of unfinished multi-step keys.
CREATE INDEX idempotency_keys_expired_lease_idx ON idempotency_keys (locked_until)
    WHERE state = 'in_progress' AND recovery_point IS NOT NULL;

CREATE TABLE payments (
    tenant_id       uuid        NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id              uuid        NOT NULL,
    order_id        uuid        NOT NULL,
    amount          bigint      NOT NULL CHECK (amount > 0),
    currency        text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    payment_method  text        NOT NULL,
    status          text        NOT NULL DEFAULT 'created'
                                CHECK (status IN ('created', 'charge_sent', 'succeeded', 'declined', 'failed')),
    -- The derived key sent to the processor for the charge (S2).
    charge_key      text        NOT NULL,
    charge_id       text,
    decline_code    text,
    failure_message text,
    refunded_amount bigint      NOT NULL DEFAULT 0 CHECK (refunded_amount >= 0 AND refunded_amount <= amount),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, order_id) REFERENCES orders (tenant_id, id)
);

-- The natural-key backstop for payments (N1): at most one payment per order
-- that has not failed. A declined payment does not count, so the client may
-- try again with another card under a new key.
CREATE UNIQUE INDEX payments_one_live_per_order ON payments (tenant_id, order_id)
    WHERE status NOT IN ('declined', 'failed');

CREATE TABLE refunds (
    tenant_id          uuid        NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id                 uuid        NOT NULL,
    payment_id         uuid        NOT NULL,
    amount             bigint      NOT NULL CHECK (amount > 0),
    status             text        NOT NULL DEFAULT 'created'
                                   CHECK (status IN ('created', 'refund_sent', 'succeeded', 'failed')),
    -- The derived key sent to the processor for the refund (S2).
    refund_key         text        NOT NULL,
    processor_refund_id text,
    failure_message    text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, payment_id) REFERENCES payments (tenant_id, id)
);

CREATE INDEX refunds_payment_idx ON refunds (tenant_id, payment_id);
