-- name: TxSetLockTimeout :exec
-- Bounds how long a duplicate waits on another transaction's uncommitted
-- claim (L5). SET LOCAL cannot take a parameter; set_config(..., true) is
-- the parameterised form of the same transaction-scoped setting.
SELECT set_config('lock_timeout', @timeout::text, true);

-- name: IdemKeyClaim :one
-- The multi-step path's claim (L1, S3), in one statement. The primary key
-- decides who owns the key: no check-then-insert. The INSERT returns no row
-- when the key exists; when another transaction holds an uncommitted claim
-- on it, it waits for that transaction (bounded by lock_timeout). A key
-- that exists but is past its retention (E3) and finished is unknown: the
-- UPDATE claims it over in the same statement, re-checking the horizon
-- under the row lock, so two requests cannot both take it. Rows inside
-- their retention match neither and are not locked, so a replay takes no
-- write lock. No row back: the key exists (see IdemKeyGet).
--
-- The key is claimed in progress, holding a lease of lease_seconds at
-- recovery point 'started', and committed so, before the processor is
-- called. A key claimed over gets a new lease generation, fencing off
-- anything that still holds the old one. (The one-transaction path claims
-- with IdemKeyClaimCompleted instead.)
WITH inserted AS (
    INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, expires_at,
                                  retain_until, recovery_point, locked_until, lease_generation)
    VALUES (@tenant_id, @endpoint, @idem_key, @fingerprint, @fingerprint_version, @expires_at, @retain_until,
            'started', now() + make_interval(secs => @lease_seconds::float8), 1)
    ON CONFLICT (tenant_id, endpoint, idem_key) DO NOTHING
    RETURNING lease_generation
), reclaimed AS (
    UPDATE idempotency_keys
    SET fingerprint = @fingerprint, fingerprint_version = @fingerprint_version,
        state = 'in_progress', response_status = NULL, response_headers = NULL, response_body = NULL,
        resource_id = NULL, resource_location = NULL, created_at = now(), completed_at = NULL,
        expires_at = @expires_at, retain_until = @retain_until,
        recovery_point = 'started',
        locked_until = now() + make_interval(secs => @lease_seconds::float8),
        lease_generation = lease_generation + 1
    WHERE tenant_id = @tenant_id AND endpoint = @endpoint AND idem_key = @idem_key
      AND idem_forgotten(state, retain_until)
      AND NOT EXISTS (SELECT 1 FROM inserted)
    RETURNING lease_generation
)
SELECT lease_generation FROM inserted
UNION ALL
SELECT lease_generation FROM reclaimed;

-- name: IdemKeyGet :one
-- What a key holds, read before executing (the one-transaction path's
-- replay check) and after a claim that found the key taken. A plain read:
-- it takes no row lock and writes nothing (P4). result_expired: the
-- response is no longer replayed (E3), whether the reaper has pruned it to
-- a tombstone yet or not; forgotten: the key is past its retention and
-- unknown, as if the reaper had deleted it. The horizons' rules are the
-- functions of migration 000014, shared by every query here. A replay
-- comes from the primary only: on_primary() (migration 000020) fails on a
-- server in recovery, before the scan, whether the key has a row or not.
SELECT sqlc.embed(idempotency_keys),
       idem_result_expired(state, expires_at)::boolean AS result_expired,
       idem_forgotten(state, retain_until)::boolean AS forgotten
FROM idempotency_keys
WHERE on_primary() AND tenant_id = @tenant_id AND endpoint = @endpoint AND idem_key = @idem_key;

-- name: IdemKeyAbsent :exec
-- Fails with SQLSTATE IK001 when the key has a row (migration 000019): the
-- one-transaction path sends it after IdemKeyGet, ahead of its BEGIN, so
-- that a key found stops the round trip before the request's statement.
SELECT idem_key_absent(@tenant_id::uuid, @endpoint::text, @idem_key::text);

