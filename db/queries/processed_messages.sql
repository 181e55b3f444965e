-- name: ProcessedMessageInsert :execrows
-- The inbox row (M1), inserted in the transaction that applies the
-- message's effect. 0 rows: this consumer already applied the message.
INSERT INTO processed_messages (consumer, source, message_id)
VALUES (@consumer, @source, @message_id)
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
        WHERE m.consumer = @consumer AND m.source = @source AND m.message_id = @message_id
    ) AS applied,
    h.pruned_through
FROM processed_messages_horizon h;

-- name: ProcessedMessagePrune :execrows
-- The reaper (M3): ids older than the retention, which exceeds every
-- redelivery horizon, in bounded batches. The trigger of migration 000015
-- moves the inbox's horizon past the newest id deleted, in this statement.
DELETE FROM processed_messages m
WHERE (m.consumer, m.source, m.message_id) IN (
    SELECT consumer, source, message_id FROM processed_messages
    WHERE processed_at < now() - make_interval(secs => @retention_seconds::float8)
    ORDER BY processed_at
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
);
