ALTER TABLE idempotency_keys RESET (fillfactor);

DROP INDEX idempotency_keys_expired_lease_idx;
CREATE INDEX idempotency_keys_expired_lease_idx ON idempotency_keys (locked_until)
    WHERE state = 'in_progress' AND recovery_point IS NOT NULL;

DROP INDEX idempotency_keys_expires_at_idx;
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at) WHERE state = 'completed';

ALTER TABLE idempotency_keys DROP COLUMN pruned_at;
