-- How far the inbox has been pruned (M3), so that a dead letter's redrive
-- can tell what the inbox still vouches for (docs/messages.md, "Redriving
-- dead letters").
--
-- An id missing from processed_messages means "not applied" only if it was
-- never pruned: the reaper deletes ids past MESSAGE_RETENTION, and an event
-- applied and pruned looks exactly like one never applied. pruned_through is
-- the newest processed_at of any id the reaper has deleted (NULL: none yet).
-- A trigger moves it forward in the statement that deletes the ids, so no
-- snapshot ever sees an id gone and the horizon not past it, whoever
-- deletes: this version's reaper, the previous version's during a rolling
-- upgrade (its prune knows nothing of the horizon), or an operator. Every id processed after pruned_through is still
-- there; for an event that can only have been applied after that, a missing
-- id means it was not.
--
-- One row, for every consumer: the reaper prunes every consumer's ids by the
-- same rule, and a redriven event reaches every consumer of its subject.
CREATE TABLE processed_messages_horizon (
    singleton      boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    pruned_through timestamptz
);

-- A database already in use may have had ids pruned before this table
-- existed, up to an unknown time: say up to now, so that nothing older is
-- vouched for. A new database (no tenant, no inbox id) has pruned nothing.
INSERT INTO processed_messages_horizon (pruned_through)
SELECT CASE WHEN EXISTS (SELECT 1 FROM tenants) OR EXISTS (SELECT 1 FROM processed_messages) THEN now() END;

-- Every delete from the inbox moves the horizon past the newest id it
-- deleted (GREATEST skips NULL; it never moves back). Statement-level, so a
-- batch of ids costs one update; deleters running at once queue on the
-- horizon row for the rest of their transaction, which is short.
CREATE FUNCTION processed_messages_move_horizon() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE processed_messages_horizon
    SET pruned_through = GREATEST(pruned_through, (SELECT max(processed_at) FROM deleted))
    WHERE EXISTS (SELECT 1 FROM deleted);
    RETURN NULL;
END;
$$;

CREATE TRIGGER processed_messages_move_horizon
AFTER DELETE ON processed_messages
REFERENCING OLD TABLE AS deleted
FOR EACH STATEMENT EXECUTE FUNCTION processed_messages_move_horizon();
