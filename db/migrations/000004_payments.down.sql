DROP TABLE refunds;
DROP TABLE payments;
DROP INDEX idempotency_keys_expired_lease_idx;
ALTER TABLE idempotency_keys
    DROP COLUMN resource_id,
    DROP COLUMN lease_generation,
    DROP COLUMN locked_until,
    DROP COLUMN recovery_point;
