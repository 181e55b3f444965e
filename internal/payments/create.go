package payments

import (
	"context"
	"errors"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/tracing"
	"github.com/idemref/payments/internal/validation"
)

// createPayment is transaction 1's business write: checks against the order
// and the payment row, committed with the claim.
func createPayment(ctx context.Context, tx pgx.Tx, c idem.Claim, in PayInput) (dbsqlc.Payment, error) {
	if err := Validate(in); err != nil {
		return dbsqlc.Payment{}, err
	}
	q := dbsqlc.New(tx)
	// Locking the order serialises payments of one order, so the amount
	// owed and the existing payment are read consistently.
	order, err := q.OrderGetForUpdate(ctx, dbsqlc.OrderGetForUpdateParams{TenantID: c.TenantID, ID: in.OrderID})
	if errors.Is(err, pgx.ErrNoRows) {
		return dbsqlc.Payment{}, ErrOrderNotFound
	}
	if err != nil {
		return dbsqlc.Payment{}, err
	}
	// The live payment is looked for with a plain read before the insert,
	// although the insert's unique index would find it too: the index
	// check waits for a transaction that is updating the live payment
	// (its outcome being recorded, which then updates this order), while
	// this one holds the order's lock that the other needs: a deadlock.
	// The read waits for nothing (TestPayConcurrentDuplicates).
	if live, err := q.PaymentGetLiveForOrder(ctx, dbsqlc.PaymentGetLiveForOrderParams{TenantID: c.TenantID, OrderID: in.OrderID}); err == nil {
		return dbsqlc.Payment{}, &PaymentExistsError{PaymentID: live.ID}
	} else if !errors.Is(err, pgx.ErrNoRows) {
		return dbsqlc.Payment{}, err
	}
	// The order is owed its full amount: a payment that paid any of it is
	// live, and was refused just above. amount_paid is not read here: it
	// is a projection the orders consumer updates from events, so it may
	// lag behind the payments table, which is the source of truth.
	if owed := order.Amount; in.Amount != owed || in.Currency != order.Currency {
		return dbsqlc.Payment{}, &AmountMismatchError{Owed: owed, Currency: order.Currency}
	}
	id, err := uuid.NewV7()
	if err != nil {
		return dbsqlc.Payment{}, err
	}
	p, err := q.PaymentCreate(ctx, dbsqlc.PaymentCreateParams{
		TenantID:      c.TenantID,
		ID:            id,
		OrderID:       in.OrderID,
		Amount:        in.Amount,
		Currency:      in.Currency,
		PaymentMethod: in.PaymentMethod,
		ChargeKey:     idem.DeriveKey(c, stepCharge),
		// The trace that started the payment, for the completer's and the
		// sweep's later work on it to link back to (X3).
		TraceParent: traceParent(ctx),
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return dbsqlc.Payment{}, existingPayment(ctx, q, c, in.OrderID)
	}
	return p, err
}

// existingPayment names the payment that made PaymentCreate insert
// nothing. Either this request made a payment already, under a key the
// server has since forgotten (past its retention, the key may be claimed
// again, but its derived charge key is the same and may name one payment
// only: a second would be a second execution); or the partial unique index
// on live payments fired, which the order lock makes unreachable today and
// the index keeps true if that changes.
func existingPayment(ctx context.Context, q *dbsqlc.Queries, c idem.Claim, orderID uuid.UUID) error {
	mine, err := q.PaymentGetByChargeKey(ctx, dbsqlc.PaymentGetByChargeKeyParams{TenantID: c.TenantID, ChargeKey: idem.DeriveKey(c, stepCharge)})
	if err == nil {
		return &PaymentExistsError{PaymentID: mine.ID}
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	live, err := q.PaymentGetLiveForOrder(ctx, dbsqlc.PaymentGetLiveForOrderParams{TenantID: c.TenantID, OrderID: orderID})
	if err != nil {
		return err
	}
	return &PaymentExistsError{PaymentID: live.ID}
}

// createRefund is the refund's first transaction: checks against the
// payment and the refunds so far, under the payment's row lock.
func createRefund(ctx context.Context, tx pgx.Tx, c idem.Claim, paymentID uuid.UUID, amount int64) (dbsqlc.Refund, error) {
	var v validation.Errors
	if v.Amount("amount", amount); len(v) > 0 {
		return dbsqlc.Refund{}, v.Err()
	}
	q := dbsqlc.New(tx)
	p, err := q.PaymentGetForUpdate(ctx, dbsqlc.PaymentGetForUpdateParams{TenantID: c.TenantID, ID: paymentID})
	if errors.Is(err, pgx.ErrNoRows) {
		return dbsqlc.Refund{}, ErrNotFound
	}
	if err != nil {
		return dbsqlc.Refund{}, err
	}
	if p.Status != StatusSucceeded {
		return dbsqlc.Refund{}, ErrNotRefundable
	}
	// Refunds in flight count too: the total never exceeds the payment.
	committed, err := q.RefundSumLive(ctx, dbsqlc.RefundSumLiveParams{TenantID: c.TenantID, PaymentID: paymentID})
	if err != nil {
		return dbsqlc.Refund{}, err
	}
	if committed+amount > p.Amount {
		return dbsqlc.Refund{}, &RefundExceedsError{Refundable: p.Amount - committed}
	}
	id, err := uuid.NewV7()
	if err != nil {
		return dbsqlc.Refund{}, err
	}
	key := idem.DeriveKey(c, stepRefund)
	r, err := q.RefundCreate(ctx, dbsqlc.RefundCreateParams{
		TenantID:  c.TenantID,
		ID:        id,
		PaymentID: paymentID,
		Amount:    amount,
		RefundKey: key,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		// The same request made a refund already, under a key past its
		// retention: never a second refund under one derived key.
		mine, err := q.RefundGetByRefundKey(ctx, dbsqlc.RefundGetByRefundKeyParams{TenantID: c.TenantID, RefundKey: key})
		if err != nil {
			return dbsqlc.Refund{}, err
		}
		return dbsqlc.Refund{}, &RefundExistsError{RefundID: mine.ID}
	}
	return r, err
}

// traceParent is the traceparent of the span in ctx, or nil when the
// request is not traced.
func traceParent(ctx context.Context) *string {
	if tp := tracing.Traceparent(ctx); tp != "" {
		return &tp
	}
	return nil
}
