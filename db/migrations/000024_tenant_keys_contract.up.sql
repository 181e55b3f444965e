-- Ready to shard by tenant (D8), the contract: every primary and unique
-- key of a tenant's data now holds tenant_id (repocheck
-- TestTenantDataKeysIncludeTheTenant reads db/schema.sql for it).
--
-- A contract step, a release after 000022 and 000023 (docs/forking.md,
-- "Contract migrations"): apply it only once the release carrying them
-- runs everywhere. That release names neither global key: its refunds
-- infer refunds_tenant_refund_key_key, its webhooks read payments by
-- tenant and charge key, and its inbox rows carry their tenant and look
-- under the nil UUID for ids recorded without one. A release older than
-- 000022 must not run beside this schema: its RefundCreate infers
-- refunds_refund_key_key (ON CONFLICT (refund_key)), so every refund it
-- makes fails, and its inbox rows (the nil UUID by default) would not
-- conflict with a newer release's row for the same message.
DROP INDEX payments_charge_key_key;
DROP INDEX refunds_refund_key_key;

-- The inbox's key becomes its tenant's. The nil UUID stays the default:
-- an id recorded without a tenant is still found by every lookup.
ALTER TABLE processed_messages
    DROP CONSTRAINT processed_messages_pkey,
    ADD CONSTRAINT processed_messages_pkey PRIMARY KEY (tenant_id, consumer, source, message_id);
