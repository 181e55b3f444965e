-- name: PaymentCreate :one
-- The natural-key backstop (N1): at most one live payment per order.
INSERT INTO payments (tenant_id, id, order_id, amount, currency, payment_method, charge_key)
VALUES (@tenant_id, @id, @order_id, @amount, @currency, @payment_method, @charge_key)
ON CONFLICT (tenant_id, order_id) WHERE status NOT IN ('declined', 'failed') DO NOTHING
RETURNING *;

-- name: PaymentGet :one
SELECT * FROM payments WHERE tenant_id = @tenant_id AND id = @id;

-- name: PaymentGetForUpdate :one
SELECT * FROM payments WHERE tenant_id = @tenant_id AND id = @id FOR UPDATE;

-- name: PaymentGetLiveForOrder :one
SELECT * FROM payments
WHERE tenant_id = @tenant_id AND order_id = @order_id AND status NOT IN ('declined', 'failed');

-- name: PaymentSetStatus :one
UPDATE payments
SET status = @status,
    charge_id = coalesce(sqlc.narg('charge_id'), charge_id),
    decline_code = coalesce(sqlc.narg('decline_code'), decline_code),
    failure_message = coalesce(sqlc.narg('failure_message'), failure_message),
    updated_at = now()
WHERE tenant_id = @tenant_id AND id = @id
RETURNING *;

-- name: PaymentAddRefunded :exec
UPDATE payments SET refunded_amount = refunded_amount + @amount, updated_at = now()
WHERE tenant_id = @tenant_id AND id = @id;
