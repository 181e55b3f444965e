-- A payment is inserted already marked charge_sent, in its key's claim
-- transaction (P7, docs/payments.md), so no code leaves a payment at
-- created any more. Only an older version did, which inserted the payment
-- unmarked at recovery point payment_created and marked it in a
-- transaction of its own; that recovery point is gone from the code. The
-- state goes too: its one move leaves state_transitions, which then lists
-- only moves some code makes (TestEveryAllowedTransitionHappens), and the
-- column loses its default, so every insert names the state it starts in.
--
-- A database that still holds such a payment, or a key waiting at that
-- recovery point, stops here: finish them with the version that made them
-- (its completer resumes them once their lease ends), then migrate.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM payments WHERE status = 'created')
       OR EXISTS (SELECT 1 FROM idempotency_keys WHERE state = 'in_progress' AND recovery_point = 'payment_created') THEN
        RAISE EXCEPTION 'unfinished payments at status created (recovery point payment_created) remain: finish them with the previous version, whose completer resumes them; see SELECT tenant_id, id FROM payments WHERE status = ''created''';
    END IF;
END;
$$;

DELETE FROM state_transitions WHERE machine = 'payment' AND from_state = 'created' AND to_state = 'charge_sent';

ALTER TABLE payments
    ALTER COLUMN status DROP DEFAULT,
    DROP CONSTRAINT payments_status_check,
    ADD CONSTRAINT payments_status_check CHECK (status IN ('charge_sent', 'succeeded', 'declined', 'failed'));
