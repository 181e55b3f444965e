-- name: OrderCreate :one
INSERT INTO orders (tenant_id, id, reference, customer_id, amount, currency, description, metadata)
VALUES (@tenant_id, @id, @reference, @customer_id, @amount, @currency, @description, @metadata)
ON CONFLICT ON CONSTRAINT orders_tenant_reference_key DO NOTHING
RETURNING *;

-- name: OrderGet :one
SELECT * FROM orders WHERE tenant_id = @tenant_id AND id = @id;

-- name: OrderGetByReference :one
SELECT * FROM orders WHERE tenant_id = @tenant_id AND reference = @reference;

-- name: OrderList :many
-- Keyset pagination, newest first. The cursor is the (created_at, id) of
-- the last row of the previous page.
SELECT * FROM orders
WHERE tenant_id = @tenant_id
  AND (sqlc.narg('cursor_created_at')::timestamptz IS NULL
       OR (created_at, id) < (sqlc.narg('cursor_created_at')::timestamptz, sqlc.narg('cursor_id')::uuid))
ORDER BY created_at DESC, id DESC
LIMIT @row_limit;

-- name: OrderGetForUpdate :one
-- Serialises payments of one order: the amount owed is read and changed
-- under this lock.
SELECT * FROM orders WHERE tenant_id = @tenant_id AND id = @id FOR UPDATE;

-- name: OrderAddPaid :one
-- The orders consumer applies a payment.succeeded event.
UPDATE orders
SET amount_paid = amount_paid + @amount,
    status = CASE WHEN amount_paid + @amount >= amount THEN 'paid' ELSE status END
WHERE tenant_id = @tenant_id AND id = @id
RETURNING *;

-- name: OrderUpdateDetails :one
-- The conditional update (If-Match) runs under OrderGetForUpdate's lock, so
-- the representation the precondition was checked against is the one
-- replaced.
UPDATE orders
SET description = @description,
    metadata = @metadata
WHERE tenant_id = @tenant_id AND id = @id
RETURNING *;

-- name: OrderApplyRefunded :one
-- The orders consumer applies a refund.succeeded event. A refund that
-- overtook its payment's event would take amount_paid below zero: the
-- check constraint fails it, and the broker redelivers it later.
UPDATE orders
SET amount_paid = amount_paid - @amount,
    amount_refunded = amount_refunded + @amount,
    status = CASE WHEN amount_paid - @amount <= 0 THEN 'refunded' ELSE 'partially_refunded' END
WHERE tenant_id = @tenant_id AND id = @id
RETURNING *;
