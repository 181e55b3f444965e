// Package orders owns orders: validation of a create request, the natural-key
// backstop (a client reference is unique per tenant, N1) and tenant-scoped
// reads. It knows nothing about HTTP or idempotency keys: the HTTP layer runs
// Create inside the transaction that internal/idem opened for the key.
package orders

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/cursor"
	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/db/dbsqlc"
	"github.com/idemref/payments/internal/validation"
)

// Order statuses.
const (
	StatusPending = "pending"
	StatusPaid    = "paid"
	// StatusPartiallyRefunded and StatusRefunded follow refund events.
	StatusPartiallyRefunded = "partially_refunded"
	StatusRefunded          = "refunded"
)

// Order is an order as the rest of the program sees it.
type Order struct {
	ID          uuid.UUID
	Reference   string
	CustomerID  string
	Amount      int64
	Currency    string
	Description string
	Metadata    map[string]string
	Status      string
	// AmountPaid is what was paid and not refunded, AmountRefunded what
	// was refunded. Both follow payment and refund events (see
	// ApplyEvent): they catch up with the payments within the relay and
	// delivery latency.
	AmountPaid     int64
	AmountRefunded int64
	CreatedAt      time.Time
}

// CreateInput is a validated-for-shape create request after defaults.
type CreateInput struct {
	Reference   string
	CustomerID  string
	Amount      int64
	Currency    string
	Description string
	Metadata    map[string]string
}

var (
	// ErrNotFound: no such order for this tenant (other tenants' orders
	// included: existence must not leak).
	ErrNotFound = errors.New("order not found")
	// ErrInvalidCursor: a list cursor that this service did not issue.
	ErrInvalidCursor = cursor.ErrInvalid
)

// ReferenceExistsError is the natural-key backstop firing: an order with
// this reference already exists (created under another idempotency key).
type ReferenceExistsError struct{ OrderID uuid.UUID }

func (e *ReferenceExistsError) Error() string {
	return fmt.Sprintf("an order with this reference already exists: %s", e.OrderID)
}

// Limits on create requests.
const (
	maxIDLength          = 128
	maxDescriptionLength = 1000
	maxMetadataKeys      = 50
	maxMetadataKeyLength = 40
	maxMetadataValLength = 500
)

// Validate checks the meaning of a create request and returns a
// *validation.Error listing every problem, or nil.
func Validate(in CreateInput) error {
	var v validation.Errors
	checkID := func(field, value string) {
		if !v.Required(field, value) {
			return
		}
		if utf8.RuneCountInString(value) > maxIDLength {
			v.Add(field, fmt.Sprintf("must be at most %d characters", maxIDLength))
		}
		v.Text(field, value, false)
	}
	checkID("reference", in.Reference)
	checkID("customer_id", in.CustomerID)
	v.Money(in.Amount, in.Currency)
	validateDetails(&v, in.Description, in.Metadata)
	return v.Err()
}

// validateDetails checks the fields a PATCH may change, for Validate and
// UpdateDetails alike.
func validateDetails(v *validation.Errors, description string, metadata map[string]string) {
	if utf8.RuneCountInString(description) > maxDescriptionLength {
		v.Add("description", fmt.Sprintf("must be at most %d characters", maxDescriptionLength))
	}
	v.Text("description", description, true)
	if len(metadata) > maxMetadataKeys {
		v.Add("metadata", fmt.Sprintf("must have at most %d keys", maxMetadataKeys))
	}
	// Each rule is checked over every entry and reported once, key rule
	// first: stopping at the first bad entry would let map iteration order
	// decide which problems the client hears about.
	var badKey, badValue bool
	var text validation.Errors
	for key, value := range metadata {
		if n := utf8.RuneCountInString(key); n == 0 || n > maxMetadataKeyLength {
			badKey = true
		}
		if utf8.RuneCountInString(value) > maxMetadataValLength {
			badValue = true
		}
		text.Text("metadata", key, false)
		text.Text("metadata", value, true)
	}
	if badKey {
		v.Add("metadata", fmt.Sprintf("keys must be 1 to %d characters", maxMetadataKeyLength))
	}
	if badValue {
		v.Add("metadata", fmt.Sprintf("values must be at most %d characters", maxMetadataValLength))
	}
	if len(text) > 0 {
		*v = append(*v, text[0])
	}
}

