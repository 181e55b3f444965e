DROP FUNCTION on_primary();
