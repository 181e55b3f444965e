ALTER TABLE refunds DROP CONSTRAINT refunds_amount_ceiling;
ALTER TABLE payments DROP CONSTRAINT payments_amount_ceiling;
ALTER TABLE orders
    DROP CONSTRAINT orders_books_within_amount,
    DROP CONSTRAINT orders_amount_ceiling;
