-- name: OutboxInsert :exec
-- Written in the business change's own transaction (M2): the event exists
-- if and only if the change committed.
INSERT INTO outbox (id, tenant_id, subject, event_type, schema_version, payload, trace_parent)
VALUES (@id, @tenant_id, @subject, @event_type, @schema_version, @payload, sqlc.narg(trace_parent));

-- name: OutboxClaim :many
-- A relay's claim: unpublished rows in seq order, skipping rows another
-- relay holds (SKIP LOCKED) or has claimed, pushed out by hold_seconds.
--
-- The snapshot guard: xid < pg_snapshot_xmin(pg_current_snapshot()) keeps
-- only rows whose writing transaction is older than every transaction still
-- running. Without it, a transaction that took its seq first but commits
-- last would be overtaken: rows of later transactions would be published
-- ahead of it, and a reader that follows the outbox by position would step
-- over it for good. With it the relay waits for the oldest transaction in
-- flight, and publishes in transaction order.
UPDATE outbox o
SET claimed_until = now() + make_interval(secs => @hold_seconds::float8),
    publish_attempts = o.publish_attempts + 1
FROM (
    SELECT tenant_id, id FROM outbox
    WHERE published_at IS NULL
      AND (claimed_until IS NULL OR claimed_until <= now())
      AND xid < pg_snapshot_xmin(pg_current_snapshot())
    ORDER BY seq
    LIMIT @max_rows
    FOR UPDATE SKIP LOCKED
) c
-- The join names the whole primary key, (tenant_id, id): by id alone no
-- index serves it, and every claim would read the whole outbox, published
-- rows included, which are kept for MESSAGE_RETENTION.
WHERE o.tenant_id = c.tenant_id AND o.id = c.id
RETURNING o.id, o.seq, o.subject, o.event_type, o.payload, o.created_at, o.claimed_until, o.trace_parent;

-- name: OutboxMarkPublished :execrows
-- After the broker acknowledged each publish. By id, within the unpublished
-- rows: their partial index (outbox_unpublished_idx) bounds the search to
-- the rows still to publish, however many published rows are kept.
UPDATE outbox SET published_at = now(), claimed_until = NULL
WHERE id = ANY(@ids::uuid[]) AND published_at IS NULL;

-- name: OutboxRelease :exec
-- A publish failed, or the relay is stopping: the rows it did not publish
-- may be claimed again at once, not only once the claim runs out. Guarded:
-- only rows still unpublished and still under this relay's own claim
-- (claimed_until is the claim's fencing token: a later claim, by another
-- relay once this one lapsed, has a later one). Releasing another relay's
-- claim would let a third claim its rows while it still publishes them.
UPDATE outbox SET claimed_until = NULL
WHERE id = ANY(@ids::uuid[]) AND published_at IS NULL AND claimed_until = @claimed_until;

-- name: OutboxLag :one
-- Unpublished rows and the age of the oldest, for the relay's lag metric.
SELECT count(*)::bigint AS unpublished,
       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest_seconds
FROM outbox WHERE published_at IS NULL;

-- name: OutboxDeletePublished :execrows
-- The reaper: published rows older than the retention, in bounded batches,
-- each found by its whole primary key (as in OutboxClaim: by id alone,
-- every batch would read the whole outbox).
DELETE FROM outbox o
WHERE (o.tenant_id, o.id) IN (
    SELECT tenant_id, id FROM outbox
    WHERE published_at IS NOT NULL
      AND published_at < now() - make_interval(secs => @retention_seconds::float8)
    ORDER BY published_at
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
);

-- name: OutboxRequeueUnapplied :execrows
-- The broker lost the events stream (restarted on empty storage, D7), and
-- with it every message it held, acknowledged or not. Published rows of
-- the consumer's subjects that its inbox has not recorded go back to the
-- relay, to be published again on the new stream. Only rows written after
-- the inbox's horizon: their event, if applied, was applied after it was
-- written (processed_at > created_at > pruned_through), so its inbox row
-- is still there and drops the republish. A republish of a row another
-- process requeued and published meanwhile is dropped the same way.
UPDATE outbox o SET published_at = NULL
WHERE o.published_at IS NOT NULL
  AND o.subject = ANY(@subjects::text[])
  AND o.created_at > (SELECT coalesce(h.pruned_through, '-infinity') FROM processed_messages_horizon h)
  AND NOT EXISTS (
      SELECT 1 FROM processed_messages m
      WHERE m.tenant_id IN (o.tenant_id, '00000000-0000-0000-0000-000000000000')
        AND m.consumer = @consumer AND m.source = @source AND m.message_id = o.id::text
  );
