package httpapi

import (
	"context"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/idemref/payments/internal/idem"
)

// ReplayedHeader marks a response replayed from the idempotency record.
const ReplayedHeader = "Idempotent-Replayed"

// request is what an idempotent endpoint's body type must offer: defaults
// applied before fingerprinting, so an omitted field and its explicit
// default are the same request.
type request interface {
	applyDefaults()
}

// idempotentOp runs the business write inside the idempotency
// transaction and returns the result to encode, or an error. Errors that
// map to a 4xx problem are deterministic and get recorded; others roll
// everything back. It is idem.UndoableWork: it writes through tx and
// nothing else, since it may be rolled back, and run again by a duplicate.
type idempotentOp[T any] func(ctx context.Context, tx idem.UndoableTx, tenantID uuid.UUID, req *T) (success, error)

// success is a 2xx answer before encoding.
type success struct {
	status   int
	body     any
	location string
}

// idempotent adapts op into the handler of endpoint e that follows the
// whole one-transaction pattern:
//
//	key → body → fingerprint → claim/execute/record or replay (idem.Store.Execute)
//
// Everything rejected before Execute is answered but never recorded. A
// duplicate of a request in flight that prefers to wait does so (api.keyed).
func idempotent[T any, PT interface {
	*T
	request
}](a *api, e idem.Endpoint, op idempotentOp[T]) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		arrived := time.Now()
		claim, req, ok := prepare[T, PT](w, r, e, a.contract[e.String()].FingerprintExclude)
		if !ok {
			return
		}
		work := func(ctx context.Context, tx idem.UndoableTx) (idem.Response, error) {
			out, err := op(ctx, tx, claim.TenantID, req)
			if err != nil {
				p := problemFor(err).keyed()
				if !p.recorded() {
					return idem.Response{}, err // roll back, record nothing (O2)
				}
				logProblem(ctx, p, err)
				return p.encode(), nil // deterministic: recorded and replayed (O1)
			}
			return encodeJSON(out.status, out.body, out.location)
		}
		a.keyed(w, r, arrived, claim, func() (idem.Response, bool, error) {
			return a.idem.Execute(r.Context(), claim, work)
		})
	}
}

// multiStep adapts an operation that leaves our database (a payment) into
// the handler of endpoint e; run runs its own phases on idem's multi-step
// keys. The steps before the claim are the same as for idempotent.
func multiStep[T any, PT interface {
	*T
	request
}](a *api, e idem.Endpoint, run func(ctx context.Context, c idem.Claim, req *T) (idem.Response, bool, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		arrived := time.Now()
		claim, req, ok := prepare[T, PT](w, r, e, a.contract[e.String()].FingerprintExclude)
		if !ok {
			return
		}
		a.keyed(w, r, arrived, claim, func() (idem.Response, bool, error) {
			return run(r.Context(), claim, req)
		})
	}
}

// prepare does everything that comes before the claim of a key of e: parse
// the key, reject ambiguous bodies, apply defaults, take the fingerprint
// without the members the contract excludes from it (exclude; F5). When it returns false it has already answered, and nothing was recorded.
func prepare[T any, PT interface {
	*T
	request
}](w http.ResponseWriter, r *http.Request, e idem.Endpoint, exclude []string) (idem.Claim, *T, bool) {
	// The key is scoped by the endpoint's name in Endpoints, the route
	// template rather than the path (K2), so the key-status lookup and the
	// completer find it under that name. The path parameters are part of
	// the fingerprint (F2).
	endpoint := e.String()
	var key string // "" until it parsed
	// Rejected before the claim: answered, never recorded (O3).
	reject := func(err error) (idem.Claim, *T, bool) {
		idem.CountRejectedBeforeClaim(r.Context(), endpoint, key)
		writeKeyedError(w, r, err)
		return idem.Claim{}, nil, false
	}
	key, err := idem.ParseKey(r.Header.Values(idem.HeaderName))
	if err != nil {
		return reject(err)
	}
	req := PT(new(T))
	if err := decodeBody(r, req); err != nil {
		return reject(err)
	}
	req.applyDefaults()

	rctx := chi.RouteContext(r.Context())
	params := map[string]string{}
	for i, k := range rctx.URLParams.Keys {
		// Every id has one spelling (validation.ParseID), so a path
		// parameter is fingerprinted as sent: two paths that differ name
		// two resources, or none.
		params[k] = rctx.URLParams.Values[i]
	}
	fingerprint, err := idem.Fingerprint(endpoint, params, req, exclude...)
	if err != nil {
		return reject(err)
	}
	claim := idem.Claim{TenantID: tenantFrom(r.Context()), Endpoint: endpoint, Key: key, Fingerprint: fingerprint}
	return claim, (*T)(req), true
}
