package payments

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/processor"
	"github.com/idemref/payments/internal/validation"
)

// Endpoints whose keys this package runs. The completer resumes keys of
// exactly these.
const (
	EndpointPay    = "POST /v1/payments"
	EndpointRefund = "POST /v1/payments/{id}/refunds"
)

// Recovery points (S1), between idem.RecoveryStarted and idem.RecoveryFinished.
const (
	// pointPaymentCreated: transaction 1 committed the payment row.
	pointPaymentCreated = "payment_created"
	// pointChargeSent: the charge call may have reached the processor. A
	// resumed attempt reconciles before charging again.
	pointChargeSent = "charge_sent"
	// pointRefundCreated: the refund row is committed.
	pointRefundCreated = "refund_created"
	// pointRefundSent: the refund call may have reached the processor.
	pointRefundSent = "refund_sent"
)

// Derived-key step names (S2).
const (
	stepCharge = "charge"
	stepRefund = "refund"
)

// Payment statuses.
const (
	StatusCreated    = "created"
	StatusChargeSent = "charge_sent"
	StatusSucceeded  = "succeeded"
	StatusDeclined   = "declined"
	StatusFailed     = "failed"
)

// Payment is a payment as the rest of the program sees it.
type Payment struct {
	ID             uuid.UUID
	OrderID        uuid.UUID
	Amount         int64
	Currency       string
	PaymentMethod  string
	Status         string
	ChargeID       string
	DeclineCode    string
	RefundedAmount int64
	CreatedAt      time.Time
}

// Refund is a refund of part or all of a payment.
type Refund struct {
	ID        uuid.UUID
	PaymentID uuid.UUID
	Amount    int64
	Status    string
	CreatedAt time.Time
}

// PayInput is a validated-for-shape payment request.
type PayInput struct {
	OrderID       uuid.UUID
	Amount        int64
	Currency      string
	PaymentMethod string
}

// Deterministic failures. Each is recorded under the request's key and
// replayed (O1).
var (
	// ErrNotFound: no such payment for this tenant.
	ErrNotFound = errors.New("payment not found")
	// ErrOrderNotFound: the order to pay does not exist for this tenant.
	ErrOrderNotFound = errors.New("the order does not exist")
	// ErrNotRefundable: only a succeeded payment can be refunded.
	ErrNotRefundable = errors.New("the payment has not succeeded, so it cannot be refunded")
	// ErrProcessorUnavailable: the processor timed out, failed or lost its
	// answer. Transient: the key is released at its recovery point and the
	// retry resumes with the same derived key (O2).
	ErrProcessorUnavailable = errors.New("the payment processor is unavailable")
)

// AmountMismatchError: the payment does not pay exactly what the order
// still owes.
type AmountMismatchError struct {
	Owed     int64
	Currency string
}

func (e *AmountMismatchError) Error() string {
	return fmt.Sprintf("the order owes %d %s; the payment must match", e.Owed, e.Currency)
}

// PaymentExistsError is the backstop (N1): the order already has a payment
// that has not failed.
type PaymentExistsError struct{ PaymentID uuid.UUID }

func (e *PaymentExistsError) Error() string {
	return fmt.Sprintf("the order already has a payment: %s", e.PaymentID)
}

// DeclinedError: the processor declined the card. Final for this request;
// a new request (new key) may try another card.
type DeclinedError struct {
	PaymentID   uuid.UUID
	DeclineCode string
}

func (e *DeclinedError) Error() string { return "the card was declined: " + e.DeclineCode }

// ProcessorRejectedError: the processor refused the request itself (not a
// decline), e.g. an unknown payment method.
type ProcessorRejectedError struct{ Code, Message string }

func (e *ProcessorRejectedError) Error() string {
	return "the processor rejected the request: " + e.Message
}

// RefundExceedsError: the refund would take the refunded total above the
// payment's amount.
type RefundExceedsError struct{ Refundable int64 }

func (e *RefundExceedsError) Error() string {
	return fmt.Sprintf("at most %d can still be refunded", e.Refundable)
}

// Renderer turns outcomes into the exact responses recorded under keys.
// The HTTP layer implements it, so errors become HTTP in one place, and the
// completer records byte for byte what the request itself would have.
type Renderer interface {
	Payment(Payment) idem.Response
	Refund(Refund) idem.Response
	Failure(error) idem.Response
}

// Service runs payments and refunds.
type Service struct {
	pool   *pgxpool.Pool
	store  *idem.Store
	proc   *processor.Client
	render Renderer
	log    *slog.Logger
}

// NewService wires a Service.
func NewService(pool *pgxpool.Pool, store *idem.Store, proc *processor.Client, render Renderer, log *slog.Logger) *Service {
	return &Service{pool: pool, store: store, proc: proc, render: render, log: log}
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

// Get returns one of the tenant's payments.
func (s *Service) Get(ctx context.Context, tenantID, id uuid.UUID) (Payment, error) {
	row, err := dbsqlc.New(s.pool).PaymentGet(ctx, dbsqlc.PaymentGetParams{TenantID: tenantID, ID: id})
	if errors.Is(err, pgx.ErrNoRows) {
		return Payment{}, ErrNotFound
	}
	if err != nil {
		return Payment{}, err
	}
	return paymentFrom(row), nil
}

func paymentFrom(row dbsqlc.Payment) Payment {
	p := Payment{
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

func refundFrom(row dbsqlc.Refund) Refund {
	return Refund{ID: row.ID, PaymentID: row.PaymentID, Amount: row.Amount, Status: row.Status, CreatedAt: row.CreatedAt}
}
