package httpapi

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/db"
	"github.com/idemref/payments/internal/orders"
)

// The conditional update (N2): PATCH /v1/orders/{id} with If-Match. The
// ETag is a hash of the order's JSON representation, so it changes with
// every change of the order, a payment's included, and is strong (RFC 9110
// section 8.8.1): equal tags mean byte-equal bodies.

var (
	errPreconditionRequired = errors.New("send If-Match with the ETag of the order as last read (GET /v1/orders/{id})")
	errPreconditionFailed   = errors.New("the order changed since the ETag in If-Match was read")
	// errWeakTag: If-Match held only weak tags besides non-matching ones.
	// If-Match compares strongly (RFC 9110 section 13.1.1), so a weak tag
	// never matches, whether the order changed or not.
	errWeakTag = errors.New(`If-Match compares strongly, so a weak tag (W/"...") never matches: send the ETag exactly as GET /v1/orders/{id} returned it`)
)

// updateOrderRequest is the body of PATCH /v1/orders/{id}. An absent (or
// null) member stays unchanged; metadata, when given, replaces the map.
type updateOrderRequest struct {
	Description *string            `json:"description"`
	Metadata    *map[string]string `json:"metadata"`
}

// orderETag is the strong entity tag of an order's representation.
func orderETag(o orders.Order) string {
	body, err := json.Marshal(toOrderJSON(o))
	if err != nil {
		panic(err) // our own types always encode
	}
	sum := sha256.Sum256(body)
	return `"` + base64.RawURLEncoding.EncodeToString(sum[:18]) + `"`
}

// ifMatch returns the entity tags of If-Match, and false when the request
// has none.
func ifMatch(r *http.Request) ([]string, bool) {
	var tags []string
	for _, line := range r.Header.Values("If-Match") {
		for tag := range strings.SplitSeq(line, ",") {
			if tag = strings.TrimSpace(tag); tag != "" {
				tags = append(tags, tag)
			}
		}
	}
	return tags, len(tags) > 0
}

// matches applies If-Match's strong comparison: a weak tag (W/"...") never
// matches, and "*" matches any current order.
func matches(tags []string, current string) bool {
	for _, t := range tags {
		if t == "*" || t == current {
			return true
		}
	}
	return false
}

func (a *api) updateOrder(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(r, "id")
	if !ok {
		writeError(w, r, orders.ErrNotFound)
		return
	}
	tags, ok := ifMatch(r)
	if !ok {
		// 428 (RFC 6585): an unconditional write would silently overwrite
		// whatever another client changed since this one read the order.
		writeError(w, r, errPreconditionRequired)
		return
	}
	var req updateOrderRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, r, err)
		return
	}
	d := orders.Details{Description: req.Description}
	if req.Metadata != nil {
		d.Metadata = *req.Metadata
		if d.Metadata == nil {
			d.Metadata = map[string]string{}
		}
	}
	var updated orders.Order
	err := db.WithTx(r.Context(), a.pool, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		updated, err = orders.UpdateDetails(ctx, tx, tenantFrom(ctx), id, d, func(current orders.Order) error {
			// Compared under the row lock: the state checked is the state
			// replaced.
			if !matches(tags, orderETag(current)) {
				if slices.ContainsFunc(tags, func(t string) bool { return strings.HasPrefix(t, "W/") }) {
					return errWeakTag
				}
				return errPreconditionFailed
			}
			return nil
		})
		return err
	})
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeOrder(w, r, updated)
}

// writeOrder answers 200 with the order and its ETag.
func writeOrder(w http.ResponseWriter, r *http.Request, o orders.Order) {
	res, err := encodeJSON(http.StatusOK, toOrderJSON(o), "")
	if err != nil {
		writeError(w, r, err)
		return
	}
	res.Header.Set("ETag", orderETag(o))
	writeResponse(w, res)
}
