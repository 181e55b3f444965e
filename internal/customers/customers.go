// Package customers owns customers, the example of the first alternative
// to idempotency keys (N2): the client supplies the id and PUTs the whole
// resource, so a retry targets the same row and the primary key
// deduplicates. No key table is involved; see docs/alternatives.md for what
// this gives and what it cannot.
package customers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/validation"
)

// Customer is a customer as the rest of the program sees it.
type Customer struct {
	ID        uuid.UUID
	Name      string
	Email     string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Input is the body of a PUT: the whole new state.
type Input struct {
	Name  string
	Email string
}

// ErrNotFound: no such customer for this tenant.
var ErrNotFound = errors.New("customer not found")

const (
	maxNameLength  = 200
	maxEmailLength = 254
)

// Validate checks in and returns a *validation.Error, or nil.
func Validate(in Input) error {
	var v validation.Errors
	if v.Required("name", in.Name) {
		if utf8.RuneCountInString(in.Name) > maxNameLength {
			v.Add("name", fmt.Sprintf("must be at most %d characters", maxNameLength))
		}
		v.Text("name", in.Name, false)
	}
	at := strings.LastIndexByte(in.Email, '@')
	var email validation.Errors
	email.Text("email", in.Email, false)
	switch {
	case len(in.Email) > maxEmailLength:
		v.Add("email", fmt.Sprintf("must be at most %d bytes", maxEmailLength))
	case at < 1 || at == len(in.Email)-1 || strings.ContainsAny(in.Email, " \t\r\n") || len(email) > 0:
		v.Add("email", "must be an address such as ada@example.com")
	}
	return v.Err()
}

// Put creates the customer id, or replaces it with in, in one statement;
// created says which. Repeating a Put is harmless: the same row ends in the
// same state, and a Put that changes nothing leaves UpdatedAt alone.
func Put(ctx context.Context, q dbsqlc.DBTX, tenantID, id uuid.UUID, in Input) (c Customer, created bool, err error) {
	if err := Validate(in); err != nil {
		return Customer{}, false, err
	}
	row, err := dbsqlc.New(q).CustomerPut(ctx, dbsqlc.CustomerPutParams{TenantID: tenantID, ID: id, Name: in.Name, Email: in.Email})
	if err != nil {
		return Customer{}, false, err
	}
	return Customer{ID: row.ID, Name: row.Name, Email: row.Email, CreatedAt: row.CreatedAt, UpdatedAt: row.UpdatedAt}, row.Inserted, nil
}

// Get returns one of the tenant's customers.
func Get(ctx context.Context, q dbsqlc.DBTX, tenantID, id uuid.UUID) (Customer, error) {
	row, err := dbsqlc.New(q).CustomerGet(ctx, dbsqlc.CustomerGetParams{TenantID: tenantID, ID: id})
	if errors.Is(err, pgx.ErrNoRows) {
		return Customer{}, ErrNotFound
	}
	if err != nil {
		return Customer{}, err
	}
	return Customer{ID: row.ID, Name: row.Name, Email: row.Email, CreatedAt: row.CreatedAt, UpdatedAt: row.UpdatedAt}, nil
}
