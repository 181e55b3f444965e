DROP INDEX idempotency_keys_expires_at_idx;
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);
