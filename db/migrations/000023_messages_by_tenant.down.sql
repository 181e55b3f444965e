ALTER TABLE processed_messages DROP COLUMN tenant_id;
ALTER TABLE outbox DROP CONSTRAINT outbox_pkey, ADD CONSTRAINT outbox_pkey PRIMARY KEY (id);
