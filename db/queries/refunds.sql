-- name: RefundCreate :one
-- One refund per derived refund key of the tenant
-- (refunds_tenant_refund_key_key): no row back means this request made its
-- refund already, under a key the server has since forgotten
-- (RefundGetByRefundKey names it).
INSERT INTO refunds (tenant_id, id, payment_id, amount, refund_key)
VALUES (@tenant_id, @id, @payment_id, @amount, @refund_key)
ON CONFLICT (tenant_id, refund_key) DO NOTHING
RETURNING *;

-- name: RefundGetByRefundKey :one
SELECT * FROM refunds WHERE tenant_id = @tenant_id AND refund_key = @refund_key;

-- name: RefundGet :one
SELECT * FROM refunds WHERE tenant_id = @tenant_id AND id = @id;

-- name: RefundGetUnsettled :one
-- As PaymentGetUnsettled, for the refund call.
SELECT sqlc.embed(refunds),
       coalesce(extract(epoch FROM refund_sent_at + make_interval(secs => @settle_seconds::float8) - now()), 0)::float8 AS unsettled_seconds
FROM refunds WHERE tenant_id = @tenant_id AND id = @id;

-- name: RefundSumLive :one
-- Refunds that have not failed count against the payment's amount, whether
-- the processor has confirmed them yet or not.
SELECT coalesce(sum(amount), 0)::bigint FROM refunds
WHERE tenant_id = @tenant_id AND payment_id = @payment_id AND status <> 'failed';

-- name: RefundMarkSent :one
-- As PaymentMarkChargeSent: committed before every refund call, and
-- guarded the same way: no row back means the refund is settled.
UPDATE refunds
SET status = 'refund_sent', refund_sent_at = now(), refund_calls = refund_calls + 1, updated_at = now()
WHERE tenant_id = @tenant_id AND id = @id AND status IN ('created', 'refund_sent')
RETURNING *;

-- name: RefundUnmarkSent :exec
UPDATE refunds
SET refund_sent_at = sqlc.narg('previous_sent_at'), refund_calls = refund_calls - 1, updated_at = now()
WHERE tenant_id = @tenant_id AND id = @id AND status = 'refund_sent';

-- name: RefundFinish :one
-- As PaymentFinish: a refund sent more than once gets a sweep, at once
-- when a double refund was found already. Guarded: a refund settles once.
UPDATE refunds
SET status = @status,
    processor_refund_id = coalesce(sqlc.narg('processor_refund_id'), processor_refund_id),
    failure_message = coalesce(sqlc.narg('failure_message'), failure_message),
    sweep_at = CASE WHEN @sweep_now::boolean THEN now()
                    WHEN refund_calls > 1
                    THEN refund_sent_at + make_interval(secs => @sweep_delay_seconds::float8) END,
    updated_at = now()
WHERE tenant_id = @tenant_id AND id = @id AND status = 'refund_sent'
RETURNING *;

-- name: RefundClaimSweep :many
-- As PaymentClaimSweep. The payment's charge id comes along: the sweep
-- lists the refunds of that charge.
UPDATE refunds r
SET sweep_at = now() + make_interval(secs => @hold_seconds::float8)
FROM (
    SELECT rr.tenant_id, rr.id, p.charge_id FROM refunds rr
    JOIN payments p ON p.tenant_id = rr.tenant_id AND p.id = rr.payment_id
    WHERE rr.sweep_at <= now()
    ORDER BY rr.sweep_at
    LIMIT @max_rows
    FOR UPDATE OF rr SKIP LOCKED
) due
WHERE r.tenant_id = due.tenant_id AND r.id = due.id
RETURNING r.*, due.charge_id::text AS charge_id;

-- name: RefundSweepDone :exec
-- Ends a sweep's look: again in retry_seconds when it could not finish, at
-- the end of the settle window when it looked early (a double charge or
-- refund found while calls could still land), else never. Only the sweeper
-- that claimed the row (same sweep_at) writes.
UPDATE refunds SET sweep_at = CASE
        WHEN @retry_seconds::float8 > 0 THEN now() + make_interval(secs => @retry_seconds::float8)
        WHEN refund_sent_at + make_interval(secs => @sweep_delay_seconds::float8) > now()
            THEN refund_sent_at + make_interval(secs => @sweep_delay_seconds::float8)
    END
WHERE tenant_id = @tenant_id AND id = @id AND sweep_at = @claimed_until;

-- name: RefundFlagDuplicate :exec
-- The sweep found money refunded more than once under this refund's key.
UPDATE refunds SET duplicate_amount = @duplicate_amount, updated_at = now()
WHERE tenant_id = @tenant_id AND id = @id;
