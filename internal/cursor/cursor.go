// Package cursor encodes the position in a keyset-paginated list, newest
// first: the (created_at, id) of the last row of a page. Every list of the
// API uses it, so every cursor looks and fails alike.
package cursor

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemref/payments/internal/validation"
)

// ErrInvalid: a cursor that this service did not issue.
var ErrInvalid = errors.New("invalid cursor")

// Encode returns the cursor after the row (at, id).
func Encode(at time.Time, id uuid.UUID) string {
	return base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, "%d_%s", at.UnixNano(), id))
}

// Decode returns the row a cursor points after, or ErrInvalid.
func Decode(c string) (time.Time, uuid.UUID, error) {
	raw, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, uuid.Nil, ErrInvalid
	}
	nanos, idText, ok := strings.Cut(string(raw), "_")
	// ParseInt, not fmt.Sscan: Sscan skips spaces and stops at the first
	// non-digit, so it would accept "17x" as 17.
	n, err := strconv.ParseInt(nanos, 10, 64)
	if !ok || err != nil {
		return time.Time{}, uuid.Nil, ErrInvalid
	}
	// The id as Encode wrote it: any other spelling of it was not issued
	// here.
	id, ok := validation.ParseID(idText)
	if !ok {
		return time.Time{}, uuid.Nil, ErrInvalid
	}
	return time.Unix(0, n), id, nil
}
