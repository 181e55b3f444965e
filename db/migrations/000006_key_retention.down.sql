DROP INDEX idempotency_keys_retain_until_idx;
DELETE FROM idempotency_keys WHERE state = 'expired';
ALTER TABLE idempotency_keys
    DROP CONSTRAINT idempotency_keys_tombstone_has_no_response,
    DROP CONSTRAINT idempotency_keys_state_check,
    ADD CONSTRAINT idempotency_keys_state_check CHECK (state IN ('in_progress', 'completed')),
    DROP CONSTRAINT idempotency_keys_retain_after_expiry,
    DROP COLUMN resource_location,
    DROP COLUMN retain_until;
