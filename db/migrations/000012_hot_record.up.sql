-- Recording the response is a HOT update (P1). PostgreSQL updates a row
-- "heap-only" (no new entry in any index, the new version on the same
-- page) only when no column an index uses changed, the columns of partial
-- index predicates included. The record changes state, completed_at and
-- the response columns; until now the reaper's index (WHERE state =
-- 'completed') and the completer's lease index (WHERE state = 'in_progress'
-- AND recovery_point IS NOT NULL) named state, so every record wrote three
-- new index entries (primary key, expires_at, retain_until) beside the new
-- row version. Both indexes now select their rows by columns the record of
-- a one-transaction key never changes:
--
--   - expires_at_idx holds the keys whose response the reaper has not
--     pruned yet: pruned_at IS NULL (in-progress keys too; the prune still
--     filters on state = 'completed'). The prune sets pruned_at, so a
--     tombstone leaves the index as before (see 000007).
--   - expired_lease_idx holds the keys with a lease: locked_until IS NOT
--     NULL. Only an in-progress multi-step key has one; the record of a
--     multi-step key clears it (that record is not HOT, and need not be).
--
-- The fill factor leaves room on each page for the recorded version of the
-- rows inserted there (the response makes the row several times longer);
-- without it, a record finding its page full moves to another page and
-- writes its index entries after all.
ALTER TABLE idempotency_keys ADD COLUMN pruned_at timestamptz;
UPDATE idempotency_keys SET pruned_at = coalesce(completed_at, now()) WHERE state = 'expired';

DROP INDEX idempotency_keys_expires_at_idx;
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at) WHERE pruned_at IS NULL;

DROP INDEX idempotency_keys_expired_lease_idx;
CREATE INDEX idempotency_keys_expired_lease_idx ON idempotency_keys (locked_until) WHERE locked_until IS NOT NULL;

ALTER TABLE idempotency_keys SET (fillfactor = 70);

COMMENT ON COLUMN idempotency_keys.pruned_at IS
    'When the reaper dropped the recorded response and left a tombstone (E2); NULL until then.';
