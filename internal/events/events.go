// Package events defines the events this service publishes through the
// outbox (M2) and its consumers read: their types, subjects, schema
// version and payloads. Producer and consumers share these types, so a
// change to an event is a change to this package and its schema version.
package events

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"
)

// ErrUnreadable marks an event no redelivery can make readable (an unknown
// schema version, a payload that does not parse). An effect returns it
// (wrapped) and the consumer dead-letters the event at once instead of
// redelivering it MaxDeliver times. It lives here, with the events, so
// that an effect (internal/orders) needs nothing of the consumer.
var ErrUnreadable = errors.New("unreadable event")

// Event types.
const (
	// TypePaymentSucceeded: a payment's charge succeeded (data: Payment).
	TypePaymentSucceeded = "payment.succeeded"
	// TypePaymentFailed: a payment was declined or rejected (data: Payment).
	TypePaymentFailed = "payment.failed"
	// TypeRefundSucceeded: a refund was made (data: Refund).
	TypeRefundSucceeded = "refund.succeeded"
)

// SchemaVersion is the version of every envelope and payload below. A
// consumer rejects (dead-letters) a version it does not know instead of
// guessing; a change that old consumers cannot read bumps it.
const SchemaVersion = 1

// SubjectPrefix prefixes the broker subject of every event; the rest is
// the event type.
const SubjectPrefix = "payments.events."

// Subject is the broker subject of an event type.
func Subject(eventType string) string { return SubjectPrefix + eventType }

// Source names the producer that assigns the ids of these events (the
// outbox), as consumers record it in their inbox.
const Source = "payments.outbox"

// Envelope is what is published: the outbox row's id is the event's id and
// the broker's message id.
type Envelope struct {
	ID            uuid.UUID       `json:"id"`
	Type          string          `json:"type"`
	SchemaVersion int             `json:"schema_version"`
	OccurredAt    time.Time       `json:"occurred_at"`
	TenantID      uuid.UUID       `json:"tenant_id"`
	Data          json.RawMessage `json:"data"`
}

// Payment is the data of payment.succeeded and payment.failed.
type Payment struct {
	PaymentID uuid.UUID `json:"payment_id"`
	OrderID   uuid.UUID `json:"order_id"`
	Amount    int64     `json:"amount"`
	Currency  string    `json:"currency"`
	Status    string    `json:"status"`
	ChargeID  string    `json:"charge_id,omitempty"`
}

// Refund is the data of refund.succeeded.
type Refund struct {
	RefundID  uuid.UUID `json:"refund_id"`
	PaymentID uuid.UUID `json:"payment_id"`
	OrderID   uuid.UUID `json:"order_id"`
	Amount    int64     `json:"amount"`
	Currency  string    `json:"currency"`
}
