package httpapi

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

	"github.com/idemref/payments/internal/idem"
)

// MaxBodyBytes is the largest request body accepted (F4: 413 above it).
const MaxBodyBytes = 1 << 20

// bodyError is a request body rejected before any claim (F4, O3).
type bodyError struct {
	status int
	code   string
	title  string
	err    error
}

func (e *bodyError) Error() string { return e.err.Error() }
func (e *bodyError) Unwrap() error { return e.err }

// decodeBody enforces the content type and size limit, then decodes the
// body strictly into v (see idem.DecodeStrict).
func decodeBody(r *http.Request, v any) error {
	mediaType, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mediaType != "application/json" {
		return &bodyError{http.StatusUnsupportedMediaType, CodeUnsupportedMediaType, "Unsupported media type",
			errors.New("send the body as Content-Type: application/json")}
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
