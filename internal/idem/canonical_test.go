package idem

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCanonicalize(t *testing.T) {
	t.Parallel()
	// Every input of a case means the same document and must produce want.
	tests := []struct {
		name   string
		inputs []string
		want   string
	}{
		{name: "MemberOrder", inputs: []string{`{"b":1,"a":2}`, `{"a":2,"b":1}`}, want: `{"a":2,"b":1}`},
		{name: "MembersSortedByUTF8Bytes", inputs: []string{`{"é":1,"z":2,"A":3,"a":4}`}, want: `{"A":3,"a":4,"z":2,"é":1}`},
		{name: "Whitespace", inputs: []string{" {\n\t\"a\" : [ 1 , 2 ] ,\r\n \"b\":{ } }\n", `{"a":[1,2],"b":{}}`}, want: `{"a":[1,2],"b":{}}`},
		{name: "UnicodeEscapeEqualsUnescaped", inputs: []string{`"\u00e9"`, `"é"`, `"\u00E9"`}, want: `"é"`},
		{name: "EscapedSolidusEqualsSolidus", inputs: []string{`"\/"`, `"/"`}, want: `"/"`},
		{name: "HTMLCharactersUnescaped", inputs: []string{`"\u003c\u003e\u0026"`, `"<>&"`}, want: `"<>&"`},
		{name: "SurrogatePairEqualsCharacter", inputs: []string{`"\ud83d\ude00"`, `"😀"`}, want: `"😀"`},
		{name: "ShortEscapesKept", inputs: []string{`"\n\r\t\"\\"`, `"\u000a\u000d\u0009\u0022\u005c"`}, want: `"\n\r\t\"\\"`},
		{name: "OtherControlCharactersAsUnicodeEscapes", inputs: []string{`"\b\f\u0001\u001F"`}, want: `"\u0008\u000c\u0001\u001f"`},
		{name: "EscapedMemberNames", inputs: []string{`{"\u0062":1,"a":2}`, `{"b":1,"\u0061":2}`}, want: `{"a":2,"b":1}`},
		{name: "InvalidUTF8BecomesReplacementCharacter", inputs: []string{"\"a\xffb\"", `"a\ufffdb"`}, want: "\"a\uFFFDb\""},
		{
			name: "NestedObjectsAndArrays",
			inputs: []string{
				`{"z":{"b":[{"y":1,"x":[true,false,null]}],"a":null},"a":"s"}`,
				`{ "a" : "s" , "z" : { "a" : null , "b" : [ { "x" : [ true , false , null ] , "y" : 1.0 } ] } }`,
			},
			want: `{"a":"s","z":{"a":null,"b":[{"x":[true,false,null],"y":1}]}}`,
		},
		{name: "ArrayOrderKept", inputs: []string{`[2,1,[4,3]]`}, want: `[2,1,[4,3]]`},
		{name: "OneInEveryNotation", inputs: []string{`1`, `1.0`, `1e0`, `10e-1`, `1E+0`, `0.1e1`, `1.000`}, want: `1`},
		{name: "IntegralFloatsAsIntegers", inputs: []string{`100`, `1e2`, `1.00e2`, `100.0`}, want: `100`},
		{name: "NegativeZeroIsZero", inputs: []string{`-0`, `0`, `-0.0`, `0e5`, `-0e-5`, `0.000`}, want: `0`},
		{name: "NegativeNumbers", inputs: []string{`-12`, `-1.2e1`, `-120e-1`}, want: `-12`},
		{name: "Fractions", inputs: []string{`0.1`, `1e-1`, `0.10`, `10e-2`}, want: `0.1`},
		{name: "LargeFloatShortestForm", inputs: []string{`1e300`, `1.0E+300`}, want: `1e+300`},
		{name: "BigIntegerKeptExact", inputs: []string{`123456789012345678901234567890`}, want: `123456789012345678901234567890`},
		{name: "NegativeBigIntegerKeptExact", inputs: []string{`-123456789012345678901234567890`}, want: `-123456789012345678901234567890`},
		{name: "IntegerAboveTwoToThe53KeptExact", inputs: []string{`9007199254740993`}, want: `9007199254740993`},
		{name: "UnderflowIsZero", inputs: []string{`1e-400`}, want: `0`},
		{name: "Literals", inputs: []string{` [ true , false , null ] `}, want: `[true,false,null]`},
		{name: "EmptyContainers", inputs: []string{`{ }`}, want: `{}`},
		{name: "EmptyArray", inputs: []string{`[ ]`}, want: `[]`},
		{name: "TopLevelString", inputs: []string{` "x" `}, want: `"x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for _, in := range tt.inputs {
				got, err := Canonicalize([]byte(in))
				if err != nil {
					t.Fatalf("Canonicalize(%q): %v", in, err)
				}
				if diff := cmp.Diff(tt.want, string(got)); diff != "" {
					t.Errorf("Canonicalize(%q) mismatch (-want +got):\n%s", in, diff)
				}
			}
		})
	}
}

func TestCanonicalizeRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		input string
	}{
		{name: "DuplicateMemberName", input: `{"a":1,"a":1}`},
		{name: "DuplicateMemberNameNested", input: `{"x":[{"a":1,"b":2,"a":3}]}`},
		{name: "DuplicateMemberNameThroughEscape", input: `{"a":1,"\u0061":2}`},
		{name: "TrailingDocument", input: `{} {}`},
		{name: "TrailingGarbage", input: `{}x`},
		{name: "TrailingNumber", input: `1 2`},
		{name: "TrailingCloser", input: `[1]]`},
		{name: "NumberOverflow", input: `1e400`},
		{name: "NegativeNumberOverflow", input: `{"a":[-1e400]}`},
		{name: "Empty", input: ``},
		{name: "OnlyWhitespace", input: " \n"},
		{name: "Unterminated", input: `{"a":1`},
		{name: "MissingValue", input: `{"a":}`},
		{name: "MissingColon", input: `{"a" 1}`},
		{name: "TrailingCommaInObject", input: `{"a":1,}`},
		{name: "TrailingCommaInArray", input: `[1,]`},
		{name: "NonStringName", input: `{1:2}`},
		{name: "NaN", input: `NaN`},
		{name: "LeadingZero", input: `01`},
		{name: "LeadingPlus", input: `+1`},
		{name: "SingleQuotes", input: `{'a':1}`},
		{name: "InvalidEscape", input: `"\x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Canonicalize([]byte(tt.input))
			if !errors.Is(err, ErrNotCanonicalizable) {
				t.Errorf("Canonicalize(%q) = %q, %v; want an error wrapping ErrNotCanonicalizable", tt.input, got, err)
			}
		})
	}
}

