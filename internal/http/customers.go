package httpapi

import (
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/idemref/payments/internal/customers"
	"github.com/idemref/payments/internal/validation"
)

// putCustomerRequest is the body of PUT /v1/customers/{id}: the whole
// resource.
type putCustomerRequest struct {
	Name  string `json:"name"`
	Email string `json:"email"`
}

type customerJSON struct {
	ID        uuid.UUID `json:"id"`
	Name      string    `json:"name"`
	Email     string    `json:"email"`
	CreatedAt string    `json:"created_at"`
	UpdatedAt string    `json:"updated_at"`
}

func toCustomerJSON(c customers.Customer) customerJSON {
	return customerJSON{
		ID: c.ID, Name: c.Name, Email: c.Email,
		CreatedAt: c.CreatedAt.UTC().Format(time.RFC3339Nano),
		UpdatedAt: c.UpdatedAt.UTC().Format(time.RFC3339Nano),
	}
}

// putCustomer serves PUT /v1/customers/{id}: create or replace, with the id
// chosen by the client. No Idempotency-Key: the id is the key, and the
// row is the record. A retry finds the row it created and writes the same
// state again: 200 instead of 201, same body.
func (a *api) putCustomer(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(r, "id")
	if !ok {
		// The client chose this id: a malformed one is its request's fault.
		writeError(w, r, &validation.Error{Fields: []validation.FieldError{{Field: "id", Message: validation.IDMessage}}})
		return
	}
	var req putCustomerRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, r, err)
		return
	}
	c, created, err := customers.Put(r.Context(), a.pool, tenantFrom(r.Context()), id, customers.Input(req))
	if err != nil {
		writeError(w, r, err)
		return
	}
	status, location := http.StatusOK, ""
	if created {
		status, location = http.StatusCreated, "/v1/customers/"+c.ID.String()
	}
	res, err := encodeJSON(status, toCustomerJSON(c), location)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeResponse(w, res)
}

func (a *api) getCustomer(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(r, "id")
	if !ok {
		writeError(w, r, customers.ErrNotFound)
		return
	}
	c, err := customers.Get(r.Context(), a.pool, tenantFrom(r.Context()), id)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toCustomerJSON(c))
}
