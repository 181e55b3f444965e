package idem

import (
	"encoding/json"
	"errors"
	"net"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
)

type strictBody struct {
	Name    string            `json:"name"`
	Amount  int64             `json:"amount"`
	Tags    map[string]string `json:"tags"` // free-form like an order's metadata
	OrderID uuid.UUID         `json:"order_id"`
	Lines   []strictLine      `json:"lines"`
}

// strictLine puts structs in an array, and has types with an UnmarshalText
// method: uuid.UUID behind a pointer, and another one.
type strictLine struct {
	SKU    string     `json:"sku"`
	Refund *uuid.UUID `json:"refund_of"`
	IP     net.IP     `json:"ip"`
}

const testUUID = "123e4567-e89b-12d3-a456-426614174000"

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
		{name: "SurrogatePair", body: `{"name":"\ud83d\ude00"}`, want: strictBody{Name: "\U0001F600"}},
		{name: "SurrogatePairUpperCase", body: `{"name":"\uD83D\uDE00"}`, want: strictBody{Name: "\U0001F600"}},
		{name: "RawEmojiEqualsSurrogatePair", body: `{"name":"😀"}`, want: strictBody{Name: "\U0001F600"}},
		{name: "ReplacementCharacter", body: `{"name":"\ufffd�"}`, want: strictBody{Name: "\uFFFD\uFFFD"}},
		{name: "EscapedBackslashBeforeU", body: `{"name":"\\ud800\\u0000"}`, want: strictBody{Name: `\ud800\u0000`}},
		{
			name: "TextUnmarshalers",
			body: `{"order_id":"` + testUUID + `","lines":[{"sku":"a","refund_of":"` + testUUID + `","ip":"192.0.2.1"}]}`,
			want: strictBody{
				OrderID: uuid.MustParse(testUUID),
				Lines:   []strictLine{{SKU: "a", Refund: new(uuid.MustParse(testUUID)), IP: net.ParseIP("192.0.2.1")}},
			},
		},
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
		want string // the error text, where it matters
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
		{
			name: "NestedToMaxDepth", // reaches pass 2
			body: `{"tags":` + strings.Repeat("[", MaxDepth-1) + strings.Repeat("]", MaxDepth-1) + `}`,
			want: `invalid JSON body: field "tags" must be an object, got array`,
		},
		{
			name: "NestedDeeperThanMaxDepth",
			body: `{"tags":` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `}`,
			want: "invalid JSON body: the JSON nests deeper than 32 levels",
		},
		{
			name: "ObjectsNestedDeeperThanMaxDepth",
			body: `{"tags":` + strings.Repeat(`{"a":`, MaxDepth) + `1` + strings.Repeat("}", MaxDepth+1),
			want: "invalid JSON body: the JSON nests deeper than 32 levels",
		},
		{
			name: "UnclosedNesting", // once 1.9 GB of memory
			body: `{"tags":` + strings.Repeat("[", 30_000),
			want: "invalid JSON body: the JSON nests deeper than 32 levels",
		},
		{name: "NULInString", body: `{"name":"a\u0000b"}`, want: `invalid JSON body: field "name" must not contain the NUL character (\u0000)`},
		{name: "NULInMapValue", body: `{"tags":{"plan":"\u0000"}}`, want: `invalid JSON body: field "tags.plan" must not contain the NUL character (\u0000)`},
		{name: "NULInMapKey", body: `{"tags":{"pl\u0000an":"x"}}`, want: `invalid JSON body: member name "tags.pl\x00an" must not contain the NUL character (\u0000)`},
		{name: "NULInMemberName", body: `{"\u0000":1}`, want: `invalid JSON body: member name "\x00" must not contain the NUL character (\u0000)`},
		{name: "NULInArray", body: `{"lines":[{"sku":"a"},{"sku":"\u0000"}]}`, want: `invalid JSON body: field "lines[1].sku" must not contain the NUL character (\u0000)`},
		{name: "NULInUUID", body: `{"order_id":"\u0000"}`, want: `invalid JSON body: field "order_id" must not contain the NUL character (\u0000)`},
		{name: "NULRaw", body: "{\"name\":\"\x00\"}"},
		{name: "InvalidUTF8InString", body: "{\"name\":\"\xff\"}", want: "invalid JSON body: the body is not valid UTF-8 (byte offset 9)"},
		{name: "InvalidUTF8InName", body: "{\"na\xe9me\":\"x\"}", want: "invalid JSON body: the body is not valid UTF-8 (byte offset 4)"},
		{name: "InvalidUTF8OutsideStrings", body: "{\xc3}", want: "invalid JSON body: the body is not valid UTF-8 (byte offset 1)"},
		{name: "TruncatedUTF8", body: "{\"name\":\"\xf0\x9f\x98\"}", want: "invalid JSON body: the body is not valid UTF-8 (byte offset 9)"},
		{name: "OverlongUTF8", body: "{\"name\":\"\xc0\xaf\"}", want: "invalid JSON body: the body is not valid UTF-8 (byte offset 9)"},
		{name: "SurrogateAsUTF8", body: "{\"name\":\"\xed\xa0\x80\"}", want: "invalid JSON body: the body is not valid UTF-8 (byte offset 9)"},
		{name: "LoneHighSurrogate", body: `{"name":"\ud800"}`, want: `invalid JSON body: the body contains a lone UTF-16 surrogate \ud800 (byte offset 9)`},
		{name: "LoneHighSurrogateUpperCase", body: `{"name":"x\uD83D"}`, want: `invalid JSON body: the body contains a lone UTF-16 surrogate \uD83D (byte offset 10)`},
		{name: "HighSurrogateThenOtherEscape", body: `{"name":"\ud83d\u0041"}`, want: `invalid JSON body: the body contains a lone UTF-16 surrogate \ud83d (byte offset 9)`},
		{name: "HighSurrogateThenHigh", body: `{"name":"\ud83d\ud83d\ude00"}`, want: `invalid JSON body: the body contains a lone UTF-16 surrogate \ud83d (byte offset 9)`},
		{name: "LoneLowSurrogate", body: `{"name":"\ude00"}`, want: `invalid JSON body: the body contains a lone UTF-16 surrogate \ude00 (byte offset 9)`},
		{name: "SurrogatePairReversed", body: `{"name":"\ude00\ud83d"}`, want: `invalid JSON body: the body contains a lone UTF-16 surrogate \ude00 (byte offset 9)`},
		{name: "LoneSurrogateInName", body: `{"tags":{"\udfff":"x"}}`, want: `invalid JSON body: the body contains a lone UTF-16 surrogate \udfff (byte offset 10)`},
		// An escaped quote does not end a string, an escaped backslash escapes nothing.
		{name: "LoneSurrogateAfterEscapedQuote", body: `{"name":"\"","tags":{"k":"\ud800"}}`, want: `invalid JSON body: the body contains a lone UTF-16 surrogate \ud800 (byte offset 26)`},
		{name: "LoneSurrogateAfterEscapedBackslash", body: `{"name":"\\","tags":{"k":"\ud800"}}`, want: `invalid JSON body: the body contains a lone UTF-16 surrogate \ud800 (byte offset 26)`},
		{name: "BadUUID", body: `{"order_id":"1234"}`, want: `invalid JSON body: field "order_id" must be a valid UUID such as "` + testUUID + `": invalid UUID length: 4`},
		{name: "EmptyUUID", body: `{"order_id":""}`, want: `invalid JSON body: field "order_id" must be a valid UUID such as "` + testUUID + `": invalid UUID length: 0`},
		{name: "BadUUIDBehindPointer", body: `{"lines":[{"refund_of":"x"}]}`, want: `invalid JSON body: field "lines[0].refund_of" must be a valid UUID such as "` + testUUID + `": invalid UUID length: 1`},
		{name: "BadTextUnmarshaler", body: `{"lines":[{"ip":"x"}]}`, want: `invalid JSON body: field "lines[0].ip": invalid IP address: x`},
		{name: "UUIDNumber", body: `{"order_id":5}`, want: `invalid JSON body: field "order_id" must be a string, got number`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got strictBody
			err := DecodeStrict([]byte(tt.body), &got)
			if !errors.Is(err, ErrAmbiguousBody) {
				t.Fatalf("DecodeStrict(%q) = %v (decoded %+v); want an error wrapping ErrAmbiguousBody", tt.body, err, got)
			}
			if tt.want != "" && err.Error() != tt.want {
				t.Errorf("DecodeStrict(%q) = %q; want %q", tt.body, err, tt.want)
			}
		})
	}
}

