// Package validation collects the semantic errors of one request, so the
// answer can list every invalid field at once (a 400 validation_failed
// problem, recorded and replayed like any deterministic outcome), and holds
// the checks that several resources share, such as money.
package validation

import (
	"strings"

	"golang.org/x/text/currency"
)

// FieldError names one invalid field.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Error lists every invalid field of a request.
type Error struct{ Fields []FieldError }

func (e *Error) Error() string {
	parts := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		parts[i] = f.Field + ": " + f.Message
	}
	return "invalid request: " + strings.Join(parts, "; ")
}

// Errors accumulates field errors.
type Errors []FieldError

// Add records that field is invalid.
func (v *Errors) Add(field, message string) {
	*v = append(*v, FieldError{Field: field, Message: message})
}

// Err returns nil when nothing was added, else an *Error.
func (v Errors) Err() error {
	if len(v) == 0 {
		return nil
	}
	return &Error{Fields: v}
}

// Money checks an amount in minor units and its ISO 4217 currency code.
func (v *Errors) Money(amount int64, code string) {
	if amount <= 0 {
		v.Add("amount", "must be a positive integer amount in minor units")
	}
	if !IsCurrency(code) {
		v.Add("currency", "must be an ISO 4217 currency code in upper case, such as EUR")
	}
}

// IsCurrency reports whether code is an ISO 4217 currency code, written in
// upper case as the standard does.
func IsCurrency(code string) bool {
	if len(code) != 3 || strings.ToUpper(code) != code {
		return false
	}
	_, err := currency.ParseISO(code)
	return err == nil
}