-- name: IdemKeyForget :exec
-- Deletes a key past its retention (E3) before it is used afresh, as the
-- reaper would: the one-transaction claim is a plain INSERT, which such a
-- row would otherwise refuse. Re-checked here, so a key claimed over
-- meanwhile is kept.
DELETE FROM idempotency_keys
WHERE tenant_id = @tenant_id AND endpoint = @endpoint AND idem_key = @idem_key
  AND idem_forgotten(state, retain_until);

-- name: IdemKeyClaimCompleted :one
-- The one-transaction path's claim and record (L1, L3) in one statement:
-- the key row is inserted once, already completed with the exact response,
-- as the transaction's last statement. A plain INSERT, no ON CONFLICT: if
-- the key exists, or another transaction has inserted it and not yet
-- committed (the insert waits for it, bounded by lock_timeout), the
-- statement fails on the primary key, the transaction is aborted and the
-- COMMIT sent behind it rolls back everything the request wrote; the
-- request then replays what the key holds. The headers stored are only
-- those no column holds already (R6: a smaller row): Location is
-- resource_location, and Idempotency-Expires (E4) is expires_at, returned
-- here to stamp the answer and read again by every replay, so the two say
-- the same instant (keyrow.go, HTTPDate).
INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, state,
                              response_status, response_headers, response_body, resource_location,
                              completed_at, expires_at, retain_until)
VALUES (@tenant_id, @endpoint, @idem_key, @fingerprint, @fingerprint_version, 'completed',
        @response_status, @response_headers, @response_body, sqlc.narg('resource_location'),
        now(), @expires_at, @retain_until)
RETURNING expires_at;

-- name: IdemKeyLeaseHeld :exec
-- A phase's fence (S3, migration 000019): locks the key row for the rest
-- of the transaction, and fails with SQLSTATE IK002 unless the lease of
-- this generation still holds the key. Queued behind BEGIN, it travels
-- with the phase's first statement, which a lost lease stops.
SELECT idem_lease_held(@tenant_id::uuid, @endpoint::text, @idem_key::text, @generation::bigint);

-- name: IdemKeyGetForUpdate :one
-- Locks the row of a key that a multi-step claim found taken, for the rest
-- of the transaction that replays it or takes its lease over: two
-- takeovers wait for each other, and the second sees the first's new
-- generation. lease_expired is read on the database clock, which every
-- API process shares.
SELECT sqlc.embed(idempotency_keys),
       idem_lease_free(locked_until)::boolean AS lease_expired,
       idem_result_expired(state, expires_at)::boolean AS result_expired
FROM idempotency_keys
WHERE tenant_id = @tenant_id AND endpoint = @endpoint AND idem_key = @idem_key
FOR UPDATE;

-- name: IdemKeyTakeOver :one
-- Takes over an expired lease: the new generation fences off the attempt
-- that held it.
UPDATE idempotency_keys
SET lease_generation = lease_generation + 1,
    locked_until = now() + make_interval(0, 0, 0, 0, 0, 0, @lease_seconds::float8)
WHERE tenant_id = @tenant_id AND endpoint = @endpoint AND idem_key = @idem_key
  AND state = 'in_progress' AND lease_generation = @generation
RETURNING lease_generation, recovery_point, resource_id;

-- name: IdemKeyAdvance :execrows
-- Commits a recovery point, fenced by the lease generation, and renews
-- the lease for the next step.
-- Guarded like every state change: from_point is the recovery point the
-- attempt holds, so a step can only follow the one before it.
UPDATE idempotency_keys
SET recovery_point = @recovery_point,
    resource_id = coalesce(sqlc.narg('resource_id')::uuid, resource_id),
    locked_until = now() + make_interval(0, 0, 0, 0, 0, 0, @lease_seconds::float8)
WHERE tenant_id = @tenant_id AND endpoint = @endpoint AND idem_key = @idem_key
  AND state = 'in_progress' AND lease_generation = @generation AND recovery_point = @from_point;

