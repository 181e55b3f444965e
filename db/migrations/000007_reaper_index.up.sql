-- The reaper prunes completed keys past expires_at (E3). On an index of
-- every row, the tombstones (state 'expired', expires_at long past) sort
-- first, and every prune batch would walk past all of them, up to
-- IDEMPOTENCY_KEY_RETENTION - IDEMPOTENCY_TTL worth of keys, to reach the
-- few completed rows that are due. Indexing only completed rows makes each
-- batch read just the rows it prunes; a pruned row leaves the index.
DROP INDEX idempotency_keys_expires_at_idx;
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at) WHERE state = 'completed';
