-- name: ProcessedMessageInsert :execrows
-- The inbox row (M1), inserted in the transaction that applies the
-- message's effect, under the message's tenant (D8: on the tenant's shard,
-- with the effect). 0 rows: this consumer already applied the message,
-- recorded under its tenant, or under the nil UUID (no tenant known:
-- before migration 000023, or by a release that did not name it). A
-- message's tenant is fixed (an event's envelope, a charge's metadata or
-- its payment), so a redelivery always looks where its first delivery
-- wrote.
INSERT INTO processed_messages (tenant_id, consumer, source, message_id)
SELECT @tenant_id::uuid, @consumer::text, @source::text, @message_id::text
WHERE NOT EXISTS (
    SELECT 1 FROM processed_messages
    WHERE tenant_id = '00000000-0000-0000-0000-000000000000'
      AND consumer = @consumer AND source = @source AND message_id = @message_id
)
ON CONFLICT DO NOTHING;

-- name: ProcessedMessageLookup :one
-- What the inbox can say about one message, in one snapshot: whether the
-- consumer applied it, and how far ids have been pruned (NULL: never). Read
-- together, an id a concurrent prune deletes is either still seen, or gone
-- with the horizon already past it. No horizon row is an error: the caller
-- must not take "nothing pruned" for granted.
SELECT
    EXISTS (
        SELECT 1 FROM processed_messages m
        WHERE m.tenant_id IN (@tenant_id::uuid, '00000000-0000-0000-0000-000000000000')
          AND m.consumer = @consumer AND m.source = @source AND m.message_id = @message_id
    ) AS applied,
    h.pruned_through
FROM processed_messages_horizon h;

-- name: ProcessedMessagePrune :execrows
-- The reaper (M3): ids older than the retention, which exceeds every
-- redelivery horizon, in bounded batches. The trigger of migration 000015
-- moves the inbox's horizon past the newest id deleted, in this statement.
DELETE FROM processed_messages m
WHERE (m.tenant_id, m.consumer, m.source, m.message_id) IN (
    SELECT tenant_id, consumer, source, message_id FROM processed_messages
    WHERE processed_at < now() - make_interval(secs => @retention_seconds::float8)
    ORDER BY processed_at
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
);
