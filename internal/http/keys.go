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

// idempotentEndpoints are the names of the endpoints whose keys the status
// endpoint reports: every route that takes an Idempotency-Key, as
// Endpoints lists them, so a key is looked up under the name it was claimed
// under.
var idempotentEndpoints = endpointNames(Endpoints)

// endpointNames indexes endpoints by the name their keys are scoped by.
func endpointNames(endpoints []idem.Endpoint) map[string]bool {
	names := make(map[string]bool, len(endpoints))
	for _, e := range endpoints {
		names[e.String()] = true
	}
	return names
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

// keySegment returns the {key} path segment percent-decoded exactly once.
//
// chi matches routes against r.URL.RawPath when the request has one and
// against the decoded r.URL.Path otherwise, and its URL parameters are cut
// from whichever it matched. net/http sets RawPath only when the path as
// sent is not the default encoding of the decoded path (a %2F, say), so
// chi.URLParam is sometimes still encoded ("a%2Fb") and sometimes already
// decoded ("50%off-1", sent as 50%25off-1). Decoding the second kind again
// misreads every % in a key: an error (404) or a different key (%2525
// would become %). So decode only what chi left encoded. A decoded Path
// without RawPath cannot hold a slash from %2F, so the segment chi matched
// is the whole key either way.
func keySegment(r *http.Request) (string, bool) {
	param := chi.URLParam(r, "key")
	if r.URL.RawPath == "" {
		return param, true
	}
	decoded, err := url.PathUnescape(param)
	return decoded, err == nil
}

// keyNotRecordedError is the status endpoint's 404: no record of the key,
// which is final only once window has passed since the key's last request
// was sent (idem.Store.CommitWindow): a request still running has no
// record yet.
type keyNotRecordedError struct{ window time.Duration }

func (e *keyNotRecordedError) Error() string { return "no record of this Idempotency-Key yet" }

// requestTimeout is the time this server gives a request: every request
// gets the same deadline (Config.RequestTimeout), so what is left of this
// one's, rounded up to the second, is what a request under the key had.
// Zero when the request has no deadline.
func requestTimeout(r *http.Request) time.Duration {
	deadline, ok := r.Context().Deadline()
	if !ok {
		return 0
	}
	return (time.Until(deadline) + time.Second - 1).Truncate(time.Second)
}

// getKeyStatus serves GET /v1/idempotency-keys/{key}?endpoint=...:
// what became of one of the tenant's keys, never the stored body. Another
// tenant's key, a key past its retention and a key whose request has not
// committed (yet) are 404, with the window after which no record means
// that no request sent before it committed.
func (a *api) getKeyStatus(w http.ResponseWriter, r *http.Request) {
	segment, ok := keySegment(r)
	if !ok {
		writeError(w, r, errRouteNotFound)
		return
	}
	// The segment is read exactly like the header (K1): bare, or an
	// sf-string in quotes. What is looked up is the parsed key, the string
	// the claim stored: "q-1" names the key q-1, as in the header.
	key, err := idem.ParseKey([]string{segment})
	if err != nil {
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
		var window time.Duration // unknown without a deadline
		if rt := requestTimeout(r); rt > 0 {
			window = a.idem.CommitWindow(rt)
		}
		writeError(w, r, &keyNotRecordedError{window: window})
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
