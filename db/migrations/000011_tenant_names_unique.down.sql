ALTER TABLE tenants DROP CONSTRAINT tenants_name_key;
