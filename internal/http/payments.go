package httpapi

import (
	"context"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/payments"
	"github.com/idemref/payments/internal/validation"
)

// createPaymentRequest is the body of POST /v1/payments.
type createPaymentRequest struct {
	OrderID       bodyID `json:"order_id"`
	Amount        int64  `json:"amount"`
	Currency      string `json:"currency"`
	PaymentMethod string `json:"payment_method"`
}

func (*createPaymentRequest) applyDefaults() {}

// createRefundRequest is the body of POST /v1/payments/{id}/refunds.
type createRefundRequest struct {
	Amount int64 `json:"amount"`
}

func (*createRefundRequest) applyDefaults() {}

type paymentJSON struct {
	ID             uuid.UUID `json:"id"`
	OrderID        uuid.UUID `json:"order_id"`
	Amount         int64     `json:"amount"`
	Currency       string    `json:"currency"`
	PaymentMethod  string    `json:"payment_method"`
	Status         string    `json:"status"`
	ChargeID       *string   `json:"charge_id"`
	DeclineCode    *string   `json:"decline_code"`
	RefundedAmount int64     `json:"refunded_amount"`
	// Compensations are refunds of extra charges reconciliation found
	// (a late duplicate); never null.
	Compensations []compensationJSON `json:"compensations"`
	CreatedAt     string             `json:"created_at"`
}

type compensationJSON struct {
	ChargeID string  `json:"charge_id"`
	Amount   int64   `json:"amount"`
	Reason   string  `json:"reason"`
	Status   string  `json:"status"`
	RefundID *string `json:"refund_id"`
}

// statusProcessing is what a payment whose charge outcome is not known yet
// shows: never failed, since the charge may still land (S6).
const statusProcessing = "processing"

func toPaymentJSON(p payments.Payment) paymentJSON {
	status := p.Status
	if !p.Settled() {
		status = statusProcessing
	}
	out := paymentJSON{
		ID:             p.ID,
		OrderID:        p.OrderID,
		Amount:         p.Amount,
		Currency:       p.Currency,
		PaymentMethod:  p.PaymentMethod,
		Status:         status,
		ChargeID:       optional(p.ChargeID),
		DeclineCode:    optional(p.DeclineCode),
		RefundedAmount: p.RefundedAmount,
		Compensations:  []compensationJSON{},
		CreatedAt:      p.CreatedAt.UTC().Format(time.RFC3339Nano),
	}
	for _, c := range p.Compensations {
		out.Compensations = append(out.Compensations, compensationJSON{
			ChargeID: c.ChargeID, Amount: c.Amount, Reason: c.Reason, Status: c.Status, RefundID: optional(c.ProcessorRefundID),
		})
	}
	return out
}

type refundJSON struct {
	ID        uuid.UUID `json:"id"`
	PaymentID uuid.UUID `json:"payment_id"`
	Amount    int64     `json:"amount"`
	Status    string    `json:"status"`
	CreatedAt string    `json:"created_at"`
}

func toRefundJSON(r payments.Refund) refundJSON {
	return refundJSON{
		ID: r.ID, PaymentID: r.PaymentID, Amount: r.Amount, Status: r.Status,
		CreatedAt: r.CreatedAt.UTC().Format(time.RFC3339Nano),
	}
}

func refundPath(r payments.Refund) string {
	return "/v1/payments/" + r.PaymentID.String() + "/refunds/" + r.ID.String()
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Renderer renders payment outcomes exactly as this layer answers them. The
// payments package records its output under idempotency keys, from a
// request or from the completer, so both record the same bytes.
type Renderer struct{}

var _ payments.Renderer = Renderer{}

// Payment renders a finished payment: 201 with its Location.
func (Renderer) Payment(p payments.Payment) idem.Response {
	res, err := encodeJSON(http.StatusCreated, toPaymentJSON(p), "/v1/payments/"+p.ID.String())
	if err != nil {
		panic(err) // our own types always encode
	}
	return res
}

// Refund renders a finished refund: 201 with its Location.
func (Renderer) Refund(r payments.Refund) idem.Response {
	res, err := encodeJSON(http.StatusCreated, toRefundJSON(r), refundPath(r))
	if err != nil {
		panic(err)
	}
	return res
}

// Failure renders err as its problem, and says whether it is an outcome to
// record (Problem.recorded: the same rule as the one-transaction path).
func (Renderer) Failure(err error) (idem.Response, bool) {
	p := problemFor(err).keyed() // payments and refunds are keyed
	return p.encode(), p.recorded()
}

func (a *api) createPayment(ctx context.Context, c idem.Claim, req *createPaymentRequest) (idem.Response, bool, error) {
	return a.payments.Pay(ctx, c, payments.PayInput{
		OrderID: uuid.UUID(req.OrderID), Amount: req.Amount, Currency: req.Currency, PaymentMethod: req.PaymentMethod,
	})
}

func (a *api) createRefund(w http.ResponseWriter, r *http.Request) {
	paymentID, ok := pathID(r, "id")
	if !ok {
		writeKeyedError(w, r, payments.ErrNotFound)
		return
	}
	multiStep[createRefundRequest](a, payments.CreateRefund, func(ctx context.Context, c idem.Claim, req *createRefundRequest) (idem.Response, bool, error) {
		return a.payments.Refund(ctx, c, paymentID, req.Amount)
	})(w, r)
}

func (a *api) getPayment(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(r, "id")
	if !ok {
		writeError(w, r, payments.ErrNotFound)
		return
	}
	p, err := a.payments.Get(r.Context(), tenantFrom(r.Context()), id)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toPaymentJSON(p))
}

type paymentListJSON struct {
	Data       []paymentJSON `json:"data"`
	NextCursor *string       `json:"next_cursor"`
}

// listPayments answers GET /v1/payments: the tenant's payments newest
// first, optionally only those of ?order_id=, paginated like orders.
func (a *api) listPayments(w http.ResponseWriter, r *http.Request) {
	limit, err := pageSize(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	var orderID uuid.UUID
	if s := r.URL.Query().Get("order_id"); s != "" {
		var ok bool
		if orderID, ok = validation.ParseID(s); !ok {
			writeError(w, r, errInvalidOrderFilter)
			return
		}
	}
	page, err := a.payments.List(r.Context(), tenantFrom(r.Context()), orderID, r.URL.Query().Get("cursor"), limit)
	if err != nil {
		writeError(w, r, err)
		return
	}
	out := paymentListJSON{Data: make([]paymentJSON, 0, len(page.Payments))}
	for _, p := range page.Payments {
		out.Data = append(out.Data, toPaymentJSON(p))
	}
	if page.NextCursor != "" {
		out.NextCursor = &page.NextCursor
	}
	writeJSON(w, http.StatusOK, out)
}

// getRefund answers GET /v1/payments/{id}/refunds/{refund_id}.
func (a *api) getRefund(w http.ResponseWriter, r *http.Request) {
	paymentID, ok := pathID(r, "id")
	if !ok {
		writeError(w, r, payments.ErrRefundNotFound)
		return
	}
	refundID, ok := pathID(r, "refund_id")
	if !ok {
		writeError(w, r, payments.ErrRefundNotFound)
		return
	}
	ref, err := a.payments.GetRefund(r.Context(), tenantFrom(r.Context()), paymentID, refundID)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toRefundJSON(ref))
}
