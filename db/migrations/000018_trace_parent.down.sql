ALTER TABLE payments DROP COLUMN trace_parent;
ALTER TABLE outbox DROP COLUMN trace_parent;
