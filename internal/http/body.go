package httpapi

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/idemref/payments/internal/idem"
)

// MaxBodyBytes is the largest request body accepted (F4: 413 above it).
const MaxBodyBytes = 1 << 20

// bodyError is a request body rejected before any claim.
type bodyError struct {
	status int
	code   string
	title  string
	err    error
}

func (e *bodyError) Error() string { return e.err.Error() }
func (e *bodyError) Unwrap() error { return e.err }

func unsupported(detail string) error {
	return &bodyError{http.StatusUnsupportedMediaType, CodeUnsupportedMediaType, "Unsupported media type", errors.New(detail)}
}

// decodeBody enforces the content type and size limit, then decodes the
// body strictly into v (see idem.DecodeStrict).
func decodeBody(r *http.Request, v any) error {
	mediaType, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mediaType != "application/json" {
		return unsupported("send the body as Content-Type: application/json")
	}
	// JSON is UTF-8 (RFC 8259): a body declared in another charset would be
	// read as something it is not.
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return unsupported("the body must be UTF-8; send Content-Type: application/json without a charset or with charset=utf-8")
	}
	// A compressed body would be decoded as garbage, or worse, as another
	// request; this API accepts identity only.
	for _, enc := range r.Header.Values("Content-Encoding") {
		for part := range strings.SplitSeq(enc, ",") {
			if p := strings.TrimSpace(part); p != "" && !strings.EqualFold(p, "identity") {
				return unsupported("Content-Encoding " + p + " is not supported; send the body uncompressed")
			}
		}
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		return &bodyError{http.StatusBadRequest, CodeInvalidJSON, "Invalid JSON body",
			fmt.Errorf("read body: %w", err)}
	}
	if len(data) > MaxBodyBytes {
		return &bodyError{http.StatusRequestEntityTooLarge, CodeBodyTooLarge, "Body too large",
			fmt.Errorf("the body exceeds %d bytes", MaxBodyBytes)}
	}
	if err := idem.DecodeStrict(data, v); err != nil {
		return &bodyError{http.StatusBadRequest, CodeInvalidJSON, "Invalid JSON body", err}
	}
	return nil
}
