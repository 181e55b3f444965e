//go:build loadtest

package httpapi

import (
	"context"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/payments"
)

// BaselineOrdersPath is the load benchmark's baseline (tools/loadtest): the
// order create of POST /v1/orders without idempotency, to measure what the
// key costs. It exists only in a binary built with -tags loadtest.
const BaselineOrdersPath = "/v1/_baseline/orders"

// BaselinePaymentsPath is the payment's baseline (P8): POST /v1/payments
// without idempotency (payments.Service.PayBaseline). Only in -tags
// loadtest binaries.
const BaselinePaymentsPath = "/v1/_baseline/payments"

func init() {
	loadtestRoutes = append(loadtestRoutes, func(a *api, r chi.Router) {
		r.Post("/_baseline/orders", a.createOrderBaseline)
		r.Post("/_baseline/payments", a.createPaymentBaseline)
	})
}

// createPaymentBaseline does what POST /v1/payments does, minus the key:
// the same authentication and rate limit, body checks and validation, the
// same checks and rows in the database, one processor call, the same
// answer. Its price against POST /v1/payments is the price of the key, the
// lease and the recovery points on the payment path.
func (a *api) createPaymentBaseline(w http.ResponseWriter, r *http.Request) {
	var req createPaymentRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, r, err)
		return
	}
	res, err := a.payments.PayBaseline(r.Context(), tenantFrom(r.Context()), payments.PayInput{
		OrderID: uuid.UUID(req.OrderID), Amount: req.Amount, Currency: req.Currency, PaymentMethod: req.PaymentMethod,
	})
	respond(w, r, res, false, err)
}

// createOrderBaseline does what POST /v1/orders does, minus the key: the
// same authentication and rate limit (the /v1 middleware), the same body
// checks, the same validation and insert in one transaction (BEGIN,
// insert, COMMIT), the same 201 body and Location. The transaction is
// pipelined (db.WithPipelinedTx) like the create's, so that P1 compares
// the key's work and not two transports: BEGIN travels with the insert.
// What it leaves out is exactly
// the price of idempotency: no Idempotency-Key header, no fingerprint, no
// claim, no savepoint, no recorded response. A retry of it creates a
// second order, or meets the reference backstop (409).
func (a *api) createOrderBaseline(w http.ResponseWriter, r *http.Request) {
	var req createOrderRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, r, err)
		return
	}
	req.applyDefaults()
	var out success
	err := db.WithPipelinedTx(r.Context(), a.pool, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		out, err = createOrder(ctx, tx, tenantFrom(ctx), &req)
		return err
	})
	if err != nil {
		writeError(w, r, err)
		return
	}
	res, err := encodeJSON(out.status, out.body, out.location)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeResponse(w, res)
}
