// Package orders owns orders: validation of a create request, the natural-key
// backstop (a client reference is unique per tenant, N1) and tenant-scoped
// reads. It knows nothing about HTTP or idempotency keys: the HTTP layer runs
// Create inside the transaction that internal/idem opened for the key.
package orders

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

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
	ErrInvalidCursor = errors.New("invalid cursor")
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
		switch n := utf8.RuneCountInString(value); {
		case n == 0:
			v.Add(field, "is required")
		case n > maxIDLength:
			v.Add(field, fmt.Sprintf("must be at most %d characters", maxIDLength))
		}
	}
	checkID("reference", in.Reference)
	checkID("customer_id", in.CustomerID)
	v.Money(in.Amount, in.Currency)
	if utf8.RuneCountInString(in.Description) > maxDescriptionLength {
		v.Add("description", fmt.Sprintf("must be at most %d characters", maxDescriptionLength))
	}
	if len(in.Metadata) > maxMetadataKeys {
		v.Add("metadata", fmt.Sprintf("must have at most %d keys", maxMetadataKeys))
	}
	// Each rule is checked over every entry and reported once, key rule
	// first: stopping at the first bad entry would let map iteration order
	// decide which problems the client hears about.
	var badKey, badValue bool
	for key, value := range in.Metadata {
		if n := utf8.RuneCountInString(key); n == 0 || n > maxMetadataKeyLength {
			badKey = true
		}
		if utf8.RuneCountInString(value) > maxMetadataValLength {
			badValue = true
		}
	}
	if badKey {
		v.Add("metadata", fmt.Sprintf("keys must be 1 to %d characters", maxMetadataKeyLength))
	}
	if badValue {
		v.Add("metadata", fmt.Sprintf("values must be at most %d characters", maxMetadataValLength))
	}
	return v.Err()
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
func List(ctx context.Context, q dbsqlc.DBTX, tenantID uuid.UUID, cursor string, limit int) (Page, error) {
	if limit < 1 {
		return Page{}, fmt.Errorf("orders: page size %d must be positive", limit)
	}
	params := dbsqlc.OrderListParams{TenantID: tenantID, RowLimit: int32(limit) + 1}
	if cursor != "" {
		at, id, err := decodeCursor(cursor)
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
		page.NextCursor = encodeCursor(last.CreatedAt, last.ID)
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
func encodeCursor(at time.Time, id uuid.UUID) string {
	return base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, "%d_%s", at.UnixNano(), id))
}

func decodeCursor(cursor string) (time.Time, uuid.UUID, error) {
	raw, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil {
		return time.Time{}, uuid.Nil, ErrInvalidCursor
	}
	nanos, idText, ok := strings.Cut(string(raw), "_")
	// ParseInt, not fmt.Sscan: Sscan skips spaces and stops at the first
	// non-digit, so it would accept "17x" as 17.
	n, err := strconv.ParseInt(nanos, 10, 64)
	if !ok || err != nil {
		return time.Time{}, uuid.Nil, ErrInvalidCursor
	}
	id, err := uuid.Parse(idText)
	if err != nil {
		return time.Time{}, uuid.Nil, ErrInvalidCursor
	}
	return time.Unix(0, n), id, nil
}

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
