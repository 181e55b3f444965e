package httpapi

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/idemref/payments/internal/idem"
	"github.com/idemref/payments/internal/orders"
)

// createOrderRequest is the body of POST /v1/orders. Its shape is checked
// by idem.DecodeStrict before the claim; its meaning by orders.Validate
// inside the transaction, so semantic failures are recorded.
type createOrderRequest struct {
	Reference   string            `json:"reference"`
	CustomerID  string            `json:"customer_id"`
	Amount      int64             `json:"amount"`
	Currency    string            `json:"currency"`
	Description string            `json:"description"`
	Metadata    map[string]string `json:"metadata"`
}

// applyDefaults makes an omitted (or null) metadata equal to {}, its
// explicit default, before the fingerprint is taken. description's default
// "" is already Go's zero value.
func (r *createOrderRequest) applyDefaults() {
	if r.Metadata == nil {
		r.Metadata = map[string]string{}
	}
}

// orderJSON is the wire form of an order.
type orderJSON struct {
	ID          uuid.UUID         `json:"id"`
	Reference   string            `json:"reference"`
	CustomerID  string            `json:"customer_id"`
	Amount      int64             `json:"amount"`
	Currency    string            `json:"currency"`
	Description string            `json:"description"`
	Metadata    map[string]string `json:"metadata"`
	Status      string            `json:"status"`
	AmountPaid  int64             `json:"amount_paid"`
	// AmountRefunded follows refund events, as AmountPaid follows payment
	// events: eventually consistent with the payments.
	AmountRefunded int64  `json:"amount_refunded"`
	CreatedAt      string `json:"created_at"`
}

func toOrderJSON(o orders.Order) orderJSON {
	return orderJSON{
		ID:             o.ID,
		Reference:      o.Reference,
		CustomerID:     o.CustomerID,
		Amount:         o.Amount,
		Currency:       o.Currency,
		Description:    o.Description,
		Metadata:       o.Metadata,
		Status:         o.Status,
		AmountPaid:     o.AmountPaid,
		AmountRefunded: o.AmountRefunded,
		CreatedAt:      o.CreatedAt.UTC().Format(time.RFC3339Nano),
	}
}

// createOrder is POST /v1/orders' idempotentOp: it writes the order
// through tx, inside the key's transaction, and does nothing else.
func createOrder(ctx context.Context, tx idem.UndoableTx, tenantID uuid.UUID, req *createOrderRequest) (success, error) {
	o, err := orders.Create(ctx, tx, tenantID, orders.CreateInput(*req))
	if err != nil {
		return success{}, err
	}
	return success{status: http.StatusCreated, body: toOrderJSON(o), location: "/v1/orders/" + o.ID.String()}, nil
}

func (a *api) getOrder(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(r, "id")
	if !ok {
		// A malformed id names no order: 404, like any unknown id.
		writeError(w, r, orders.ErrNotFound)
		return
	}
	o, err := orders.Get(r.Context(), a.pool, tenantFrom(r.Context()), id)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeOrder(w, r, o)
}

type orderListJSON struct {
	Data       []orderJSON `json:"data"`
	NextCursor *string     `json:"next_cursor"`
}

const (
	defaultPageSize = 20
	maxPageSize     = 100
)

// pageSize reads ?limit= of a list: defaultPageSize when absent. Every
// list reads its query through it first, so a query string that does not
// parse (?limit=%zz) is a 400, never silently dropped: url.Query ignores
// the pairs it cannot decode, and the list would answer a default page.
func pageSize(r *http.Request) (int, error) {
	if _, err := url.ParseQuery(r.URL.RawQuery); err != nil {
		return 0, errMalformedQuery
	}
	s := r.URL.Query().Get("limit")
	if s == "" {
		return defaultPageSize, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > maxPageSize {
		return 0, errInvalidLimit
	}
	return n, nil
}

func (a *api) listOrders(w http.ResponseWriter, r *http.Request) {
	limit, err := pageSize(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	page, err := orders.List(r.Context(), a.pool, tenantFrom(r.Context()), r.URL.Query().Get("cursor"), limit)
	if err != nil {
		writeError(w, r, err)
		return
	}
	out := orderListJSON{Data: make([]orderJSON, 0, len(page.Orders))}
	for _, o := range page.Orders {
		out.Data = append(out.Data, toOrderJSON(o))
	}
	if page.NextCursor != "" {
		out.NextCursor = &page.NextCursor
	}
	writeJSON(w, http.StatusOK, out)
}
