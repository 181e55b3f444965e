-- Two horizons (E1, E3). A key's exact response is kept until expires_at
-- (IDEMPOTENCY_TTL) and replayed until then. Its tombstone is kept until
-- retain_until (IDEMPOTENCY_KEY_RETENTION, at least the TTL): scope,
-- fingerprint, final status, resource, times; no body, no headers. A retry
-- that finds a tombstone (or a completed record past expires_at, before the
-- reaper has pruned it) gets 409 idempotency_result_expired, never a second
-- execution. Past retain_until the key is unknown and may be claimed again.
ALTER TABLE idempotency_keys
    ADD COLUMN retain_until      timestamptz,
    -- The Location of the recorded response, kept in the tombstone so a
    -- client whose result expired still learns what it created.
    ADD COLUMN resource_location text;

UPDATE idempotency_keys SET retain_until = greatest(expires_at, created_at + interval '72 hours');
UPDATE idempotency_keys SET resource_location = response_headers -> 'Location' ->> 0
WHERE response_headers ? 'Location';

ALTER TABLE idempotency_keys
    ALTER COLUMN retain_until SET NOT NULL,
    ADD CONSTRAINT idempotency_keys_retain_after_expiry CHECK (retain_until >= expires_at),
    DROP CONSTRAINT idempotency_keys_state_check,
    ADD CONSTRAINT idempotency_keys_state_check CHECK (state IN ('in_progress', 'completed', 'expired')),
    DROP CONSTRAINT idempotency_keys_completed_has_response,
    ADD CONSTRAINT idempotency_keys_completed_has_response CHECK (
        state <> 'completed'
        OR (response_status IS NOT NULL AND response_headers IS NOT NULL
            AND response_body IS NOT NULL AND completed_at IS NOT NULL)
    ),
    -- A tombstone keeps the outcome, never the response itself (E2).
    ADD CONSTRAINT idempotency_keys_tombstone_has_no_response CHECK (
        state <> 'expired'
        OR (response_status IS NOT NULL AND completed_at IS NOT NULL
            AND response_headers IS NULL AND response_body IS NULL)
    );

-- The reaper deletes tombstones in batches ordered by retain_until.
CREATE INDEX idempotency_keys_retain_until_idx ON idempotency_keys (retain_until);