-- name: IdemKeyCompleteLease :one
-- The record step (L3) for a multi-step key, fenced like every step, and
-- stored like IdemKeyClaimCompleted. No row: the lease was lost.
--
-- The horizons are counted from the record, never shortened: a payment
-- that finished (the completer, after an outage) later than the TTL or the
-- retention set at its claim would otherwise be pruned and forgotten the
-- moment it completes, and the client's retry would run it again (E3).
UPDATE idempotency_keys k
SET state = 'completed',
    recovery_point = 'finished',
    locked_until = NULL,
    response_status = @response_status,
    response_headers = @response_headers,
    response_body = @response_body,
    resource_location = sqlc.narg('resource_location'),
    completed_at = now(),
    expires_at = h.expires_at,
    retain_until = h.retain_until
FROM (
    SELECT greatest(expires_at, now() + make_interval(secs => @ttl_seconds::float8)) AS expires_at,
           greatest(retain_until, now() + make_interval(secs => @retention_seconds::float8)) AS retain_until
    FROM idempotency_keys
    WHERE tenant_id = @tenant_id AND endpoint = @endpoint AND idem_key = @idem_key
) h
WHERE k.tenant_id = @tenant_id AND k.endpoint = @endpoint AND k.idem_key = @idem_key
  AND k.state = 'in_progress' AND k.lease_generation = @generation AND k.recovery_point = @from_point
RETURNING k.expires_at;

-- name: IdemKeyRelease :execrows
-- Gives the key back at its recovery point after a transient failure (O2):
-- not completed, not deleted, so the retry resumes from there once
-- hold_seconds have passed (0: at once).
UPDATE idempotency_keys
SET locked_until = now() + make_interval(secs => @hold_seconds::float8)
WHERE tenant_id = @tenant_id AND endpoint = @endpoint AND idem_key = @idem_key
  AND state = 'in_progress' AND lease_generation = @generation;

-- name: IdemKeyListExpiredLeases :many
-- For the completer. SKIP LOCKED lets several completers (one per API
-- process) share the work without waiting on each other.
SELECT tenant_id, endpoint, idem_key, lease_generation
FROM idempotency_keys
WHERE state = 'in_progress' AND recovery_point IS NOT NULL AND idem_passed(locked_until)
  AND endpoint = ANY(@endpoints::text[])
ORDER BY locked_until
LIMIT @max_rows
FOR UPDATE SKIP LOCKED;

-- name: IdemKeyStatus :one
-- What became of a key (E4), for its client: never the stored body. The
-- horizons are read on the database clock, as the claim reads them. Read
-- on the primary only (on_primary(), as IdemKeyGet): a standby's "completed"
-- or "unknown" may be what a failover is about to undo or has not seen.
SELECT state, recovery_point, response_status, resource_id, resource_location,
       created_at, completed_at, expires_at, retain_until,
       idem_result_expired(state, expires_at)::boolean AS result_expired,
       idem_forgotten(state, retain_until)::boolean AS forgotten
FROM idempotency_keys
WHERE on_primary() AND tenant_id = @tenant_id AND endpoint = @endpoint AND idem_key = @idem_key;

-- name: IdemKeyCountForTenant :one
-- The tenant's key rows, for its budget (R6; internal/idem/budget.go): an
-- index-only scan of its range of the primary key. Rows past their
-- retention that the reaper has not deleted yet still count: it deletes
-- them within a pass.
SELECT count(*) FROM idempotency_keys WHERE tenant_id = @tenant_id;

-- name: IdemKeyHeld :one
-- Whether the tenant holds the key (a tenant at its budget may still use
-- the keys it holds). A key past its retention is forgotten: not held.
SELECT 1::int FROM idempotency_keys
WHERE tenant_id = @tenant_id AND endpoint = @endpoint AND idem_key = @idem_key
  AND NOT idem_forgotten(state, retain_until);
