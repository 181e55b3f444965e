-- GET /v1/payments lists a tenant's payments newest first, by keyset
-- (created_at, id), as orders are listed.
CREATE INDEX payments_tenant_created_idx ON payments (tenant_id, created_at DESC, id DESC);
