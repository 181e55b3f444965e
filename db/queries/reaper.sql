-- The reaper (E1, E3) walks the two horizons in bounded batches. Each batch
-- claims its rows with FOR UPDATE SKIP LOCKED in a subquery on the primary
-- key: rows a request (or another reaper) holds are skipped, not waited
-- for, so the reaper never queues behind live traffic and several reapers
-- split the work. Under READ COMMITTED the row lock re-checks the WHERE
-- clause on the newest row version, so a key claimed over or completed
-- meanwhile is skipped if it no longer qualifies.
--
-- The claimed keys go through ARRAY(...) and unnest: the planner then
-- expects a handful of rows and finds each by the primary key (a nested
-- loop), where a plain IN (subquery) estimated at the full batch size is
-- planned as a hash join over a sequential scan of the whole table.
--
-- Neither statement touches an in_progress key or a key whose lease is
-- live (not idem_lease_free): a multi-step payment keeps its recovery
-- point until it finishes, whatever its horizons say. The horizons' rules
-- are the functions of migration 000014; inlined, each comparison still
-- bounds the scan of its index.

-- name: TxSetStatementTimeout :exec
-- Bounds every statement of the current transaction only (is_local).
SELECT set_config('statement_timeout', @timeout::text, true);

-- name: IdemKeyPruneBatch :execrows
-- Completed keys past expires_at become tombstones: the response bytes go
-- (E2), the outcome stays. Oldest first, along idempotency_keys_expires_at_idx.
UPDATE idempotency_keys k
SET state = 'expired', response_headers = NULL, response_body = NULL
WHERE (k.tenant_id, k.endpoint, k.idem_key) IN (
    SELECT x.tenant_id, x.endpoint, x.idem_key
    FROM unnest(ARRAY(
        SELECT ROW(b.tenant_id, b.endpoint, b.idem_key)
        FROM idempotency_keys b
        WHERE b.state = 'completed' AND idem_passed(b.expires_at)
          AND idem_lease_free(b.locked_until)
        ORDER BY b.expires_at
        LIMIT @batch_size
        FOR UPDATE SKIP LOCKED
    )) AS x (tenant_id uuid, endpoint text, idem_key text)
);

-- name: IdemKeyDeleteBatch :execrows
-- Finished keys past retain_until are forgotten: tombstones, and completed
-- rows past both horizons the prune has not reached yet. Oldest first, along
-- idempotency_keys_retain_until_idx.
DELETE FROM idempotency_keys k
WHERE (k.tenant_id, k.endpoint, k.idem_key) IN (
    SELECT x.tenant_id, x.endpoint, x.idem_key
    FROM unnest(ARRAY(
        SELECT ROW(b.tenant_id, b.endpoint, b.idem_key)
        FROM idempotency_keys b
        WHERE idem_forgotten(b.state, b.retain_until)
          AND idem_lease_free(b.locked_until)
        ORDER BY b.retain_until
        LIMIT @batch_size
        FOR UPDATE SKIP LOCKED
    )) AS x (tenant_id uuid, endpoint text, idem_key text)
);
