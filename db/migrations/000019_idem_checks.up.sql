-- Two checks that fail rather than answer, so that a request's statement
-- can travel in the same round trip behind them: when one fails,
-- PostgreSQL skips everything behind it in that round trip and nothing of
-- the request runs (P2, P7). Plain SQL cannot raise an error, hence
-- functions. Their SQLSTATEs are this project's own (class IK is not
-- PostgreSQL's): the code matches them, not the messages, which name no
-- key, since errors reach logs and the statements' trace spans (X3).
-- Expand only: the previous release never calls them (docs/forking.md,
-- "Upgrades without downtime").

-- Fails (IK001) when the key has a row, whatever its state. The
-- one-transaction path (internal/idem, Store.Execute) sends it right after
-- IdemKeyGet, both ahead of its transaction's BEGIN and in the round trip
-- of the request's first statement (db.Ahead): when the key has a row, the
-- server skips BEGIN and the request's statement and rolls back at the end
-- of the round trip. A replay thus costs one round trip and runs nothing
-- of the request, and a new key's create costs two.
CREATE FUNCTION idem_key_absent(key_tenant uuid, key_endpoint text, key_name text) RETURNS void
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM idempotency_keys
               WHERE tenant_id = key_tenant AND endpoint = key_endpoint AND idem_key = key_name) THEN
        RAISE EXCEPTION 'the idempotency key has a row' USING ERRCODE = 'IK001';
    END IF;
END
$$;

-- Locks the key row for the rest of a multi-step phase's transaction and
-- fails (IK002) unless the lease of the given generation still holds it
-- (S3): a takeover (which updates this row) waits for the phase to commit,
-- or the phase sees the takeover's new generation and fails. Under READ
-- COMMITTED a row updated by a transaction this one waited for is checked
-- again in its new version before it is locked. A phase (Store.Phase)
-- queues it behind BEGIN, so it travels with the phase's first statement
-- and a lost lease stops that statement from running.
CREATE FUNCTION idem_lease_held(key_tenant uuid, key_endpoint text, key_name text, generation bigint) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM 1 FROM idempotency_keys
    WHERE tenant_id = key_tenant AND endpoint = key_endpoint AND idem_key = key_name
      AND state = 'in_progress' AND lease_generation = generation
    FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the lease on the idempotency key is lost' USING ERRCODE = 'IK002';
    END IF;
END
$$;
