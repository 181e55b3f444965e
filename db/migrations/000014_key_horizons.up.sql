-- The rules of a key's horizons, each written once and used by every query
-- that applies it (db/queries/idempotency_keys.sql, reaper.sql, the key
-- gauges in internal/idem/metrics.go).
--
-- They are SQL functions of a single expression, so the planner inlines
-- them: idem_passed(expires_at) is planned as expires_at <= now() and still
-- bounds a scan of the horizon's index (TestPlansUseTheIndexes in
-- internal/reaper and internal/idem check this). They read now(), so they
-- are STABLE: one answer within a statement, not a constant.

-- Every horizon of a key (expires_at, retain_until, locked_until) is the
-- first instant at which it no longer holds: a response is replayed, a key
-- remembered and a lease held strictly before it. At that instant it has
-- passed. Whoever holds a lease knows it only until locked_until, so a
-- lease that ends now is expired: the completer may resume it and a retry
-- may take it over, in the same instant the reaper stops protecting it, and
-- a release with hold 0 frees the key at once.
CREATE FUNCTION idem_passed(horizon timestamptz) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT horizon <= now() $$;

-- No attempt holds the key: it has no lease (a one-transaction key, or a
-- multi-step key that finished), or its lease has passed.
CREATE FUNCTION idem_lease_free(locked_until timestamptz) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT locked_until IS NULL OR idem_passed(locked_until) $$;

-- The response is no longer replayed (E3), whether the reaper has pruned it
-- to a tombstone yet or not.
CREATE FUNCTION idem_result_expired(state text, expires_at timestamptz) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT state = 'expired' OR (state = 'completed' AND idem_passed(expires_at)) $$;

-- The key is forgotten (E3): finished and past its retention, it is unknown
-- and may be claimed again. An unfinished key is never forgotten.
CREATE FUNCTION idem_forgotten(state text, retain_until timestamptz) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT state <> 'in_progress' AND idem_passed(retain_until) $$;
