-- Messages (M1-M4): the inbox of every consumer of at-least-once
-- deliveries, the transactional outbox of the events we publish, and the
-- order as a projection of payment and refund events.

-- processed_messages is the inbox (M1). A consumer inserts the message's
-- producer-assigned id (the processor's event id, our outbox id), never a
-- broker sequence or a delivery attempt, in the same transaction as the
-- message's effect: a redelivery conflicts on the primary key and is
-- skipped. consumer names who applied it (two consumers of one stream each
-- apply every message once); source names who assigned the id, so ids of
-- two producers cannot collide. Rows are pruned by the reaper once they are
-- older than any redelivery can be (MESSAGE_RETENTION, see docs/messages.md).
CREATE TABLE processed_messages (
    consumer     text        NOT NULL CHECK (consumer <> ''),
    source       text        NOT NULL CHECK (source <> ''),
    message_id   text        NOT NULL CHECK (length(message_id) BETWEEN 1 AND 255),
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, source, message_id)
);

CREATE INDEX processed_messages_processed_at_idx ON processed_messages (processed_at);

-- The outbox (M2): one row per event, written in the transaction that makes
-- the business change, relayed to the broker with id as the message id.
--   seq           commit-independent insertion order, for the relay's order;
--   xid           the writing transaction (pg_current_xact_id()). The relay
--                 only claims rows whose transaction is older than every
--                 transaction still running (pg_snapshot_xmin), so it never
--                 publishes past a row that is still in flight;
--   payload       the exact bytes published;
--   claimed_until a relay's claim while it publishes; a relay that dies
--                 leaves the row claimable again after it;
--   published_at  set once the broker acknowledged the publish.
CREATE TABLE outbox (
    id               uuid        PRIMARY KEY,
    seq              bigint      GENERATED ALWAYS AS IDENTITY,
    xid              xid8        NOT NULL DEFAULT pg_current_xact_id(),
    tenant_id        uuid        NOT NULL,
    subject          text        NOT NULL CHECK (subject <> ''),
    event_type       text        NOT NULL CHECK (event_type <> ''),
    schema_version   integer     NOT NULL CHECK (schema_version > 0),
    payload          bytea       NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    claimed_until    timestamptz,
    publish_attempts integer     NOT NULL DEFAULT 0,
    published_at     timestamptz
);

-- The relay reads unpublished rows in seq order; published rows leave the
-- index. The reaper deletes published rows by published_at.
CREATE INDEX outbox_unpublished_idx ON outbox (seq) WHERE published_at IS NULL;
CREATE INDEX outbox_published_at_idx ON outbox (published_at) WHERE published_at IS NOT NULL;

-- Relays LISTEN on outbox; the notification is delivered at commit, so a
-- relay wakes when a row becomes visible, not when it is inserted. Polling
-- stays the fallback for a missed notification (a relay reconnecting).
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- The order becomes a projection of payment and refund events, applied by
-- the orders consumer (M1): amount_paid is what was paid and not refunded,
-- amount_refunded what was refunded. amount_paid >= 0 also makes a refund
-- event that overtook its payment event fail and be redelivered later.
ALTER TABLE orders
    ADD COLUMN amount_refunded bigint NOT NULL DEFAULT 0 CHECK (amount_refunded >= 0),
    DROP CONSTRAINT orders_status_check,
    ADD CONSTRAINT orders_status_check CHECK (status IN ('pending', 'paid', 'partially_refunded', 'refunded'));

-- A processor webhook names the charge's idempotency key, not our tenant:
-- the derived key is unique across tenants (it hashes the scoped key).
CREATE INDEX payments_charge_key_idx ON payments (charge_key);
