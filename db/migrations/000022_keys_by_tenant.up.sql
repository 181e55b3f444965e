-- Ready to shard by tenant (D8), the expand: the derived processor keys
-- become unique per tenant. A hash partition or a Citus shard of payments
-- or refunds can only enforce a unique key that holds the distribution
-- column, tenant_id; every statement of this release that reads or writes
-- by charge_key or refund_key names the tenant (a processor webhook finds
-- it in the charge's metadata, or for a charge made before this release,
-- by the key: PaymentFindTenantByChargeKey).
--
-- Expand only: the global unique indexes stay for one release, because the
-- previous release's RefundCreate infers refunds_refund_key_key
-- (ON CONFLICT (refund_key)) and its webhook reads payments by charge_key
-- alone. Migration 000024 drops them, a release after this one (docs/
-- forking.md, "Upgrades without downtime"). Keys are globally unique in
-- fact (idem.DeriveKey hashes the tenant in), so both indexes build on
-- any database.
CREATE UNIQUE INDEX payments_tenant_charge_key_key ON payments (tenant_id, charge_key);
CREATE UNIQUE INDEX refunds_tenant_refund_key_key ON refunds (tenant_id, refund_key);
