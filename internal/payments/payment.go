package payments

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/cursor"
	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/validation"
)

// Payment statuses, as stored. A payment is inserted at charge_sent, which
// is unsettled: the charge's outcome is not known yet (see Payment.Settled).
const (
	StatusChargeSent = "charge_sent"
	StatusSucceeded  = "succeeded"
	StatusDeclined   = "declined"
	StatusFailed     = "failed"
)

// Compensation reasons: why a charge beside the payment's own was refunded.
const (
	// ReasonDuplicateCharge: a second succeeded charge under the payment's
	// derived key, beside the one the payment recorded.
	ReasonDuplicateCharge = "duplicate_charge"
	// ReasonChargeAfterFailure: a succeeded charge that landed after the
	// payment was recorded as declined or failed.
	ReasonChargeAfterFailure = "charge_after_failure"
)

// Payment is a payment as the rest of the program sees it.
type Payment struct {
	TenantID       uuid.UUID
	ID             uuid.UUID
	OrderID        uuid.UUID
	Amount         int64
	Currency       string
	PaymentMethod  string
	Status         string
	ChargeID       string
	DeclineCode    string
	RefundedAmount int64
	// Compensations are refunds of charges that should not exist, made by
	// reconciliation (S4, S6). They are not refunds of this payment.
	Compensations []Compensation
	CreatedAt     time.Time
}

// Settled reports whether the payment's outcome is known. An unsettled
// payment may still be charged (its charge call may land late), so it is
// shown as processing, never as failed.
func (p Payment) Settled() bool {
	return p.Status != StatusChargeSent
}

// Compensation is the refund of an extra charge found at the processor.
type Compensation struct {
	ChargeID string
	Amount   int64
	Reason   string
	// Status is "pending" until the processor confirmed the refund, then
	// "succeeded"; "refused" when the processor answered the refund with a
	// final error (the sweep tries again on a long backoff).
	Status            string
	ProcessorRefundID string
	CreatedAt         time.Time
}

// PayInput is a validated-for-shape payment request.
type PayInput struct {
	OrderID       uuid.UUID
	Amount        int64
	Currency      string
	PaymentMethod string
}

// Validate checks a payment request's meaning.
func Validate(in PayInput) error {
	var v validation.Errors
	if in.OrderID == uuid.Nil {
		v.Add("order_id", "is required")
	}
	v.Money(in.Amount, in.Currency)
	if !strings.HasPrefix(in.PaymentMethod, "pm_") || len(in.PaymentMethod) > 255 {
		v.Add("payment_method", "must be a payment method id such as pm_card_visa")
	}
	return v.Err()
}

// Get returns one of the tenant's payments, with its compensations.
func (s *Service) Get(ctx context.Context, tenantID, id uuid.UUID) (Payment, error) {
	q := dbsqlc.New(s.pool)
	row, err := q.PaymentGet(ctx, dbsqlc.PaymentGetParams{TenantID: tenantID, ID: id})
	if errors.Is(err, pgx.ErrNoRows) {
		return Payment{}, ErrNotFound
	}
	if err != nil {
		return Payment{}, err
	}
	return withCompensations(ctx, q, paymentFrom(row))
}

// Page is one page of a list of payments, newest first.
type Page struct {
	Payments   []Payment
	NextCursor string // empty on the last page
}

// List returns up to limit of the tenant's payments (only orderID's, unless
// it is uuid.Nil) after the cursor after ("" for the first page), with
// their compensations: two statements however long the page.
func (s *Service) List(ctx context.Context, tenantID, orderID uuid.UUID, after string, limit int) (Page, error) {
	if limit < 1 {
		return Page{}, fmt.Errorf("payments: page size %d must be positive", limit)
	}
	params := dbsqlc.PaymentListParams{TenantID: tenantID, RowLimit: db.Int32(limit + 1)}
	if orderID != uuid.Nil {
		params.OrderID = &orderID
	}
	if after != "" {
		at, id, err := cursor.Decode(after)
		if err != nil {
			return Page{}, err
		}
		params.CursorCreatedAt, params.CursorID = &at, &id
	}
	q := dbsqlc.New(s.pool)
	rows, err := q.PaymentList(ctx, params)
	if err != nil {
		return Page{}, err
	}
	var page Page
	if len(rows) > limit {
		rows = rows[:limit]
		last := rows[limit-1]
		page.NextCursor = cursor.Encode(last.CreatedAt, last.ID)
	}
	ids := make([]uuid.UUID, len(rows))
	for i, row := range rows {
		ids[i] = row.ID
	}
	comps, err := q.CompensationListForPayments(ctx, dbsqlc.CompensationListForPaymentsParams{TenantID: tenantID, PaymentIds: ids})
	if err != nil {
		return Page{}, err
	}
	byPayment := map[uuid.UUID][]dbsqlc.PaymentCompensation{}
	for _, c := range comps {
		byPayment[c.PaymentID] = append(byPayment[c.PaymentID], c)
	}
	page.Payments = make([]Payment, 0, len(rows))
	for _, row := range rows {
		page.Payments = append(page.Payments, withCompensationRows(paymentFrom(row), byPayment[row.ID]))
	}
	return page, nil
}

// withCompensations loads p's compensations, for GET.
func withCompensations(ctx context.Context, q *dbsqlc.Queries, p Payment) (Payment, error) {
	rows, err := q.CompensationListForPayment(ctx, dbsqlc.CompensationListForPaymentParams{TenantID: p.TenantID, PaymentID: p.ID})
	if err != nil {
		return Payment{}, err
	}
	return withCompensationRows(p, rows), nil
}

// withCompensationRows puts rows on p as its compensations.
func withCompensationRows(p Payment, rows []dbsqlc.PaymentCompensation) Payment {
	p.Compensations = make([]Compensation, 0, len(rows))
	for _, r := range rows {
		c := Compensation{ChargeID: r.ChargeID, Amount: r.Amount, Reason: r.Reason, Status: r.Status, CreatedAt: r.CreatedAt}
		if r.ProcessorRefundID != nil {
			c.ProcessorRefundID = *r.ProcessorRefundID
		}
		p.Compensations = append(p.Compensations, c)
	}
	return p
}

func paymentFrom(row dbsqlc.Payment) Payment {
	p := Payment{
		TenantID:       row.TenantID,
		ID:             row.ID,
		OrderID:        row.OrderID,
		Amount:         row.Amount,
		Currency:       row.Currency,
		PaymentMethod:  row.PaymentMethod,
		Status:         row.Status,
		RefundedAmount: row.RefundedAmount,
		CreatedAt:      row.CreatedAt,
	}
	if row.ChargeID != nil {
		p.ChargeID = *row.ChargeID
	}
	if row.DeclineCode != nil {
		p.DeclineCode = *row.DeclineCode
	}
	return p
}
