-- name: ProcessedMessageInsert :execrows
-- The inbox row (M1), inserted in the transaction that applies the
-- message's effect. 0 rows: this consumer already applied the message.
INSERT INTO processed_messages (consumer, source, message_id)
VALUES (@consumer, @source, @message_id)
ON CONFLICT DO NOTHING;

-- name: ProcessedMessagesPrune :execrows
-- The reaper (M3): ids older than the retention, which exceeds every
-- redelivery horizon, in bounded batches.
DELETE FROM processed_messages m
WHERE (m.consumer, m.source, m.message_id) IN (
    SELECT consumer, source, message_id FROM processed_messages
    WHERE processed_at < now() - make_interval(secs => @retention_seconds::float8)
    ORDER BY processed_at
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
);
