// Package outbox owns the transactional outbox (M2): Write adds an event
// in the transaction of the business change it announces, and the Relay
// publishes committed rows to NATS JetStream with the row's id as the
// message id (Nats-Msg-Id), then marks them published.
//
// Delivery is at least once. A relay that dies after the broker
// acknowledged a publish and before it marked the row publishes the row
// again once its claim expires: JetStream drops the second copy when it
// arrives within the stream's duplicates window, and a consumer's inbox
// drops it when it arrives later.
package outbox

import (
	"context"
	"encoding/json"
	"time"

	"github.com/google/uuid"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/events"
	"github.com/idemref/payments/internal/tracing"
)

// Write adds an event of eventType with data to the outbox in tx, the
// transaction that makes the change the event announces (a pgx.Tx, or the
// idem.UndoableTx an idempotent request's work gets): the event exists
// exactly when the change committed. It returns the event's id.
func Write(ctx context.Context, tx dbsqlc.DBTX, tenantID uuid.UUID, eventType string, data any) (uuid.UUID, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.Nil, err
	}
	raw, err := json.Marshal(data)
	if err != nil {
		return uuid.Nil, err
	}
	payload, err := json.Marshal(events.Envelope{
		ID: id, Type: eventType, SchemaVersion: events.SchemaVersion,
		OccurredAt: time.Now().UTC(), TenantID: tenantID, Data: raw,
	})
	if err != nil {
		return uuid.Nil, err
	}
	// Nothing waits on the insert's result: it travels to the server with
	// the transaction's next statement (db.Deferred), and a failure of it
	// aborts the transaction there, before anything commits (P2).
	params := dbsqlc.OutboxInsertParams{
		ID: id, TenantID: tenantID, Subject: events.Subject(eventType), EventType: eventType,
		SchemaVersion: events.SchemaVersion, Payload: payload,
	}
	// The row carries the trace of the request that wrote it past the
	// commit: the relay publishes it in the message's headers, and the
	// consumer's work continues the same trace (X3).
	if tp := tracing.Traceparent(ctx); tp != "" {
		params.TraceParent = &tp
	}
	return id, dbsqlc.New(db.Deferred(tx)).OutboxInsert(ctx, params)
}

// Requeue hands back to the relay the published events of subjects that
// consumer has not applied, for the relay to publish again: after the
// broker lost the events stream with what it held. subjects are the
// consumer's filter subjects, literal ones (no wildcards). Requeuing is
// safe at any time and any number of times: a republished event the
// consumer already applied is dropped by the stream's duplicates window or
// by its inbox. It returns how many rows it requeued.
func Requeue(ctx context.Context, tx dbsqlc.DBTX, consumer string, subjects []string) (int64, error) {
	return dbsqlc.New(tx).OutboxRequeueUnapplied(ctx, dbsqlc.OutboxRequeueUnappliedParams{
		Subjects: subjects, Consumer: consumer, Source: events.Source,
	})
}
