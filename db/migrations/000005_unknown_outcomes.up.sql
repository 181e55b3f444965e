-- Unknown outcomes (S6). A processor keeps executing a call whose caller
-- gave up, so after a timeout the charge may appear seconds later. Each
-- payment and refund therefore remembers when its latest call that may
-- still land was sent; nothing is resent, and no failure recorded, until a
-- lookup finds the call or the settle window has passed since then.
--   *_sent_at   when the latest call that may still land was sent (NULL:
--               none); written before the call, in its own transaction,
--               and put back when the processor said it did not execute;
--   *_calls     how many calls may have reached the processor; more than
--               one means a late call may land beside the recorded one;
--   sweep_at    when the reconciliation sweep must look again (NULL: no
--               look is due): one settle window plus a margin after the
--               last call, set when a payment with more than one call
--               finishes.
ALTER TABLE payments
    ADD COLUMN charge_sent_at timestamptz,
    ADD COLUMN charge_calls   integer NOT NULL DEFAULT 0 CHECK (charge_calls >= 0),
    ADD COLUMN sweep_at       timestamptz;

CREATE INDEX payments_sweep_idx ON payments (sweep_at) WHERE sweep_at IS NOT NULL;

-- duplicate_amount: money the sweep found refunded more than once under
-- this refund's key. It cannot be pulled back; it is reported (log, metric
-- and this flag) for a person to resolve with the customer.
ALTER TABLE refunds
    ADD COLUMN refund_sent_at   timestamptz,
    ADD COLUMN refund_calls     integer NOT NULL DEFAULT 0 CHECK (refund_calls >= 0),
    ADD COLUMN sweep_at         timestamptz,
    ADD COLUMN duplicate_amount bigint NOT NULL DEFAULT 0 CHECK (duplicate_amount >= 0);

CREATE INDEX refunds_sweep_idx ON refunds (sweep_at) WHERE sweep_at IS NOT NULL;

-- Compensations: refunds of charges that should not exist (a late
-- duplicate beside the recorded charge, or a charge that landed after the
-- payment was recorded as declined or failed). They refund another charge
-- than the payment's own, so they are not refunds of the payment and never
-- count against its refundable amount. One row per extra charge: the
-- primary key makes the compensation itself idempotent.
CREATE TABLE payment_compensations (
    tenant_id           uuid        NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    payment_id          uuid        NOT NULL,
    charge_id           text        NOT NULL,
    amount              bigint      NOT NULL CHECK (amount > 0),
    reason              text        NOT NULL CHECK (reason IN ('duplicate_charge', 'charge_after_failure')),
    status              text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'succeeded')),
    -- The derived key of the compensating refund (S2).
    refund_key          text        NOT NULL,
    processor_refund_id text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, payment_id, charge_id),
    FOREIGN KEY (tenant_id, payment_id) REFERENCES payments (tenant_id, id)
);

-- Calls that were in flight when this migration ran: their send time is
-- not known, so the last update stands in for it.
UPDATE payments SET charge_sent_at = updated_at, charge_calls = 1 WHERE status = 'charge_sent';
UPDATE refunds SET refund_sent_at = updated_at, refund_calls = 1 WHERE status = 'refund_sent';
