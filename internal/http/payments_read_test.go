package httpapi_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/idemref/payments/client/api"
)

// GET /v1/payments pages through every payment once, newest first, and
// filters by order; each entry is what GET /v1/payments/{id} shows.
func TestListPayments(t *testing.T) {
	e := setup(t, withProcessor())
	var ids []string // in creation order
	var firstOrder api.Order
	for i := range 5 {
		o := e.newOrder(t, e.a, fmt.Sprintf("inv-list-%d", i))
		if i == 0 {
			firstOrder = o
		}
		res := e.pay(t, e.a.Key, fmt.Sprintf("pay-list-%d", i), payBody(o.Id.String(), cardVisa))
		wantStatus(t, res, http.StatusCreated)
		ids = append(ids, decodePayment(t, res).Id.String())
	}
	// Another tenant's payment never shows.
	other := e.newOrder(t, e.b, "inv-other")
	wantStatus(t, e.pay(t, e.b.Key, "pay-other", payBody(other.Id.String(), cardVisa)), http.StatusCreated)

	var seen []string
	target := "/v1/payments?limit=2"
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("more pages than payments")
		}
		res := e.get(t, e.a.Key, target)
		wantStatus(t, res, http.StatusOK)
		var p api.PaymentList
		decodeJSON(t, res, &p)
		for _, pm := range p.Data {
			seen = append(seen, pm.Id.String())
			if pm.Status != "succeeded" || pm.Compensations == nil {
				t.Errorf("listed payment %+v, want succeeded with a compensations list", pm)
			}
		}
		if p.NextCursor == nil {
			break
		}
		target = "/v1/payments?limit=2&cursor=" + *p.NextCursor
	}
	if len(seen) != len(ids) {
		t.Fatalf("listed %d payments %v, want the tenant's %d", len(seen), seen, len(ids))
	}
	for i, id := range seen {
		if want := ids[len(ids)-1-i]; id != want {
			t.Errorf("entry %d = %s, want %s (newest first)", i, id, want)
		}
	}
	if n := e.count(t, `SELECT count(*) FROM payments WHERE tenant_id = $1`, e.a.ID); n != len(seen) {
		t.Errorf("payments rows of the tenant = %d, listed %d", n, len(seen))
	}

	res := e.get(t, e.a.Key, "/v1/payments?order_id="+firstOrder.Id.String())
	wantStatus(t, res, http.StatusOK)
	var filtered api.PaymentList
	decodeJSON(t, res, &filtered)
	if len(filtered.Data) != 1 || filtered.Data[0].Id.String() != ids[0] {
		t.Errorf("payments of order %s = %+v, want only %s", firstOrder.Id.String(), filtered.Data, ids[0])
	}
}

// A refund's 201 carries a Location, the same on its replay, and GET there
// answers the refund as stored.
func TestRefundLocationAndGet(t *testing.T) {
	e := setup(t, withProcessor())
	o := e.newOrder(t, e.a, "inv-refund-get")
	res := e.pay(t, e.a.Key, "pay-refund-get", payBody(o.Id.String(), cardVisa))
	wantStatus(t, res, http.StatusCreated)
	p := decodePayment(t, res)

	first := e.refund(t, e.a.Key, "refund-get", p.Id.String(), refundBody(700))
	wantStatus(t, first, http.StatusCreated)
	loc := first.header.Get("Location")
	var created api.Refund
	decodeJSON(t, first, &created)
	if want := "/v1/payments/" + p.Id.String() + "/refunds/" + created.Id.String(); loc != want {
		t.Fatalf("Location = %q, want %q", loc, want)
	}
	replay := e.refund(t, e.a.Key, "refund-get", p.Id.String(), refundBody(700))
	if got := replay.header.Get("Location"); got != loc {
		t.Errorf("replayed Location = %q, want %q", got, loc)
	}

	got := e.get(t, e.a.Key, loc)
	wantStatus(t, got, http.StatusOK)
	var read api.Refund
	decodeJSON(t, got, &read)
	var dbAmount int64
	var dbStatus string
	if err := e.pool.QueryRow(t.Context(), `SELECT amount, status FROM refunds WHERE id = $1`, created.Id).Scan(&dbAmount, &dbStatus); err != nil {
		t.Fatal(err)
	}
	if read.Id != created.Id || read.PaymentId != p.Id || read.Amount != dbAmount || string(read.Status) != dbStatus {
		t.Errorf("GET refund = %+v, want id %s of payment %s, the row's %d %s", read, created.Id, p.Id, dbAmount, dbStatus)
	}
	wantProblem(t, e.get(t, e.b.Key, loc), http.StatusNotFound, "not_found")
}
