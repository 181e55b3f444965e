-- Guarded transitions. Every state machine's allowed moves are written
-- once, in state_transitions; docs/payments.md repeats the table, and a
-- test checks that the two agree and that every allowed move happens
-- somewhere in the code. Each UPDATE in db/queries names the states it may
-- follow (WHERE status IN (...)), and this trigger is the backstop: a
-- change of status that the table does not allow is refused by the
-- database, whichever writer attempts it, so no record ever moves
-- backwards (a settled payment back to charge_sent, a succeeded refund
-- back to refund_sent). Rewriting a row with its own status (a resend's
-- second mark) is no change and is not checked.
CREATE TABLE state_transitions (
    machine    text NOT NULL,
    from_state text NOT NULL,
    to_state   text NOT NULL,
    PRIMARY KEY (machine, from_state, to_state),
    CHECK (from_state <> to_state)
);

INSERT INTO state_transitions (machine, from_state, to_state) VALUES
    -- payment: the mark before the first charge call, then one final outcome.
    ('payment', 'created', 'charge_sent'),
    ('payment', 'charge_sent', 'succeeded'),
    ('payment', 'charge_sent', 'declined'),
    ('payment', 'charge_sent', 'failed'),
    -- refund: the same shape, without declines.
    ('refund', 'created', 'refund_sent'),
    ('refund', 'refund_sent', 'succeeded'),
    ('refund', 'refund_sent', 'failed'),
    -- compensation: refunded, or refused by the processor; a refused one is
    -- tried again on a long backoff and may still succeed.
    ('compensation', 'pending', 'succeeded'),
    ('compensation', 'pending', 'refused'),
    ('compensation', 'refused', 'succeeded'),
    -- idempotency key: recorded, then pruned to a tombstone. The way back
    -- to in_progress is the claim of a key past its retention (E3): a new
    -- request under a forgotten key, not a step back of the old one; the
    -- trigger allows it only once retain_until has passed.
    ('key', 'in_progress', 'completed'),
    ('key', 'completed', 'expired'),
    ('key', 'completed', 'in_progress'),
    ('key', 'expired', 'in_progress');

-- The trigger function, shared by the four tables: TG_ARGV[0] names the
-- machine. The state column is "status", or "state" for keys.
CREATE FUNCTION guard_state_transition() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    old_state text;
    new_state text;
BEGIN
    IF TG_ARGV[0] = 'key' THEN
        old_state := OLD.state;
        new_state := NEW.state;
        IF new_state = 'in_progress' AND OLD.retain_until > now() THEN
            RAISE EXCEPTION 'key % cannot be claimed again before its retention ends', OLD.idem_key
                USING ERRCODE = 'check_violation', CONSTRAINT = 'state_transition';
        END IF;
    ELSE
        old_state := OLD.status;
        new_state := NEW.status;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM state_transitions
                   WHERE machine = TG_ARGV[0] AND from_state = old_state AND to_state = new_state) THEN
        RAISE EXCEPTION '% % -> % is not an allowed transition', TG_ARGV[0], old_state, new_state
            USING ERRCODE = 'check_violation', CONSTRAINT = 'state_transition';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER payments_guard_status BEFORE UPDATE OF status ON payments
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION guard_state_transition('payment');
CREATE TRIGGER refunds_guard_status BEFORE UPDATE OF status ON refunds
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION guard_state_transition('refund');
CREATE TRIGGER payment_compensations_guard_status BEFORE UPDATE OF status ON payment_compensations
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION guard_state_transition('compensation');
CREATE TRIGGER idempotency_keys_guard_state BEFORE UPDATE OF state ON idempotency_keys
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION guard_state_transition('key');

-- A refused compensation: the processor answered its refund with a final
-- error. It is tried again on a long backoff (the sweep), counted and
-- alerted on, and its last error is kept for the person who looks.
ALTER TABLE payment_compensations
    DROP CONSTRAINT payment_compensations_status_check,
    ADD CONSTRAINT payment_compensations_status_check CHECK (status IN ('pending', 'succeeded', 'refused')),
    ADD COLUMN failure_message text;

-- A settled success names its charge: the sweep keeps that charge and
-- refunds every other one, so a succeeded payment without a charge id
-- would have every real charge refunded.
ALTER TABLE payments
    ADD CONSTRAINT payments_succeeded_has_charge CHECK (status <> 'succeeded' OR coalesce(charge_id, '') <> '');

-- One payment (refund) per derived key. The key is derived from the
-- client's scoped key (S2), so a second row under it would be a second
-- execution of one request, and a webhook naming the key could settle
-- either row. A database that already holds such rows stops here: they are
-- the duplicate executions of defect "key forgotten at completion", and a
-- person must decide which row is the payment.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM payments GROUP BY charge_key HAVING count(*) > 1) THEN
        RAISE EXCEPTION 'payments share a charge_key; see SELECT charge_key, array_agg(id) FROM payments GROUP BY 1 HAVING count(*) > 1';
    END IF;
    IF EXISTS (SELECT 1 FROM refunds GROUP BY refund_key HAVING count(*) > 1) THEN
        RAISE EXCEPTION 'refunds share a refund_key; see SELECT refund_key, array_agg(id) FROM refunds GROUP BY 1 HAVING count(*) > 1';
    END IF;
END;
$$;
CREATE UNIQUE INDEX payments_charge_key_key ON payments (charge_key);
CREATE UNIQUE INDEX refunds_refund_key_key ON refunds (refund_key);
