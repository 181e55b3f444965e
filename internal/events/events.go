// Package events defines what every event this service publishes through
// the outbox (M2) travels in, and what its consumers read first: the
// envelope, the broker subjects, the schema version and the source that
// assigns event ids. The event types and their payloads belong to the
// domain that publishes them (in the example, internal/payments/events.go),
// so a fork replaces them with its domain and keeps this package; a change
// to an event is a change to its payload there and, when old consumers
// cannot read it, to SchemaVersion here.
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

// SchemaVersion is the version of every envelope and of the payload the
// domain puts in it (Data). A consumer rejects (dead-letters) a version it
// does not know instead of guessing; a change that old consumers cannot
// read bumps it.
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