// orderBody and orderBodyReordered marshal to the same members in a
// different order.
type orderBody struct {
	Reference string `json:"reference"`
	Amount    string `json:"amount"`
	Currency  string `json:"currency"`
}

type orderBodyReordered struct {
	Currency  string `json:"currency"`
	Amount    string `json:"amount"`
	Reference string `json:"reference"`
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	const endpoint = "POST /v1/orders/{id}/refunds"
	params := map[string]string{"id": "ord_1"}
	body := orderBody{Reference: "r-1", Amount: "100", Currency: "EUR"}

	mustFingerprint := func(t *testing.T, endpoint string, params map[string]string, body any) []byte {
		t.Helper()
		fp, err := Fingerprint(endpoint, params, body)
		if err != nil {
			t.Fatalf("Fingerprint(%q, %v, %#v): %v", endpoint, params, body, err)
		}
		return fp
	}
	base := mustFingerprint(t, endpoint, params, body)

	t.Run("IsSHA256Size", func(t *testing.T) {
		t.Parallel()
		if len(base) != sha256.Size {
			t.Errorf("len(Fingerprint) = %d, want %d", len(base), sha256.Size)
		}
	})

	t.Run("HashesTheCanonicalEnvelope", func(t *testing.T) {
		t.Parallel()
		// The exact input of the hash, spelled out: changing it changes every
		// stored fingerprint, which needs a new FingerprintVersion (F3).
		want := sha256.Sum256([]byte(`{"body":{"amount":"100","currency":"EUR","reference":"r-1"},` +
			`"endpoint":"POST /v1/orders/{id}/refunds","params":{"id":"ord_1"},"v":2}`))
		if FingerprintVersion != 2 {
			t.Fatalf("FingerprintVersion = %d; update this test's envelope", FingerprintVersion)
		}
		if diff := cmp.Diff(want[:], base); diff != "" {
			t.Errorf("Fingerprint mismatch (-want +got):\n%s", diff)
		}
	})

	same := []struct {
		name     string
		endpoint string
		params   map[string]string
		body     any
	}{
		{name: "SameStructAgain", endpoint: endpoint, params: map[string]string{"id": "ord_1"}, body: body},
		{name: "FieldOrderIrrelevant", endpoint: endpoint, params: params, body: orderBodyReordered{Currency: "EUR", Amount: "100", Reference: "r-1"}},
		{name: "MapWithSameEntries", endpoint: endpoint, params: params, body: map[string]string{"currency": "EUR", "reference": "r-1", "amount": "100"}},
		{name: "PointerToStruct", endpoint: endpoint, params: params, body: &body},
		{name: "RawBodyWithOtherOrderAndWhitespace", endpoint: endpoint, params: params, body: json.RawMessage(" {\"currency\" : \"EUR\",\n\"amount\":\"100\", \"reference\":\"r-1\"} ")},
		{name: "RawBodyWithEscapes", endpoint: endpoint, params: params, body: json.RawMessage(`{"currency":"\u0045UR","amount":"100","reference":"r\u002d1"}`)},
	}
	for _, tt := range same {
		t.Run("Same/"+tt.name, func(t *testing.T) {
			t.Parallel()
			got := mustFingerprint(t, tt.endpoint, tt.params, tt.body)
			if !bytes.Equal(base, got) {
				t.Errorf("Fingerprint differs for an equivalent request: %x vs %x", base, got)
			}
		})
	}

	t.Run("Same/NilAndEmptyPathParams", func(t *testing.T) {
		t.Parallel()
		a := mustFingerprint(t, "POST /v1/orders", nil, body)
		b := mustFingerprint(t, "POST /v1/orders", map[string]string{}, body)
		if !bytes.Equal(a, b) {
			t.Errorf("nil and empty path parameters give different fingerprints: %x vs %x", a, b)
		}
	})

	t.Run("Same/HTMLCharactersInBody", func(t *testing.T) {
		t.Parallel()
		// json.Marshal escapes <>& in the struct; the raw body does not.
		a := mustFingerprint(t, endpoint, params, orderBody{Reference: "<a&b>", Amount: "1", Currency: "EUR"})
		b := mustFingerprint(t, endpoint, params, json.RawMessage(`{"reference":"<a&b>","amount":"1","currency":"EUR"}`))
		if !bytes.Equal(a, b) {
			t.Errorf("escaped and unescaped HTML characters give different fingerprints: %x vs %x", a, b)
		}
	})

	different := []struct {
		name     string
		endpoint string
		params   map[string]string
		body     any
	}{
		{name: "Endpoint", endpoint: "POST /v1/orders/{id}/payments", params: params, body: body},
		{name: "EndpointMethod", endpoint: "PUT /v1/orders/{id}/refunds", params: params, body: body},
		{name: "PathParamValue", endpoint: endpoint, params: map[string]string{"id": "ord_2"}, body: body},
		{name: "PathParamName", endpoint: endpoint, params: map[string]string{"order": "ord_1"}, body: body},
		{name: "ExtraPathParam", endpoint: endpoint, params: map[string]string{"id": "ord_1", "x": ""}, body: body},
		{name: "NoPathParams", endpoint: endpoint, params: nil, body: body},
		{name: "BodyReference", endpoint: endpoint, params: params, body: orderBody{Reference: "r-2", Amount: "100", Currency: "EUR"}},
		{name: "BodyAmount", endpoint: endpoint, params: params, body: orderBody{Reference: "r-1", Amount: "101", Currency: "EUR"}},
		{name: "BodyCurrency", endpoint: endpoint, params: params, body: orderBody{Reference: "r-1", Amount: "100", Currency: "USD"}},
		{name: "BodyExtraMember", endpoint: endpoint, params: params, body: map[string]string{"currency": "EUR", "reference": "r-1", "amount": "100", "note": ""}},
		{name: "BodyMissingMember", endpoint: endpoint, params: params, body: map[string]string{"currency": "EUR", "reference": "r-1"}},
		{name: "BodyNull", endpoint: endpoint, params: params, body: nil},
		{name: "BodyMovedIntoParams", endpoint: endpoint, params: map[string]string{"id": "ord_1", "reference": "r-1"}, body: map[string]string{"currency": "EUR", "amount": "100"}},
	}
	for _, tt := range different {
		t.Run("Differs/"+tt.name, func(t *testing.T) {
			t.Parallel()
			got := mustFingerprint(t, tt.endpoint, tt.params, tt.body)
			if bytes.Equal(base, got) {
				t.Errorf("Fingerprint is the same for a different request (%s)", tt.name)
			}
		})
	}

	t.Run("RejectsBodyThatCannotBeEncoded", func(t *testing.T) {
		t.Parallel()
		if fp, err := Fingerprint(endpoint, params, make(chan int)); err == nil {
			t.Errorf("Fingerprint of a channel = %x, want an error", fp)
		}
	})

	t.Run("RejectsAmbiguousRawBody", func(t *testing.T) {
		t.Parallel()
		fp, err := Fingerprint(endpoint, params, json.RawMessage(`{"a":1,"a":2}`))
		if !errors.Is(err, ErrNotCanonicalizable) {
			t.Errorf("Fingerprint of a body with a duplicate member = %x, %v; want ErrNotCanonicalizable", fp, err)
		}
	})
}

