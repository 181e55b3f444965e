package clienttest

import (
	"net/http"
	"testing"

	"github.com/google/uuid"

	"github.com/idemref/payments/client"
	"github.com/idemref/payments/client/api"
)

// The alternatives through the same faults: a PUT at a client-chosen id
// needs no key to survive a cut after commit; a conditional PATCH survives
// it too, but its retry reports 412, and only reading the order tells the
// caller that its change went through.
func TestAlternativesThroughACutAfterCommit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client(t, client.Policy{})

	t.Run("PutCustomer", func(t *testing.T) {
		id := uuid.New()
		e.faults.play(cutAfterCommit)
		res, err := c.PutCustomer(t.Context(), id, api.PutCustomerRequest{Name: "Ada", Email: "ada@example.com"})
		if err != nil {
			t.Fatal(err)
		}
		// The retry found the row its first attempt made: 200, not 201, and
		// nothing tells the caller it was its own.
		if res.Status != http.StatusOK || res.Attempts != 2 {
			t.Errorf("status %d after %d attempts, want 200 after 2", res.Status, res.Attempts)
		}
		if n := e.count(t, "SELECT count(*) FROM customers WHERE tenant_id = $1 AND id = $2", e.tenantID, id); n != 1 {
			t.Errorf("customers = %d, want 1", n)
		}
	})

	t.Run("UpdateOrder", func(t *testing.T) {
		created, err := c.CreateOrder(t.Context(), "", orderRequest("inv-patch"))
		if err != nil {
			t.Fatal(err)
		}
		read, err := c.GetOrder(t.Context(), created.Value.Id)
		if err != nil {
			t.Fatal(err)
		}
		e.faults.play(cutAfterCommit)
		mine := "corrected"
		_, err = c.UpdateOrder(t.Context(), created.Value.Id, read.Header.Get("ETag"), api.UpdateOrderRequest{Description: &mine})
		if !client.HasCode(err, "precondition_failed") {
			t.Fatalf("error = %v, want the retry's 412 precondition_failed", err)
		}
		now, err := c.GetOrder(t.Context(), created.Value.Id)
		if err != nil {
			t.Fatal(err)
		}
		if now.Value.Description != mine {
			t.Errorf("description = %q: the first attempt's change should be there", now.Value.Description)
		}
	})
}
