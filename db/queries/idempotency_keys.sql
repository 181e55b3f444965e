-- name: IdemSetLockTimeout :exec
-- Bounds how long a duplicate waits on another transaction's uncommitted
-- claim (L5). SET LOCAL cannot take a parameter; set_config(..., true) is
-- the parameterised form of the same transaction-scoped setting.
SELECT set_config('lock_timeout', @timeout::text, true);

-- name: IdemKeyClaim :one
-- The claim (L1). The primary key decides who owns the key: no
-- check-then-insert. Returns no row when the key already exists; when
-- another transaction holds an uncommitted claim on it, the insert waits
-- for that transaction (bounded by lock_timeout).
INSERT INTO idempotency_keys (tenant_id, endpoint, idem_key, fingerprint, fingerprint_version, expires_at)
VALUES (@tenant_id, @endpoint, @idem_key, @fingerprint, @fingerprint_version, @expires_at)
ON CONFLICT (tenant_id, endpoint, idem_key) DO NOTHING
RETURNING created_at;

-- name: IdemKeyGet :one
SELECT * FROM idempotency_keys
WHERE tenant_id = @tenant_id AND endpoint = @endpoint AND idem_key = @idem_key;

-- name: IdemKeyComplete :execrows
-- The record step (L3): the exact response, in the claim's transaction.
UPDATE idempotency_keys
SET state = 'completed',
    response_status = @response_status,
    response_headers = @response_headers,
    response_body = @response_body,
    completed_at = now()
WHERE tenant_id = @tenant_id AND endpoint = @endpoint AND idem_key = @idem_key
  AND state = 'in_progress';
