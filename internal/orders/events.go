package orders

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/events"
	"github.com/idemref/payments/internal/payments"
)

// ConsumerName is the orders consumer's durable name and inbox name.
const ConsumerName = "orders"

// Subjects are the events the orders consumer applies: those internal/payments
// publishes when money moved.
var Subjects = []string{events.Subject(payments.TypePaymentSucceeded), events.Subject(payments.TypeRefundSucceeded)}

// ApplyEvent is the orders consumer's effect: the order follows its
// payments and refunds. It runs in the transaction that holds the event's
// inbox row (internal/consumer), so each event changes the order once.
//
// The order is therefore eventually consistent with its payments: a
// payment's 201 is answered before the order says paid, and the order
// catches up within the relay's and the broker's delivery latency
// (milliseconds when both run; at most the outbox lag plus a redelivery's
// backoff when something failed). The payments table is the source of
// truth; the order is a projection of it.
func ApplyEvent(ctx context.Context, tx pgx.Tx, ev events.Envelope) error {
	q := dbsqlc.New(tx)
	switch ev.Type {
	case payments.TypePaymentSucceeded:
		var p payments.PaymentEvent
		if err := json.Unmarshal(ev.Data, &p); err != nil {
			return fmt.Errorf("%w: %w", events.ErrUnreadable, err)
		}
		_, err := q.OrderAddPaid(ctx, dbsqlc.OrderAddPaidParams{TenantID: ev.TenantID, ID: p.OrderID, Amount: p.Amount})
		return err
	case payments.TypeRefundSucceeded:
		var r payments.RefundEvent
		if err := json.Unmarshal(ev.Data, &r); err != nil {
			return fmt.Errorf("%w: %w", events.ErrUnreadable, err)
		}
		// A refund whose payment event has not been applied yet (two
		// relays can publish them out of order) fails the amount_paid >= 0
		// check and is redelivered after it.
		_, err := q.OrderApplyRefunded(ctx, dbsqlc.OrderApplyRefundedParams{TenantID: ev.TenantID, ID: r.OrderID, Amount: r.Amount})
		return err
	}
	// Another event type on the subscribed subjects: nothing to do, but
	// the inbox row records that it was seen.
	return nil
}
