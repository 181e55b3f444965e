DROP FUNCTION idem_lease_held(uuid, text, text, bigint);
DROP FUNCTION idem_key_absent(uuid, text, text);
