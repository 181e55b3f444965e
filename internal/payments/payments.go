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

	"github.com/idemref/payments/internal/cursor"
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

// Payment statuses, as stored. created and charge_sent are unsettled: the
// charge's outcome is not known yet (see Payment.Settled).
const (
	StatusCreated    = "created"
	StatusChargeSent = "charge_sent"
	StatusSucceeded  = "succeeded"
	StatusDeclined   = "declined"
	StatusFailed     = "failed"
)

// Refund statuses, as stored.
const (
	RefundStatusCreated   = "created"
	RefundStatusSent      = "refund_sent"
	RefundStatusSucceeded = "succeeded"
	RefundStatusFailed    = "failed"
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
	return p.Status != StatusCreated && p.Status != StatusChargeSent
}

// Compensation is the refund of an extra charge found at the processor.
type Compensation struct {
	ChargeID string
	Amount   int64
	Reason   string
	// Status is "pending" until the processor confirmed the refund, then
	// "succeeded".
	Status            string
	ProcessorRefundID string
	CreatedAt         time.Time
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
	// ErrRefundNotFound: no such refund of this payment for this tenant.
	ErrRefundNotFound = errors.New("refund not found")
	// ErrOrderNotFound: the order to pay does not exist for this tenant.
	ErrOrderNotFound = errors.New("the order does not exist")
	// ErrNotRefundable: only a succeeded payment can be refunded.
	ErrNotRefundable = errors.New("the payment has not succeeded, so it cannot be refunded")
	// ErrProcessorUnavailable: the processor did not execute the call (429,
	// no connection). Transient: the key is released at its recovery point
	// and the retry resumes with the same derived key (O2).
	ErrProcessorUnavailable = errors.New("the payment processor did not execute the call")
	// ErrOutcomeUnknown: the processor has not told us whether the charge or
	// refund happened (a timeout, a lost answer, a 5xx, a same-key call
	// still running), and it may still happen. Nothing is final: the key
	// is released at its recovery point, and the retry (or the completer)
	// looks the call up, waiting out the settle window before it sends
	// again (S6).
	ErrOutcomeUnknown = errors.New("the outcome of the processor call is not known yet")
)

// RetryError is a step without a final outcome: Err is
// ErrProcessorUnavailable or ErrOutcomeUnknown (wrapping the cause), and
// the key is released for RetryAfter before a retry may resume it.
type RetryError struct {
	Err        error
	RetryAfter time.Duration
}

func (e *RetryError) Error() string { return e.Err.Error() }
func (e *RetryError) Unwrap() error { return e.Err }

// RetryAfter returns how long a client should wait before retrying after
// err, 0 when err does not say.
func RetryAfter(err error) time.Duration {
	var re *RetryError
	if errors.As(err, &re) {
		return re.RetryAfter
	}
	return 0
}

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
	// Failure renders a failure, and says whether it is an outcome the key
	// records (deterministic) or one that rolls back (transient). The
	// HTTP layer owns that rule, for both paths.
	Failure(error) (res idem.Response, recorded bool)
}

// DefaultSettleWindow is Config.SettleWindow's default: comfortably above
// the longest a processor executes one call (the simulator's
// processorsim.MaxExecution is 30 s).
const DefaultSettleWindow = 2 * time.Minute

// Config tunes a Service.
type Config struct {
	// SettleWindow is how long after a processor call was sent it may
	// still land (S6). It must exceed the processor's longest execution,
	// not just our timeout: a processor keeps executing a call whose
	// caller gave up. Until it has passed since the last call with an
	// unknown outcome, and a lookup found nothing, no new call is sent and
	// nothing is recorded as final. Zero means DefaultSettleWindow.
	SettleWindow time.Duration
}

// Service runs payments and refunds.
type Service struct {
	pool   *pgxpool.Pool
	store  *idem.Store
	proc   *processor.Client
	render Renderer
	log    *slog.Logger
	cfg    Config
}

// NewService wires a Service.
func NewService(pool *pgxpool.Pool, store *idem.Store, proc *processor.Client, render Renderer, log *slog.Logger, cfg Config) *Service {
	if cfg.SettleWindow <= 0 {
		cfg.SettleWindow = DefaultSettleWindow
	}
	return &Service{pool: pool, store: store, proc: proc, render: render, log: log, cfg: cfg}
}

// sweepDelay is how long after a payment's or refund's last call the sweep
// looks again: the settle window plus a margin for clock drift between us
// and the processor.
func (s *Service) sweepDelay() time.Duration {
	return s.cfg.SettleWindow + max(s.cfg.SettleWindow/10, time.Second)
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
	params := dbsqlc.PaymentListParams{TenantID: tenantID, RowLimit: int32(limit) + 1}
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
	comps, err := q.CompensationsForPayments(ctx, dbsqlc.CompensationsForPaymentsParams{TenantID: tenantID, PaymentIds: ids})
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

// GetRefund returns one refund of one of the tenant's payments.
func (s *Service) GetRefund(ctx context.Context, tenantID, paymentID, refundID uuid.UUID) (Refund, error) {
	row, err := dbsqlc.New(s.pool).RefundGet(ctx, dbsqlc.RefundGetParams{TenantID: tenantID, ID: refundID})
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && row.PaymentID != paymentID) {
		return Refund{}, ErrRefundNotFound
	}
	if err != nil {
		return Refund{}, err
	}
	return refundFrom(row), nil
}

// withCompensations loads p's compensations, for GET.
func withCompensations(ctx context.Context, q *dbsqlc.Queries, p Payment) (Payment, error) {
	rows, err := q.CompensationsForPayment(ctx, dbsqlc.CompensationsForPaymentParams{TenantID: p.TenantID, PaymentID: p.ID})
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

func refundFrom(row dbsqlc.Refund) Refund {
	return Refund{ID: row.ID, PaymentID: row.PaymentID, Amount: row.Amount, Status: row.Status, CreatedAt: row.CreatedAt}
}
