package httpapi

import (
	"errors"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/idemref/payments/internal/validation"
)

// Every id a request carries is read in the one form the API writes (see
// validation.ParseID): in its path (pathID; another spelling names no
// resource, 404, except the id a client chooses for a customer, a 400),
// its query (?order_id=, 400 invalid_query), its body (bodyID, 400
// invalid_json) and its cursors (internal/cursor, 400 invalid_query).

// pathID reads the id path parameter name.
func pathID(r *http.Request, name string) (uuid.UUID, bool) {
	return validation.ParseID(chi.URLParam(r, name))
}

// bodyID is an id in a request body: decoded by validation.ParseID,
// encoded (for the fingerprint) as uuid.UUID is.
type bodyID uuid.UUID

var errBodyID = errors.New(validation.IDMessage)

func (id *bodyID) UnmarshalText(b []byte) error {
	u, ok := validation.ParseID(string(b))
	if !ok {
		return errBodyID
	}
	*id = bodyID(u)
	return nil
}

func (id bodyID) MarshalText() ([]byte, error) { return uuid.UUID(id).MarshalText() }
