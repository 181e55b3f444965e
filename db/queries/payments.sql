-- name: PaymentCreate :one
-- The payment is born marked (charge_sent, its first call counted), in
-- the claim's transaction: the charge call follows the commit, and from
-- the commit on a crash cannot hide it (PaymentMarkChargeSent's rule, one
-- transaction earlier). Two backstops, either of which returns no row: at
-- most one live payment per order (N1), and at most one payment per
-- derived charge key (one execution of one request, whatever happened to
-- its idempotency key).
INSERT INTO payments (tenant_id, id, order_id, amount, currency, payment_method, charge_key,
                      status, charge_sent_at, charge_calls, trace_parent)
VALUES (@tenant_id, @id, @order_id, @amount, @currency, @payment_method, @charge_key,
        'charge_sent', now(), 1, sqlc.narg(trace_parent))
ON CONFLICT DO NOTHING
RETURNING *;

-- name: PaymentGetByChargeKey :one
SELECT * FROM payments WHERE tenant_id = @tenant_id AND charge_key = @charge_key;

-- name: PaymentGet :one
SELECT * FROM payments WHERE tenant_id = @tenant_id AND id = @id;

-- name: PaymentGetUnsettled :one
-- The payment, and for how many more seconds its latest charge call may
-- still land at the processor (S6): zero or less means it cannot any more.
-- Measured on the database's clock, the one charge_sent_at was written
-- with, so API processes with skewed clocks agree.
SELECT sqlc.embed(payments),
       coalesce(extract(epoch FROM charge_sent_at + make_interval(secs => @settle_seconds::float8) - now()), 0)::float8 AS unsettled_seconds
FROM payments WHERE tenant_id = @tenant_id AND id = @id;

-- name: PaymentGetForUpdate :one
SELECT * FROM payments WHERE tenant_id = @tenant_id AND id = @id FOR UPDATE;

-- name: PaymentGetLiveForOrder :one
SELECT * FROM payments
WHERE tenant_id = @tenant_id AND order_id = @order_id AND status NOT IN ('declined', 'failed');

-- name: PaymentMarkChargeSent :one
-- Committed before every charge call after the first (PaymentCreate marks
-- the first): from here a call may be in flight, and a crash cannot hide
-- it from the attempt that resumes. Guarded: only an unsettled payment is
-- marked. No row back: a webhook settled it meanwhile, and nothing may be
-- sent (a mark would move it backwards).
UPDATE payments
SET charge_sent_at = now(), charge_calls = charge_calls + 1, updated_at = now()
WHERE tenant_id = @tenant_id AND id = @id AND status = 'charge_sent'
RETURNING *;

-- name: PaymentUnmarkChargeSent :execrows
-- The processor said the call did not execute (429, connection refused):
-- it cannot land, so the settle window goes back to the call before it.
-- Guarded: a payment settled meanwhile keeps its count of calls, which
-- decides whether the sweep looks again.
UPDATE payments
SET charge_sent_at = sqlc.narg('previous_sent_at'), charge_calls = charge_calls - 1, updated_at = now()
WHERE tenant_id = @tenant_id AND id = @id AND status = 'charge_sent';

-- name: PaymentFinish :one
-- Records the final outcome. A payment whose charge was sent more than once
-- may still see a late charge land beside the recorded one: the sweep
-- looks again once the last call can no longer land. sweep_now: a double
-- charge was found already, so the sweep refunds it at once. Guarded: only
-- a payment whose charge was sent settles, once; no row back means it was
-- settled already.
UPDATE payments
SET status = @status,
    charge_id = coalesce(sqlc.narg('charge_id'), charge_id),
    decline_code = coalesce(sqlc.narg('decline_code'), decline_code),
    failure_message = coalesce(sqlc.narg('failure_message'), failure_message),
    sweep_at = CASE WHEN @sweep_now::boolean THEN now()
                    WHEN charge_calls > 1 THEN charge_sent_at + make_interval(secs => @sweep_delay_seconds::float8) END,
    updated_at = now()
WHERE tenant_id = @tenant_id AND id = @id AND status = 'charge_sent'
RETURNING *;

-- name: PaymentAddRefunded :exec
UPDATE payments SET refunded_amount = refunded_amount + @amount, updated_at = now()
WHERE tenant_id = @tenant_id AND id = @id;

-- name: PaymentClaimSweep :many
-- The reconciliation sweep's claim: due payments, pushed out by hold_seconds
-- so that no other sweeper takes them meanwhile (SKIP LOCKED: several
-- processes share the work) and a sweeper that crashes leaves them due again.
UPDATE payments p
SET sweep_at = now() + make_interval(secs => @hold_seconds::float8)
FROM (
    SELECT tenant_id, id FROM payments
    WHERE sweep_at <= now()
    ORDER BY sweep_at
    LIMIT @max_rows
    FOR UPDATE SKIP LOCKED
) due
WHERE p.tenant_id = due.tenant_id AND p.id = due.id
RETURNING p.*;

