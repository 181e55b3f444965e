package idem

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

type strictBody struct {
	Name   string            `json:"name"`
	Amount int64             `json:"amount"`
	Tags   map[string]string `json:"tags"`
}

func TestDecodeStrictAccepts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		body string
		want strictBody
	}{
		{
			name: "GoodBody",
			body: `{"name":"widget","amount":1250,"tags":{"colour":"red","size":"L"}}`,
			want: strictBody{Name: "widget", Amount: 1250, Tags: map[string]string{"colour": "red", "size": "L"}},
		},
		{name: "Whitespace", body: " \n{ \"amount\" : -5 }\n\t", want: strictBody{Amount: -5}},
		{name: "EmptyObject", body: `{}`, want: strictBody{}},
		{name: "NullMemberEqualsOmitted", body: `{"name":null,"amount":null,"tags":null}`, want: strictBody{}},
		{name: "NullNameWithAmount", body: `{"name":null,"amount":7}`, want: strictBody{Amount: 7}},
		{name: "EscapedStrings", body: `{"name":"\u00e9\/x"}`, want: strictBody{Name: "é/x"}},
		{name: "EmptyMap", body: `{"tags":{}}`, want: strictBody{Tags: map[string]string{}}},
		{name: "MapKeysMayDifferOnlyInCase", body: `{"tags":{"k":"1","K":"2"}}`, want: strictBody{Tags: map[string]string{"k": "1", "K": "2"}}},
		{name: "LargestInt64", body: `{"amount":9223372036854775807}`, want: strictBody{Amount: 9223372036854775807}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got strictBody
			if err := DecodeStrict([]byte(tt.body), &got); err != nil {
				t.Fatalf("DecodeStrict(%q): %v", tt.body, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("DecodeStrict(%q) mismatch (-want +got):\n%s", tt.body, diff)
			}
		})
	}
}

func TestDecodeStrictRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		body string
	}{
		{name: "Empty", body: ``},
		{name: "OnlyWhitespace", body: " \r\n\t"},
		{name: "MalformedUnterminated", body: `{"name":"x"`},
		{name: "MalformedUnterminatedString", body: `{"name":"x`},
		{name: "MalformedMissingColon", body: `{"name" "x"}`},
		{name: "MalformedTrailingComma", body: `{"name":"x",}`},
		{name: "MalformedSingleQuotes", body: `{'name':'x'}`},
		{name: "MalformedBareWord", body: `{"name":x}`},
		{name: "TopLevelArray", body: `[{"name":"x"}]`},
		{name: "TopLevelString", body: `"x"`},
		{name: "TopLevelNull", body: `null`},
		{name: "TopLevelNumber", body: `5`},
		{name: "TopLevelBoolean", body: `true`},
		{name: "DuplicateMember", body: `{"name":"a","amount":1,"name":"b"}`},
		{name: "DuplicateMemberSameValue", body: `{"amount":1,"amount":1}`},
		{name: "DuplicateMemberThroughEscape", body: `{"name":"a","\u006eame":"b"}`},
		{name: "DuplicateMemberWithNull", body: `{"name":null,"name":"b"}`},
		{name: "DuplicateInsideMapMember", body: `{"tags":{"k":"1","k":"2"}}`},
		{name: "UnknownField", body: `{"name":"x","colour":"red"}`},
		{name: "UnknownFieldWithNull", body: `{"nam":null}`},
		{name: "CaseVariant", body: `{"Amount":5}`},
		{name: "CaseVariantUpper", body: `{"NAME":"x"}`},
		{name: "CaseVariantLongS", body: "{\"tag\u017f\":{}}"}, // encoding/json folds U+017F to s
		{name: "GoFieldName", body: `{"Tags":{}}`},
		{name: "AmountAsString", body: `{"amount":"5"}`},
		{name: "AmountWithFraction", body: `{"amount":1.0}`},
		{name: "AmountWithExponent", body: `{"amount":1e3}`},
		{name: "AmountFractional", body: `{"amount":1.5}`},
		{name: "AmountBoolean", body: `{"amount":true}`},
		{name: "AmountOverflow", body: `{"amount":9223372036854775808}`},
		{name: "AmountObject", body: `{"amount":{}}`},
		{name: "NameNumber", body: `{"name":5}`},
		{name: "TagsArray", body: `{"tags":["a"]}`},
		{name: "TagValueNumber", body: `{"tags":{"k":1}}`},
		{name: "TrailingDocument", body: `{} {}`},
		{name: "TrailingGarbage", body: `{}x`},
		{name: "TrailingCloser", body: `{}}`},
		{name: "TrailingComma", body: `{},`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got strictBody
			err := DecodeStrict([]byte(tt.body), &got)
			if !errors.Is(err, ErrAmbiguousBody) {
				t.Errorf("DecodeStrict(%q) = %v (decoded %+v); want an error wrapping ErrAmbiguousBody", tt.body, err, got)
			}
		})
	}
}

func TestDecodeStrictPanicsOnNonStructTarget(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		v    any
	}{
		{name: "Map", v: &map[string]any{}},
		{name: "StructValue", v: strictBody{}},
		{name: "Nil", v: nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			defer func() {
				if recover() == nil {
					t.Errorf("DecodeStrict into %T did not panic", tt.v)
				}
			}()
			_ = DecodeStrict([]byte(`{}`), tt.v)
		})
	}
}

func FuzzDecodeStrict(f *testing.F) {
	for _, seed := range []string{
		`{"name":"widget","amount":1250,"tags":{"colour":"red"}}`,
		`{"name":null,"amount":null,"tags":null}`,
		`{}`,
		``,
		`[]`,
		`null`,
		`{"name":"a","name":"b"}`,
		`{"tags":{"k":"1","k":"2"}}`,
		`{"Amount":5}`,
		`{"amount":"5"}`,
		`{"amount":1.0}`,
		`{"amount":1e3}`,
		`{} {}`,
		`{}x`,
		`{"tags":{"\u006b":"1","k":"2"}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var got strictBody
		err := DecodeStrict(data, &got)
		if err != nil {
			if !errors.Is(err, ErrAmbiguousBody) {
				t.Fatalf("DecodeStrict(%q): error %v does not wrap ErrAmbiguousBody", data, err)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("DecodeStrict accepted invalid JSON %q", data)
		}
		var want strictBody
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatalf("DecodeStrict accepted %q, encoding/json rejects it: %v", data, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("DecodeStrict(%q) differs from encoding/json (-json +strict):\n%s", data, diff)
		}
		// An accepted body has exactly one meaning, so it canonicalises.
		if _, err := Canonicalize(data); err != nil {
			t.Fatalf("DecodeStrict accepted %q, Canonicalize rejects it: %v", data, err)
		}
	})
}
