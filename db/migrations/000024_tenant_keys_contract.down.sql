-- Back to the keys of 000023. Each builds on the rows this schema allows in
-- practice: a message's tenant is fixed and Record looks under the nil
-- UUID first, so no id is recorded twice; derived keys hash their tenant
-- in (idem.DeriveKey), so no two tenants share one.
ALTER TABLE processed_messages
    DROP CONSTRAINT processed_messages_pkey,
    ADD CONSTRAINT processed_messages_pkey PRIMARY KEY (consumer, source, message_id);
CREATE UNIQUE INDEX refunds_refund_key_key ON refunds (refund_key);
CREATE UNIQUE INDEX payments_charge_key_key ON payments (charge_key);