-- name: PaymentSweepDone :exec
-- Ends a sweep's look: again in retry_seconds when it could not finish, at
-- the end of the settle window when it looked early (a double charge or
-- refund found while calls could still land), else never. Only the sweeper
-- that claimed the row (same sweep_at) writes.
UPDATE payments SET sweep_at = CASE
        WHEN @retry_seconds::float8 > 0 THEN now() + make_interval(secs => @retry_seconds::float8)
        WHEN charge_sent_at + make_interval(secs => @sweep_delay_seconds::float8) > now()
            THEN charge_sent_at + make_interval(secs => @sweep_delay_seconds::float8)
    END
WHERE tenant_id = @tenant_id AND id = @id AND sweep_at = @claimed_until;

-- name: CompensationCreate :exec
-- One row per extra charge (the primary key), so a compensation found
-- twice is recorded once.
INSERT INTO payment_compensations (tenant_id, payment_id, charge_id, amount, reason, refund_key)
VALUES (@tenant_id, @payment_id, @charge_id, @amount, @reason, @refund_key)
ON CONFLICT DO NOTHING;

-- name: CompensationMarkSucceeded :execrows
-- Guarded: a pending or refused compensation succeeds; one that succeeded
-- already matches no row (a second sweep found it refunded).
UPDATE payment_compensations
SET status = 'succeeded', processor_refund_id = coalesce(sqlc.narg('processor_refund_id'), processor_refund_id),
    failure_message = NULL, updated_at = now()
WHERE tenant_id = @tenant_id AND payment_id = @payment_id AND charge_id = @charge_id
  AND status IN ('pending', 'refused');

-- name: CompensationMarkRefused :execrows
-- The processor refused the compensating refund with a final error. The
-- sweep tries again on a long backoff; a person is alerted meanwhile.
UPDATE payment_compensations
SET status = 'refused', failure_message = @failure_message, updated_at = now()
WHERE tenant_id = @tenant_id AND payment_id = @payment_id AND charge_id = @charge_id
  AND status IN ('pending', 'refused');

-- name: CompensationListForPayment :many
SELECT * FROM payment_compensations
WHERE tenant_id = @tenant_id AND payment_id = @payment_id
ORDER BY created_at, charge_id;

-- name: PaymentList :many
-- Keyset pagination, newest first, as OrderList; optionally one order's.
SELECT * FROM payments
WHERE tenant_id = @tenant_id
  AND (sqlc.narg('order_id')::uuid IS NULL OR order_id = sqlc.narg('order_id')::uuid)
  AND (sqlc.narg('cursor_created_at')::timestamptz IS NULL
       OR (created_at, id) < (sqlc.narg('cursor_created_at')::timestamptz, sqlc.narg('cursor_id')::uuid))
ORDER BY created_at DESC, id DESC
LIMIT @row_limit;

-- name: CompensationListForPayments :many
-- The compensations of a page of payments, in one statement.
SELECT * FROM payment_compensations
WHERE tenant_id = @tenant_id AND payment_id = ANY(@payment_ids::uuid[])
ORDER BY payment_id, created_at, charge_id;

-- name: PaymentGetByChargeKeyForUpdate :one
-- A processor webhook names the charge's idempotency key, unique among
-- the tenant's payments (payments_tenant_charge_key_key), and the tenant
-- (the charge's metadata, or PaymentFindTenantByChargeKey). The row lock
-- serialises the webhook with the attempt's own record of the charge and
-- with the sweep: whoever commits first settles the payment.
SELECT * FROM payments WHERE tenant_id = @tenant_id AND charge_key = @charge_key FOR UPDATE;

-- name: PaymentFindTenantByChargeKey :one
-- The tenant of a charge made before its metadata named one (migration
-- 000022): the webhook of such a charge names the key alone. One probe of
-- payments_tenant_charge_key_key per tenant, so no index on charge_key
-- alone is needed, and on a sharded database each probe is single-shard.
-- Only webhooks without the tenant in their metadata pay it.
SELECT t.id FROM tenants t
WHERE EXISTS (SELECT 1 FROM payments p WHERE p.tenant_id = t.id AND p.charge_key = @charge_key)
LIMIT 1;

-- name: PaymentSweepNow :execrows
-- A charge the payment does not know about was reported, or found by a
-- lookup beside the one a webhook settled the payment with, or may exist
-- unseen: the sweep looks at once and compensates it, exactly as for a late
-- duplicate it finds. Guarded: only a settled payment is swept. The sweep
-- keeps the recorded charge and refunds every other, so at charge_sent, with
-- none recorded yet, it would refund the charge the payment is about to
-- keep. No row back: the payment is not settled, which its callers (holding
-- its row lock, having read it settled) treat as a bug and roll back.
UPDATE payments SET sweep_at = now()
WHERE tenant_id = @tenant_id AND id = @id AND status IN ('succeeded', 'declined', 'failed');
