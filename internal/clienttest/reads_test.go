package clienttest

import (
	"errors"
	"net/http"
	"testing"

	"github.com/google/uuid"

	"github.com/idemref/payments/client"
	"github.com/idemref/payments/client/api"
)

// The payment reads: a list of an order's payments before and after it is
// paid, a refund read back by its ids, and a refund that does not exist,
// which is final, not retried.
func TestPaymentReads(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client(t, client.Policy{})
	o, err := c.CreateOrder(t.Context(), "", orderRequest("inv-reads"))
	if err != nil {
		t.Fatal(err)
	}
	id := o.Value.Id
	page, err := c.ListPayments(t.Context(), api.ListPaymentsParams{OrderId: &id})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Value.Data) != 0 || page.Value.NextCursor != nil {
		t.Errorf("payments of a new order = %+v, want an empty last page", page.Value)
	}
	pay, err := c.CreatePayment(t.Context(), "", api.CreatePaymentRequest{OrderId: id, Amount: 2500, Currency: "EUR", PaymentMethod: "pm_card_visa"})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := c.CreateRefund(t.Context(), "", pay.Value.Id, api.CreateRefundRequest{Amount: 500})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.GetRefund(t.Context(), pay.Value.Id, ref.Value.Id)
	if err != nil || got.Value.Id != ref.Value.Id || got.Value.Amount != 500 {
		t.Errorf("GetRefund = %+v, %v; want refund %s of 500", got.Value, err, ref.Value.Id)
	}
	page, err = c.ListPayments(t.Context(), api.ListPaymentsParams{OrderId: &id})
	if err != nil || len(page.Value.Data) != 1 || page.Value.Data[0].Id != pay.Value.Id {
		t.Errorf("payments of the paid order = %+v, %v; want only %s", page.Value, err, pay.Value.Id)
	}
	if n := e.count(t, "SELECT count(*) FROM refunds WHERE tenant_id = $1", e.tenantID); n != 1 {
		t.Errorf("refunds = %d, want 1", n)
	}
	_, err = c.GetRefund(t.Context(), uuid.New(), uuid.New())
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound || apiErr.Attempts != 1 {
		t.Errorf("GetRefund of nothing = %v, want one attempt answered 404", err)
	}
}
