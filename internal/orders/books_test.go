package orders_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemref/payments/internal/events"
	"github.com/idemref/payments/internal/orders"
	"github.com/idemref/payments/internal/payments"
)

// R7: an order's books cannot say more than it owes. A payment counted
// twice (two payment.succeeded events for one payment, the double credit
// that guarded transitions prevent upstream) is refused by the database,
// so the consumer's transaction fails loudly instead of crediting the
// order 3000 on 1500.
func TestAnOrderIsNeverCreditedPastItsAmount(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := validInput()
	in.Amount = 1500
	o, err := orders.Create(t.Context(), b.tx, b.tenantID, in)
	if err != nil {
		t.Fatal(err)
	}
	paid := func() error {
		data, err := json.Marshal(payments.PaymentEvent{PaymentID: uuid.New(), OrderID: o.ID, Amount: 1500, Currency: "EUR", Status: "succeeded"})
		if err != nil {
			t.Fatal(err)
		}
		sp, err := b.tx.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		err = orders.ApplyEvent(t.Context(), sp, events.Envelope{ID: uuid.New(), Type: payments.TypePaymentSucceeded, SchemaVersion: 1, TenantID: b.tenantID, Data: data})
		if err != nil {
			_ = sp.Rollback(t.Context())
			return err
		}
		return sp.Commit(t.Context())
	}
	if err := paid(); err != nil {
		t.Fatalf("the first payment.succeeded: %v", err)
	}
	err = paid()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.ConstraintName != "orders_books_within_amount" {
		t.Fatalf("a second payment.succeeded of the whole amount = %v; want the orders_books_within_amount check to refuse it", err)
	}
	got, err := orders.Get(t.Context(), b.tx, b.tenantID, o.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.AmountPaid != 1500 {
		t.Errorf("amount_paid = %d, want 1500", got.AmountPaid)
	}
}
