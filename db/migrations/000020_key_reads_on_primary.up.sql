-- A key's record is read on the primary only (D1, D6). Every transaction
-- the service runs begins READ WRITE, which a server in recovery refuses;
-- but a key's lookup runs ahead of its transaction's BEGIN (P7), and a
-- key found there ends the round trip before BEGIN runs, so a standby
-- would answer the replay. A standby that was a cut-off leader (behind
-- PgBouncer, a demoted primary keeps its clients' connections) holds
-- commits no client was told of, which pg_rewind removes: replaying one
-- would tell the client its write exists while the new primary has never
-- seen it. The key-status endpoint's read has the same hole.
--
-- on_primary() is true on a primary and fails on a server in recovery
-- with the SQLSTATE PostgreSQL itself answers a write there with (25006,
-- read_only_sql_transaction), which the service already treats as "not
-- the primary": transient, 503 with Retry-After, the connection closed so
-- that the pool's next one finds the primary. Key reads put it first in
-- their WHERE clause: having no column and being STABLE, it is planned as
-- a one-time filter, evaluated once before the scan, whether the key has
-- a row or not. No round trip more, one function call.
-- Expand only: the previous release never calls it (docs/forking.md,
-- "Upgrades without downtime").
CREATE FUNCTION on_primary() RETURNS boolean
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'this server is in recovery: idempotency keys are read on the primary only'
            USING ERRCODE = '25006';
    END IF;
    RETURN true;
END
$$;
