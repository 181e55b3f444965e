package validation_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/idemref/payments/internal/validation"
)

func TestErrors(t *testing.T) {
	t.Parallel()

	t.Run("ErrIsNilWhenNothingWasAdded", func(t *testing.T) {
		t.Parallel()
		var v validation.Errors
		if err := v.Err(); err != nil {
			t.Fatalf("Err() = %v, want nil", err)
		}
	})

	t.Run("ErrListsEveryAddedFieldInOrder", func(t *testing.T) {
		t.Parallel()
		var v validation.Errors
		v.Add("reference", "is required")
		v.Add("amount", "must be positive")
		v.Add("reference", "is too long")
		var verr *validation.Error
		if !errors.As(v.Err(), &verr) {
			t.Fatalf("Err() = %#v, want a *validation.Error", v.Err())
		}
		want := []validation.FieldError{
			{Field: "reference", Message: "is required"},
			{Field: "amount", Message: "must be positive"},
			{Field: "reference", Message: "is too long"},
		}
		if diff := cmp.Diff(want, verr.Fields); diff != "" {
			t.Errorf("fields (-want +got):\n%s", diff)
		}
	})
}

func TestMoney(t *testing.T) {
	t.Parallel()
	const (
		amountMessage   = "must be a positive integer amount in minor units, at most 99999999"
		currencyMessage = "must be an ISO 4217 currency code in upper case, such as EUR"
	)
	tests := []struct {
		name     string
		amount   int64
		currency string
		want     []validation.FieldError
	}{
		{name: "ValidAmountAndCurrency", amount: 1, currency: "EUR"},
		{name: "AmountAtTheCeiling", amount: validation.MaxAmount, currency: "JPY"},
		{name: "AmountOverTheCeiling", amount: validation.MaxAmount + 1, currency: "JPY", want: []validation.FieldError{{Field: "amount", Message: amountMessage}}},
		{name: "AmountAtInt64Max", amount: 1<<63 - 1, currency: "JPY", want: []validation.FieldError{{Field: "amount", Message: amountMessage}}},
		{name: "ZeroAmount", amount: 0, currency: "EUR", want: []validation.FieldError{{Field: "amount", Message: amountMessage}}},
		{name: "NegativeAmount", amount: -100, currency: "EUR", want: []validation.FieldError{{Field: "amount", Message: amountMessage}}},
		{name: "UnknownCurrency", amount: 100, currency: "XXZ", want: []validation.FieldError{{Field: "currency", Message: currencyMessage}}},
		{name: "BothInvalidListsBoth", amount: 0, currency: "eur", want: []validation.FieldError{
			{Field: "amount", Message: amountMessage},
			{Field: "currency", Message: currencyMessage},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var v validation.Errors
			v.Money(tt.amount, tt.currency)
			if diff := cmp.Diff(tt.want, []validation.FieldError(v)); diff != "" {
				t.Errorf("Money(%d, %q) field errors (-want +got):\n%s", tt.amount, tt.currency, diff)
			}
		})
	}
}

func TestIsCurrency(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		code string
		want bool
	}{
		{name: "Euro", code: "EUR", want: true},
		{name: "USDollar", code: "USD", want: true},
		{name: "YenWithoutMinorUnits", code: "JPY", want: true},
		{name: "LowerCase", code: "eur"},
		{name: "MixedCase", code: "Eur"},
		{name: "WellFormedButUnknown", code: "XXZ"},
		{name: "TooShort", code: "EU"},
		{name: "TooLong", code: "EURO"},
		{name: "Empty", code: ""},
		{name: "Digits", code: "978"},
		{name: "SurroundingSpace", code: " EUR"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := validation.IsCurrency(tt.code); got != tt.want {
				t.Errorf("IsCurrency(%q) = %v, want %v", tt.code, got, tt.want)
			}
		})
	}
}

func TestErrorMessage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		fields []validation.FieldError
		want   string
	}{
		{
			name:   "OneField",
			fields: []validation.FieldError{{Field: "amount", Message: "must be positive"}},
			want:   "invalid request: amount: must be positive",
		},
		{
			name: "SeveralFieldsJoinedBySemicolons",
			fields: []validation.FieldError{
				{Field: "reference", Message: "is required"},
				{Field: "currency", Message: "must be an ISO 4217 currency code"},
			},
			want: "invalid request: reference: is required; currency: must be an ISO 4217 currency code",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := &validation.Error{Fields: tt.fields}
			if diff := cmp.Diff(tt.want, err.Error()); diff != "" {
				t.Errorf("Error() (-want +got):\n%s", diff)
			}
		})
	}
}
