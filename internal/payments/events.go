package payments

import "github.com/google/uuid"

// The events this package publishes through the outbox (M2), written in the
// transaction that makes the change (recordCharge, chargeSucceeded,
// recordRefund). Each travels in the envelope of internal/events, on the
// subject events.Subject(type); the orders projection reads them
// (internal/orders/events.go). A change old consumers cannot read bumps
// events.SchemaVersion.
const (
	// TypePaymentSucceeded: a payment's charge succeeded (data: PaymentEvent).
	TypePaymentSucceeded = "payment.succeeded"
	// TypePaymentFailed: a payment was declined or rejected (data: PaymentEvent).
	TypePaymentFailed = "payment.failed"
	// TypeRefundSucceeded: a refund was made (data: RefundEvent).
	TypeRefundSucceeded = "refund.succeeded"
)

// PaymentEvent is the data of payment.succeeded and payment.failed.
type PaymentEvent struct {
	PaymentID uuid.UUID `json:"payment_id"`
	OrderID   uuid.UUID `json:"order_id"`
	Amount    int64     `json:"amount"`
	Currency  string    `json:"currency"`
	Status    string    `json:"status"`
	ChargeID  string    `json:"charge_id,omitempty"`
}

// RefundEvent is the data of refund.succeeded.
type RefundEvent struct {
	RefundID  uuid.UUID `json:"refund_id"`
	PaymentID uuid.UUID `json:"payment_id"`
	OrderID   uuid.UUID `json:"order_id"`
	Amount    int64     `json:"amount"`
	Currency  string    `json:"currency"`
}
