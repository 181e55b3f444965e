-- The trace a row belongs to (X3), as its W3C traceparent
-- ("00-<trace id>-<span id>-<flags>"): an outbox row carries the trace of
-- the request that wrote it across the commit, so the relay publishes it
-- in the message's headers and the consumer continues the same trace; a
-- payment keeps the trace that started it, so the completer's and the
-- sweep's later work on it links back. NULL when the request was not
-- traced. Nullable, with no default: expand only, so the previous release
-- writes rows as before (docs/forking.md, "Upgrades without downtime").
ALTER TABLE outbox ADD COLUMN trace_parent text;
ALTER TABLE payments ADD COLUMN trace_parent text;
