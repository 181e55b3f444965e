DROP FUNCTION idem_forgotten(text, timestamptz);
DROP FUNCTION idem_result_expired(text, timestamptz);
DROP FUNCTION idem_lease_free(timestamptz);
DROP FUNCTION idem_passed(timestamptz);
