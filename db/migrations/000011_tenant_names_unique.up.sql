-- Tenant names are unique: an operator finds a tenant by its name. Earlier
-- duplicates (development databases gathered one "demo" per run) keep the
-- oldest name and get a numbered suffix, so the constraint can be added.
UPDATE tenants t
SET name = t.name || ' (' || d.n || ')'
FROM (SELECT id, row_number() OVER (PARTITION BY name ORDER BY created_at, id) AS n FROM tenants) d
WHERE d.id = t.id AND d.n > 1;

ALTER TABLE tenants ADD CONSTRAINT tenants_name_key UNIQUE (name);
