package httpapi_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/idemref/payments/internal/tooling/pgwire"
)

// Round trips to PostgreSQL per request, counted on the wire (P2), in
// steady state (statements prepared, the API key in the authentication
// cache). The targets are at most 4, 3 and 12; the test pins what the code
// spends today, so a change that adds a round trip to a hot path fails
// here, and one that saves one updates the figure:
//
//	create   [read the key, idem_key_absent, BEGIN, lock_timeout, insert] [claim with the record, COMMIT]
//	replay   [read the key, idem_key_absent: fails, the server skips the rest]
//	payment  5 in transaction 1 (the payment inserted already marked
//	         charge_sent), 2 to record its outcome (the lease's fence and
//	         the outcome written under its guard, then the outbox row, the
//	         record and COMMIT together); plus the processor call
const (
	roundTripsCreate  = 2
	roundTripsReplay  = 1
	roundTripsPayment = 7
)

func TestRoundTripsPerRequest(t *testing.T) {
	e := setup(t, withWireCounter(), withProcessor())

	create := func(key, ref string) response { return e.post(t, e.a.Key, key, orderBody(ref)) }
	// Warm up: every statement of each path runs once on the pool's one
	// connection and is prepared there, and the API key is cached.
	wantStatus(t, create("warm-order", "warm-1"), http.StatusCreated)
	wantStatus(t, create("warm-order", "warm-1"), http.StatusCreated)
	warm := decodeOrder(t, create("warm-order-2", "warm-2"))
	wantStatus(t, e.pay(t, e.a.Key, "warm-pay", payBody(warm.Id.String(), cardVisa)), http.StatusCreated)

	measure := func(name string, rt int64, fn func() response, want int) {
		t.Helper()
		e.wire.Reset()
		e.wire.Record(true)
		var res response
		got, err := e.wire.Measure(t.Context(), func() error { res = fn(); return nil })
		e.wire.Record(false)
		if err != nil {
			t.Fatal(err)
		}
		wantStatus(t, res, want)
		t.Logf("%s: %d round trips, %d statements:\n%s", name, got.RoundTrips, got.Statements, describe(e.wire.Statements()))
		if got.RoundTrips != rt {
			t.Errorf("%s: %d round trips to PostgreSQL, want %d", name, got.RoundTrips, rt)
		}
		if got.Connections != 0 {
			t.Errorf("%s: opened %d connections; the measure is of a warm pool", name, got.Connections)
		}
	}

	measure("create", roundTripsCreate, func() response { return create("rt-create", "rt-1") }, http.StatusCreated)
	measure("replay", roundTripsReplay, func() response { return create("rt-create", "rt-1") }, http.StatusCreated)
	o := decodeOrder(t, create("rt-order", "rt-2"))
	measure("payment", roundTripsPayment, func() response {
		return e.pay(t, e.a.Key, "rt-pay", payBody(o.Id.String(), cardVisa))
	}, http.StatusCreated)

	// The side effects: the create ran once, the payment charged once.
	if n := e.countOrdersWithReference(t, e.a.ID, "rt-1"); n != 1 {
		t.Errorf("orders with reference rt-1: %d, want 1", n)
	}
	if n := e.count(t, `SELECT count(*) FROM payments WHERE order_id = $1 AND status = 'succeeded'`, o.Id.String()); n != 1 {
		t.Errorf("succeeded payments of the order: %d, want 1", n)
	}
}

// describe lists statements one per line, prefixed by their round trip.
func describe(stmts []pgwire.Statement) string {
	var b strings.Builder
	for _, s := range stmts {
		sql := strings.Join(strings.Fields(s.SQL), " ")
		if len(sql) > 100 {
			sql = sql[:100] + "…"
		}
		fmt.Fprintf(&b, "  rt %d: %s\n", s.RoundTrip, sql)
	}
	return b.String()
}