// TestDecodeStrictDeepBodyCostsLittle: a body that only opens arrays is
// rejected at MaxDepth in memory that does not grow with its size, up to
// the largest body the HTTP layer reads (1 MiB). Without the limit, and
// with member paths built at every level, memory grew with the square of
// the depth; the small body goes first so that such a regression fails
// the test before the large one exhausts the machine.
func TestDecodeStrictDeepBodyCostsLittle(t *testing.T) {
	const maxBytesPerOp = 64 << 10
	const prefix = `{"tags":`
	for _, size := range []int{4 << 10, 1 << 20} {
		body := []byte(prefix + strings.Repeat("[", size-len(prefix)))
		var got strictBody
		if err := DecodeStrict(body, &got); err == nil || !strings.Contains(err.Error(), "nests deeper") {
			t.Fatalf("DecodeStrict(%d bytes of nesting) = %v; want the depth error", size, err)
		}
		r := testing.Benchmark(func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = DecodeStrict(body, &got)
			}
		})
		t.Logf("%d-byte body: %s %s", size, r, r.MemString())
		if r.AllocedBytesPerOp() > maxBytesPerOp {
			t.Fatalf("DecodeStrict(%d bytes of nesting) allocates %d bytes; want at most %d", size, r.AllocedBytesPerOp(), maxBytesPerOp)
		}
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
		`{"tags":` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `}`,
		`{"tags":` + strings.Repeat(`{"a":`, 40),
		`{"name":"a\u0000"}`,
		`{"tags":{"k\u0000":"v"}}`,
		`{"tags":{"\\u0000":""}}`, // a backslash and "u0000": no NUL (a fuzzer's find against this test's own check)
		`{"lines":[{"sku":"\u0000"}]}`,
		"{\"name\":\"\xff\"}",
		"{\"name\":\"\xed\xa0\x80\"}",
		`{"name":"\ud83d\ude00"}`,
		`{"name":"\ud800"}`,
		`{"name":"\ude00\ud83d"}`,
		`{"name":"\\ud800"}`,
		`{"name":"\"\ud800"}`,
		`{"order_id":"1234"}`,
		`{"order_id":"` + testUUID + `","lines":[{"refund_of":"` + testUUID + `","ip":"::1"}]}`,
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
		if !json.Valid(data) || !utf8.Valid(data) {
			t.Fatalf("DecodeStrict accepted invalid JSON %q", data)
		}
		var want strictBody
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatalf("DecodeStrict accepted %q, encoding/json rejects it: %v", data, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("DecodeStrict(%q) differs from encoding/json (-json +strict):\n%s", data, diff)
		}
		// A NUL is \u0000 in the re-encoding, an escape only after an even
		// number of backslashes: "\\u0000" is a backslash and "u0000".
		if out, _ := json.Marshal(got); nulEscape.Match(out) {
			t.Fatalf("DecodeStrict accepted %q, which has a NUL character", data)
		}
		// An accepted body has exactly one meaning, so it canonicalises.
		if _, err := Canonicalize(data); err != nil {
			t.Fatalf("DecodeStrict accepted %q, Canonicalize rejects it: %v", data, err)
		}
	})
}

// nulEscape finds a \u0000 escape in JSON text: one preceded by an even
// number of backslashes (none, or escaped backslashes).
var nulEscape = regexp.MustCompile(`(^|[^\\])(\\\\)*\\u0000`)

func TestNulEscape(t *testing.T) {
	for text, want := range map[string]bool{
		`"\u0000"`:   true,
		`"a\u0000"`:  true,
		`"\\\u0000"`: true, // an escaped backslash, then a NUL
		`"\\u0000"`:  false,
		`"u0000"`:    false,
	} {
		if got := nulEscape.MatchString(text); got != want {
			t.Errorf("nulEscape.MatchString(%s) = %v, want %v", text, got, want)
		}
	}
}
