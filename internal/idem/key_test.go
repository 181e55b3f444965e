package idem

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	const uuidKey = "8e03978e-40d5-43e8-bc93-6894a57f9324"
	long255 := strings.Repeat("k", MaxKeyLength)
	long256 := strings.Repeat("k", MaxKeyLength+1)

	tests := []struct {
		name    string
		values  []string
		want    string
		wantErr error // nil when the key must be accepted
	}{
		{name: "BareUUID", values: []string{uuidKey}, want: uuidKey},
		{name: "QuotedUUIDEqualsBareForm", values: []string{`"` + uuidKey + `"`}, want: uuidKey},
		{name: "QuotedEscapedQuote", values: []string{`"a\"b"`}, want: `a"b`},
		{name: "QuotedEscapedBackslash", values: []string{`"a\\b"`}, want: `a\b`},
		{name: "BareKeyMayContainQuoteAndBackslash", values: []string{`a"b\c`}, want: `a"b\c`},
		{name: "SurroundingSpacesTrimmed", values: []string{"  " + uuidKey + "  "}, want: uuidKey},
		{name: "SurroundingTabsTrimmed", values: []string{"\t" + uuidKey + "\t"}, want: uuidKey},
		{name: "SurroundingWhitespaceAroundQuotedTrimmed", values: []string{" \t\"" + uuidKey + "\"\t "}, want: uuidKey},
		{name: "SingleCharacter", values: []string{"!"}, want: "!"},
		{name: "AllVisibleASCII", values: []string{visibleASCII()}, want: visibleASCII()},
		{name: "255CharactersBare", values: []string{long255}, want: long255},
		{name: "255CharactersQuoted", values: []string{`"` + long255 + `"`}, want: long255},
		{name: "255CharactersQuotedWithEscapes", values: []string{`"` + strings.Repeat(`\"`, MaxKeyLength) + `"`}, want: strings.Repeat(`"`, MaxKeyLength)},

		{name: "MissingNilValues", values: nil, wantErr: ErrKeyMissing},
		{name: "MissingEmptyValues", values: []string{}, wantErr: ErrKeyMissing},
		{name: "TwoHeaderLines", values: []string{uuidKey, uuidKey}, wantErr: ErrKeyInvalid},
		{name: "TwoDifferentHeaderLines", values: []string{"a", "b"}, wantErr: ErrKeyInvalid},
		{name: "Empty", values: []string{""}, wantErr: ErrKeyInvalid},
		{name: "OnlyWhitespace", values: []string{" \t "}, wantErr: ErrKeyInvalid},
		{name: "EmptyQuoted", values: []string{`""`}, wantErr: ErrKeyInvalid},
		{name: "256CharactersBare", values: []string{long256}, wantErr: ErrKeyInvalid},
		{name: "256CharactersQuoted", values: []string{`"` + long256 + `"`}, wantErr: ErrKeyInvalid},
		{name: "SpaceInsideBare", values: []string{"abc def"}, wantErr: ErrKeyInvalid},
		{name: "SpaceInsideQuoted", values: []string{`"abc def"`}, wantErr: ErrKeyInvalid},
		{name: "SpaceOnlyQuoted", values: []string{`" "`}, wantErr: ErrKeyInvalid},
		{name: "TabInside", values: []string{"abc\tdef"}, wantErr: ErrKeyInvalid},
		{name: "NewlineInside", values: []string{"abc\ndef"}, wantErr: ErrKeyInvalid},
		{name: "CarriageReturnLineFeedInjection", values: []string{"abc\r\nX-Evil: 1"}, wantErr: ErrKeyInvalid},
		{name: "NULInside", values: []string{"abc\x00def"}, wantErr: ErrKeyInvalid},
		{name: "ControlCharacterQuoted", values: []string{"\"abc\x01def\""}, wantErr: ErrKeyInvalid},
		{name: "DEL", values: []string{"abc\x7fdef"}, wantErr: ErrKeyInvalid},
		{name: "DELQuoted", values: []string{"\"abc\x7fdef\""}, wantErr: ErrKeyInvalid},
		{name: "NonASCIIUTF8", values: []string{"clé"}, wantErr: ErrKeyInvalid},
		{name: "NonASCIIUTF8Quoted", values: []string{`"clé"`}, wantErr: ErrKeyInvalid},
		{name: "InvalidUTF8", values: []string{"abc\xffdef"}, wantErr: ErrKeyInvalid},
		{name: "UnterminatedQuote", values: []string{`"abc`}, wantErr: ErrKeyInvalid},
		{name: "LoneQuote", values: []string{`"`}, wantErr: ErrKeyInvalid},
		{name: "EscapedClosingQuoteLeavesItUnterminated", values: []string{`"abc\"`}, wantErr: ErrKeyInvalid},
		{name: "TrailingBackslash", values: []string{`"abc\`}, wantErr: ErrKeyInvalid},
		{name: "CharactersAfterClosingQuote", values: []string{`"abc"def`}, wantErr: ErrKeyInvalid},
		{name: "ParameterAfterClosingQuote", values: []string{`"abc";a=1`}, wantErr: ErrKeyInvalid},
		{name: "SecondQuotedString", values: []string{`"abc""def"`}, wantErr: ErrKeyInvalid},
		{name: "BadEscape", values: []string{`"a\ab"`}, wantErr: ErrKeyInvalid},
		{name: "BadEscapeN", values: []string{`"a\nb"`}, wantErr: ErrKeyInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseKey(tt.values)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("ParseKey(%q) = %q, %v; want error wrapping %v", tt.values, got, err, tt.wantErr)
				}
				if got != "" {
					t.Errorf("ParseKey(%q) returned key %q together with an error", tt.values, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseKey(%q): unexpected error %v", tt.values, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseKey(%q) mismatch (-want +got):\n%s", tt.values, diff)
			}
		})
	}
}

// TestParseKeyErrorsAreDistinct makes sure the two sentinels do not wrap
// each other: a missing key and an invalid one are different problems.
func TestParseKeyErrorsAreDistinct(t *testing.T) {
	t.Parallel()
	if _, err := ParseKey(nil); errors.Is(err, ErrKeyInvalid) {
		t.Errorf("missing key: error %v also wraps ErrKeyInvalid", err)
	}
	if _, err := ParseKey([]string{""}); errors.Is(err, ErrKeyMissing) {
		t.Errorf("empty key: error %v also wraps ErrKeyMissing", err)
	}
}

func visibleASCII() string {
	var b strings.Builder
	for c := byte(0x21); c <= 0x7e; c++ {
		b.WriteByte(c)
	}
	return b.String()
}

func FuzzParseKey(f *testing.F) {
	for _, seed := range []string{
		"8e03978e-40d5-43e8-bc93-6894a57f9324",
		`"8e03978e-40d5-43e8-bc93-6894a57f9324"`,
		`"a\"b\\c"`,
		` "x" `,
		"\tkey\t",
		`""`,
		`"`,
		`"abc`,
		`"abc"x`,
		`"a\ab"`,
		"a b",
		"a\x7f",
		"é",
		strings.Repeat("k", MaxKeyLength),
		strings.Repeat("k", MaxKeyLength+1),
	} {
		f.Add(seed, "", false)
	}
	f.Add("a", "b", true)

	f.Fuzz(func(t *testing.T, value, second string, twoLines bool) {
		values := []string{value}
		if twoLines {
			values = append(values, second)
		}
		key, err := ParseKey(values)
		if err != nil {
			if !errors.Is(err, ErrKeyInvalid) {
				t.Fatalf("ParseKey(%q): error %v does not wrap ErrKeyInvalid", values, err)
			}
			if key != "" {
				t.Fatalf("ParseKey(%q) returned key %q with an error", values, key)
			}
			return
		}
		if twoLines {
			t.Fatalf("ParseKey(%q) accepted two header lines", values)
		}
		if len(key) < 1 || len(key) > MaxKeyLength {
			t.Fatalf("ParseKey(%q) accepted a key of %d bytes", values, len(key))
		}
		for i := 0; i < len(key); i++ {
			if c := key[i]; c < 0x21 || c > 0x7e {
				t.Fatalf("ParseKey(%q) accepted key %q with byte 0x%02x at %d", values, key, c, i)
			}
		}
		// The sf-string form of a bare key is the same key.
		if !strings.HasPrefix(strings.TrimLeft(value, " \t"), `"`) && !strings.ContainsAny(key, `"\`) {
			quoted, err := ParseKey([]string{`"` + key + `"`})
			if err != nil {
				t.Fatalf("bare key %q accepted but its quoted form is rejected: %v", key, err)
			}
			if quoted != key {
				t.Fatalf("bare key %q: quoted form parses to %q", key, quoted)
			}
		}
		// Parsing is stable: the accepted key, sent bare, is accepted as itself.
		if !strings.HasPrefix(key, `"`) {
			again, err := ParseKey([]string{key})
			if err != nil || again != key {
				t.Fatalf("key %q re-parsed as %q, %v", key, again, err)
			}
		}
	})
}
