-- name: RefundCreate :one
INSERT INTO refunds (tenant_id, id, payment_id, amount, refund_key)
VALUES (@tenant_id, @id, @payment_id, @amount, @refund_key)
RETURNING *;

-- name: RefundGet :one
SELECT * FROM refunds WHERE tenant_id = @tenant_id AND id = @id;

-- name: RefundSumLive :one
-- Refunds that have not failed count against the payment's amount, whether
-- the processor has confirmed them yet or not.
SELECT coalesce(sum(amount), 0)::bigint FROM refunds
WHERE tenant_id = @tenant_id AND payment_id = @payment_id AND status <> 'failed';

-- name: RefundSetStatus :one
UPDATE refunds
SET status = @status,
    processor_refund_id = coalesce(sqlc.narg('processor_refund_id'), processor_refund_id),
    failure_message = coalesce(sqlc.narg('failure_message'), failure_message),
    updated_at = now()
WHERE tenant_id = @tenant_id AND id = @id
RETURNING *;
