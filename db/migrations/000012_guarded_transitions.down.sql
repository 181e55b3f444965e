DROP INDEX refunds_refund_key_key;
DROP INDEX payments_charge_key_key;
ALTER TABLE payments DROP CONSTRAINT payments_succeeded_has_charge;
UPDATE payment_compensations SET status = 'pending' WHERE status = 'refused';
ALTER TABLE payment_compensations
    DROP COLUMN failure_message,
    DROP CONSTRAINT payment_compensations_status_check,
    ADD CONSTRAINT payment_compensations_status_check CHECK (status IN ('pending', 'succeeded'));
DROP TRIGGER idempotency_keys_guard_state ON idempotency_keys;
DROP TRIGGER payment_compensations_guard_status ON payment_compensations;
DROP TRIGGER refunds_guard_status ON refunds;
DROP TRIGGER payments_guard_status ON payments;
DROP FUNCTION guard_state_transition();
DROP TABLE state_transitions;
