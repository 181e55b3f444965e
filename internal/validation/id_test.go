package validation_test

import (
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/idemref/payments/internal/validation"
)

func TestParseID(t *testing.T) {
	const canonical = "01890a5d-ac96-774b-bcce-b302099a8057"
	want := uuid.MustParse(canonical)
	for _, s := range []string{canonical, "00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff"} {
		if id, ok := validation.ParseID(s); !ok || id.String() != s {
			t.Errorf("ParseID(%q) = %v, %v; want it, true", s, id, ok)
		}
	}
	if id, _ := validation.ParseID(canonical); id != want {
		t.Errorf("ParseID(%q) = %v, want %v", canonical, id, want)
	}
	for name, s := range map[string]string{
		"UpperCase":        strings.ToUpper(canonical),
		"OneLetterUpper":   "01890A5d-ac96-774b-bcce-b302099a8057",
		"WithoutHyphens":   strings.ReplaceAll(canonical, "-", ""),
		"Braced":           "{" + canonical + "}",
		"URN":              "urn:uuid:" + canonical,
		"HyphenMoved":      "01890a5da-c96-774b-bcce-b302099a8057",
		"NotHex":           "01890a5d-ac96-774b-bcce-b302099a805g",
		"Short":            canonical[:35],
		"Long":             canonical + "0",
		"LeadingSpace":     " " + canonical[1:],
		"Empty":            "",
		"HyphensOnly":      strings.Repeat("-", 36),
		"NonASCII":         "01890a5d-ac96-774b-bcce-b302099a80é", // 36 bytes
		"PlusForAHexDigit": "+1890a5d-ac96-774b-bcce-b302099a8057",
	} {
		if id, ok := validation.ParseID(s); ok {
			t.Errorf("%s: ParseID(%q) = %v, true; want false", name, s, id)
		}
	}
}
