package httpapi

import (
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/payments"
)

// idempotentEndpoints are the endpoints whose keys the status endpoint
// reports: every route that takes an Idempotency-Key.
var idempotentEndpoints = map[string]bool{
	"POST /v1/orders":       true,
	payments.EndpointPay:    true,
	payments.EndpointRefund: true,
}

var errEndpointParam = errors.New("endpoint must be the route template the key was used on, such as POST /v1/orders")

type keyStatusJSON struct {
	Key            string  `json:"key"`
	Endpoint       string  `json:"endpoint"`
	State          string  `json:"state"`
	RecoveryPoint  *string `json:"recovery_point"`
	ResponseStatus *int    `json:"response_status"`
	Resource       *string `json:"resource"`
	CreatedAt      string  `json:"created_at"`
	CompletedAt    *string `json:"completed_at"`
	ExpiresAt      string  `json:"expires_at"`
	RetainUntil    string  `json:"retain_until"`
}

// getKeyStatus serves GET /v1/idempotency-keys/{key}?endpoint=... (E4):
// what became of one of the tenant's keys, never the stored body. Another
// tenant's key, and a key past its retention, are 404.
func (a *api) getKeyStatus(w http.ResponseWriter, r *http.Request) {
	raw := chi.URLParam(r, "key")
	key, err := url.PathUnescape(raw)
	if err != nil {
		writeError(w, r, errRouteNotFound)
		return
	}
	if _, err := idem.ParseKey([]string{key}); err != nil {
		writeError(w, r, err)
		return
	}
	endpoint := r.URL.Query().Get("endpoint")
	if !idempotentEndpoints[endpoint] {
		writeError(w, r, errEndpointParam)
		return
	}
	st, err := a.idem.Status(r.Context(), tenantFrom(r.Context()), endpoint, key)
	if errors.Is(err, idem.ErrKeyUnknown) {
		writeError(w, r, errRouteNotFound)
		return
	}
	if err != nil {
		writeError(w, r, err)
		return
	}
	out := keyStatusJSON{
		Key: key, Endpoint: endpoint, State: st.State,
		RecoveryPoint: optional(st.RecoveryPoint),
		CreatedAt:     st.CreatedAt.UTC().Format(time.RFC3339Nano),
		ExpiresAt:     st.ExpiresAt.UTC().Format(time.RFC3339Nano),
		RetainUntil:   st.RetainUntil.UTC().Format(time.RFC3339Nano),
	}
	if st.ResponseStatus != 0 {
		out.ResponseStatus = &st.ResponseStatus
	}
	switch {
	case st.ResourceLocation != "":
		out.Resource = &st.ResourceLocation
	case endpoint == payments.EndpointPay && st.ResourceID != [16]byte{}:
		// A payment in progress has its row already; GET shows it as
		// processing.
		loc := "/v1/payments/" + st.ResourceID.String()
		out.Resource = &loc
	}
	if st.CompletedAt != nil {
		s := st.CompletedAt.UTC().Format(time.RFC3339Nano)
		out.CompletedAt = &s
	}
	writeJSON(w, http.StatusOK, out)
}
