//go:build loadtest

package httpapi

import (
	"context"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/idemref/payments/internal/idem"
)

// ClaimFirstOrdersPath is the load benchmark's claim-first peer
// (tools/loadtest, P8): POST /v1/orders with the key claimed in progress
// first and updated to completed last, in one transaction
// (idem.Store.ExecuteClaimFirst), the classic shape. It exists only in a
// binary built with -tags loadtest.
const ClaimFirstOrdersPath = "/v1/_claimfirst/orders"

// claimFirstEndpoint scopes the peer's keys apart from POST /v1/orders'.
var claimFirstEndpoint = idem.Endpoint{Method: http.MethodPost, Route: ClaimFirstOrdersPath}

func init() {
	loadtestRoutes = append(loadtestRoutes, func(a *api, r chi.Router) {
		r.Post("/_claimfirst/orders", a.createOrderClaimFirst)
	})
}

// createOrderClaimFirst is POST /v1/orders on the claim-first shape: the
// same key parsing, body checks, fingerprint, order insert, outcome policy
// and answer as the idempotent adapter; only the Store's method differs.
func (a *api) createOrderClaimFirst(w http.ResponseWriter, r *http.Request) {
	claim, req, ok := prepare[createOrderRequest](w, r, claimFirstEndpoint, a.contract[createOrderEndpoint.String()].FingerprintExclude)
	if !ok {
		return
	}
	res, replayed, err := a.idem.ExecuteClaimFirst(r.Context(), claim, func(ctx context.Context, tx idem.UndoableTx) (idem.Response, error) {
		out, err := createOrder(ctx, tx, claim.TenantID, req)
		if err != nil {
			p := problemFor(err).keyed()
			if !p.recorded() {
				return idem.Response{}, err
			}
			logProblem(ctx, p, err)
			return p.encode(), nil
		}
		return encodeJSON(out.status, out.body, out.location)
	})
	respond(w, r, res, replayed, err)
}