// Create validates in and inserts the order. It returns *validation.Error
// or *ReferenceExistsError for deterministic failures.
func Create(ctx context.Context, tx dbsqlc.DBTX, tenantID uuid.UUID, in CreateInput) (Order, error) {
	if err := Validate(in); err != nil {
		return Order{}, err
	}
	id, err := uuid.NewV7()
	if err != nil {
		return Order{}, err
	}
	// A nil map would marshal to JSON null, not the column's {} default.
	if in.Metadata == nil {
		in.Metadata = map[string]string{}
	}
	metadata, err := json.Marshal(in.Metadata)
	if err != nil {
		return Order{}, err
	}
	q := dbsqlc.New(tx)
	// The natural-key backstop (N1). ON CONFLICT on the reference constraint
	// returns no row instead of raising, and a concurrent insert of the same
	// reference waits for the other transaction, so two requests under two
	// different keys can never both create the order.
	row, err := q.OrderCreate(ctx, dbsqlc.OrderCreateParams{
		TenantID:    tenantID,
		ID:          id,
		Reference:   in.Reference,
		CustomerID:  in.CustomerID,
		Amount:      in.Amount,
		Currency:    in.Currency,
		Description: in.Description,
		Metadata:    metadata,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		existing, err := q.OrderGetByReference(ctx, dbsqlc.OrderGetByReferenceParams{TenantID: tenantID, Reference: in.Reference})
		if err != nil {
			return Order{}, fmt.Errorf("look up the existing order: %w", err)
		}
		return Order{}, &ReferenceExistsError{OrderID: existing.ID}
	}
	if err != nil {
		return Order{}, err
	}
	return fromRow(row)
}

// Get returns one of the tenant's orders.
func Get(ctx context.Context, q dbsqlc.DBTX, tenantID, id uuid.UUID) (Order, error) {
	row, err := dbsqlc.New(q).OrderGet(ctx, dbsqlc.OrderGetParams{TenantID: tenantID, ID: id})
	if errors.Is(err, pgx.ErrNoRows) {
		return Order{}, ErrNotFound
	}
	if err != nil {
		return Order{}, err
	}
	return fromRow(row)
}

// Page is one page of a listing, newest first.
type Page struct {
	Orders     []Order
	NextCursor string // empty on the last page
}

// List returns up to limit of the tenant's orders after cursor (empty for
// the first page).
func List(ctx context.Context, q dbsqlc.DBTX, tenantID uuid.UUID, after string, limit int) (Page, error) {
	if limit < 1 {
		return Page{}, fmt.Errorf("orders: page size %d must be positive", limit)
	}
	params := dbsqlc.OrderListParams{TenantID: tenantID, RowLimit: db.Int32(limit + 1)}
	if after != "" {
		at, id, err := cursor.Decode(after)
		if err != nil {
			return Page{}, err
		}
		params.CursorCreatedAt, params.CursorID = &at, &id
	}
	rows, err := dbsqlc.New(q).OrderList(ctx, params)
	if err != nil {
		return Page{}, err
	}
	var page Page
	if len(rows) > limit {
		rows = rows[:limit]
		last := rows[limit-1]
		page.NextCursor = cursor.Encode(last.CreatedAt, last.ID)
	}
	page.Orders = make([]Order, 0, len(rows))
	for _, row := range rows {
		o, err := fromRow(row)
		if err != nil {
			return Page{}, err
		}
		page.Orders = append(page.Orders, o)
	}
	return page, nil
}

// The cursor is opaque to clients: base64url of "<unix nanos>_<id>".
func fromRow(row dbsqlc.Order) (Order, error) {
	metadata := map[string]string{}
	if err := json.Unmarshal(row.Metadata, &metadata); err != nil {
		return Order{}, fmt.Errorf("decode order metadata: %w", err)
	}
	return Order{
		ID:             row.ID,
		Reference:      row.Reference,
		CustomerID:     row.CustomerID,
		Amount:         row.Amount,
		Currency:       row.Currency,
		Description:    row.Description,
		Metadata:       metadata,
		Status:         row.Status,
		AmountPaid:     row.AmountPaid,
		AmountRefunded: row.AmountRefunded,
		CreatedAt:      row.CreatedAt,
	}, nil
}

// Details is what PATCH /v1/orders/{id} may change: a nil field stays as
// it is; a given Metadata replaces the whole map.
type Details struct {
	Description *string
	Metadata    map[string]string
}

// UpdateDetails locks the order, passes its current state to check (the
// HTTP layer's If-Match comparison), and when check returns nil applies d.
// The lock makes the check and the write one step: no other write can land
// between the comparison and the update (the conditional update).
func UpdateDetails(ctx context.Context, tx dbsqlc.DBTX, tenantID, id uuid.UUID, d Details, check func(Order) error) (Order, error) {
	q := dbsqlc.New(tx)
	row, err := q.OrderGetForUpdate(ctx, dbsqlc.OrderGetForUpdateParams{TenantID: tenantID, ID: id})
	if errors.Is(err, pgx.ErrNoRows) {
		return Order{}, ErrNotFound
	}
	if err != nil {
		return Order{}, err
	}
	current, err := fromRow(row)
	if err != nil {
		return Order{}, err
	}
	if err := check(current); err != nil {
		return Order{}, err
	}
	if d.Description != nil {
		current.Description = *d.Description
	}
	if d.Metadata != nil {
		current.Metadata = d.Metadata
	}
	var v validation.Errors
	validateDetails(&v, current.Description, current.Metadata)
	if err := v.Err(); err != nil {
		return Order{}, err
	}
	metadata, err := json.Marshal(current.Metadata)
	if err != nil {
		return Order{}, err
	}
	row, err = q.OrderUpdateDetails(ctx, dbsqlc.OrderUpdateDetailsParams{
		TenantID: tenantID, ID: id, Description: current.Description, Metadata: metadata,
	})
	if err != nil {
		return Order{}, err
	}
	return fromRow(row)
}
