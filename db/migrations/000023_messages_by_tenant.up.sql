-- Ready to shard by tenant (D8), the expand for the messaging tables. An
-- event's outbox row and a message's inbox row commit in the transaction
-- that changes the tenant's rows (M1, M2): on a database sharded by tenant
-- they must live on that tenant's shard for the transaction to stay
-- single-shard, so both are keyed by the tenant.
--
-- The outbox already names the tenant of each event: its primary key
-- becomes (tenant_id, id). Event ids are random UUIDs, unique in fact; no
-- statement infers this key (the relay reads by seq and writes by id), so
-- the previous release runs unchanged. The outbox is small (published rows
-- are reaped), so the key is rebuilt in place.
ALTER TABLE outbox DROP CONSTRAINT outbox_pkey, ADD CONSTRAINT outbox_pkey PRIMARY KEY (tenant_id, id);

-- The inbox records the tenant of each message it deduplicates: an
-- event's (its envelope's tenant_id), a processor webhook's (the tenant
-- of the charge it names). The nil UUID means "no tenant known": every id
-- recorded before this migration, an id a previous release records (it
-- never names the column), and a webhook about a charge that is not ours.
-- Every lookup by id also looks under the nil UUID, so an id recorded
-- before the tenant was known still drops its redelivery. A constant
-- default rewrites nothing.
--
-- The primary key stays (consumer, source, message_id) for this release:
-- it still holds the dedupe while a previous release, which records under
-- the nil UUID, runs beside this one. Migration 000024 makes it
-- (tenant_id, consumer, source, message_id) a release later.
ALTER TABLE processed_messages
    ADD COLUMN tenant_id uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000';
