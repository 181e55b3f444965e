-- When a key was last seen, so an operator rotating keys can tell when
-- clients stopped sending the old one (docs/operations.md, "Rotating and
-- revoking API keys"). Stamped by the lookup an authentication cache miss
-- makes anyway (APIKeyAuthenticate), at most once a minute per key: never
-- a write per request. NULL: not used since this migration.
--
-- Expand only: a nullable column without a default, so the previous
-- version, which never names it, runs unchanged against this schema, and
-- adding it rewrites nothing.
ALTER TABLE api_keys ADD COLUMN last_used_at timestamptz;