func FuzzCanonicalize(f *testing.F) {
	for _, seed := range []string{
		`{"b":1,"a":2}`,
		" {\n\t\"a\" : [ 1 , 2.50 , -0 ] }\n",
		`"\u00e9\/\u003c\ud83d\ude00"`,
		`{"z":{"b":[{"y":1e0,"x":[true,false,null]}],"a":{}},"a":"s"}`,
		`[1,1.0,1e0,10e-1,0.1e1,-0.0,1e-400]`,
		`123456789012345678901234567890`,
		`[1e300,-1.5e-7,9007199254740993,9007199254740993.0]`,
		`{"a":1,"a":2}`,
		`{"a":1,"\u0061":2}`,
		`{} {}`,
		`1e400`,
		"\"a\xffb\"",
		`{"\u0000\b\f\n\r\t\u001f\u007f\u2028":"x"}`,
		`[[[[[]]]]]`,
		`{"":null,"é":"<&>"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		out, err := Canonicalize(data)
		if err != nil {
			if !errors.Is(err, ErrNotCanonicalizable) {
				t.Fatalf("Canonicalize(%q): error %v does not wrap ErrNotCanonicalizable", data, err)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("Canonicalize accepted invalid JSON %q", data)
		}
		if !json.Valid(out) {
			t.Fatalf("Canonicalize(%q) = %q, not valid JSON", data, out)
		}
		again, err := Canonicalize(out)
		if err != nil {
			t.Fatalf("Canonicalize(%q) = %q, which is rejected: %v", data, out, err)
		}
		if !bytes.Equal(out, again) {
			t.Fatalf("Canonicalize is not idempotent: %q -> %q -> %q", data, out, again)
		}

		// The canonical form means the same as the input: numbers denote
		// the same double, or when they have none (an integer literal beyond
		// the range of a double) keep their digits.
		v := decodeUseNumber(t, data)
		sameNumber := cmp.Comparer(func(a, b json.Number) bool {
			fa, errA := strconv.ParseFloat(string(a), 64)
			fb, errB := strconv.ParseFloat(string(b), 64)
			if errA == nil && errB == nil {
				return fa == fb
			}
			return a == b
		})
		if diff := cmp.Diff(v, decodeUseNumber(t, out), sameNumber); diff != "" {
			t.Fatalf("Canonicalize(%q) = %q changed the value (-in +canonical):\n%s", data, out, diff)
		}

		// Another encoding of the same value (indented, HTML-escaped, keys
		// sorted by encoding/json) has the same canonical form.
		for name, encode := range map[string]func(any) ([]byte, error){
			"MarshalIndent": func(v any) ([]byte, error) { return json.MarshalIndent(v, " ", "\t") },
			"EncoderNoHTMLEscape": func(v any) ([]byte, error) {
				var b bytes.Buffer
				enc := json.NewEncoder(&b)
				enc.SetEscapeHTML(false)
				err := enc.Encode(v)
				return b.Bytes(), err
			},
		} {
			reencoded, err := encode(v)
			if err != nil {
				t.Fatalf("%s of %q: %v", name, data, err)
			}
			got, err := Canonicalize(reencoded)
			if err != nil {
				t.Fatalf("Canonicalize(%s %q): %v", name, reencoded, err)
			}
			if !bytes.Equal(out, got) {
				t.Fatalf("%s re-encoding canonicalises differently:\ninput     %q\ncanonical %q\nreencoded %q\nits form  %q", name, data, out, reencoded, got)
			}
		}
	})
}

func decodeUseNumber(t *testing.T, data []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %q: %v", data, err)
	}
	return v
}
