// Package validation collects the semantic errors of one request, so the
// answer can list every invalid field at once (a 400 validation_failed
// problem, recorded and replayed like any deterministic outcome), and holds
// the checks that several resources share, such as money.
package validation

import (
	"fmt"
	"strings"
	"unicode"

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

// MaxAmount is the largest amount in minor units (R7): eight digits, as
// processors cap a charge (99,999,999 minor units is about a million in
// most currencies). Every sum of amounts the service keeps (an order's
// paid and refunded totals, a payment's refunds) stays far inside int64.
const MaxAmount = 99_999_999

// AmountMessage is what an amount out of range is told.
var AmountMessage = fmt.Sprintf("must be a positive integer amount in minor units, at most %d", MaxAmount)

// Amount checks an amount in minor units: positive, at most MaxAmount.
func (v *Errors) Amount(field string, amount int64) {
	if amount <= 0 || amount > MaxAmount {
		v.Add(field, AmountMessage)
	}
}

// Money checks an amount in minor units and its ISO 4217 currency code.
func (v *Errors) Money(amount int64, code string) {
	v.Amount("amount", amount)
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

// Text checks a text field for what no client means to send and what
// misleads whoever reads it later (R7): control characters (C0, DEL, C1;
// tab and line breaks too unless multiline), the bidirectional controls
// that reorder what a screen shows (U+202A-U+202E, U+2066-U+2069, U+200E,
// U+200F, U+061C), and, when required, a value of whitespace only. It
// adds at most one error for field.
func (v *Errors) Text(field, value string, multiline bool) {
	for _, r := range value {
		if multiline && (r == '\n' || r == '\t' || r == '\r') {
			continue
		}
		if unicode.IsControl(r) || isBidiControl(r) {
			v.Add(field, "must not contain control or bidirectional formatting characters")
			return
		}
	}
}

// Required checks that value has something other than whitespace.
func (v *Errors) Required(field, value string) bool {
	if strings.TrimSpace(value) == "" {
		v.Add(field, "is required")
		return false
	}
	return true
}

func isBidiControl(r rune) bool {
	switch {
	case r >= 0x202A && r <= 0x202E, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return r == 0x200E || r == 0x200F || r == 0x061C
}
