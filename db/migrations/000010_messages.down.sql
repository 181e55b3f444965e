DROP INDEX payments_charge_key_idx;
-- Before this migration amount_paid was what was paid, refunds not deducted.
UPDATE orders SET amount_paid = amount_paid + amount_refunded,
    status = CASE WHEN status = 'pending' THEN 'pending' ELSE 'paid' END;
ALTER TABLE orders
    DROP CONSTRAINT orders_status_check,
    ADD CONSTRAINT orders_status_check CHECK (status IN ('pending', 'paid')),
    DROP COLUMN amount_refunded;
DROP TRIGGER outbox_notify ON outbox;
DROP FUNCTION outbox_notify();
DROP TABLE outbox;
DROP TABLE processed_messages;
