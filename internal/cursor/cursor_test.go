package cursor_test

import (
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemref/payments/internal/cursor"
)

func TestDecodeReturnsWhatEncodeWrote(t *testing.T) {
	at := time.Unix(0, 1_700_000_000_123_456_789)
	id := uuid.MustParse("01890a5d-ac96-774b-bcce-b302099a8057")
	gotAt, gotID, err := cursor.Decode(cursor.Encode(at, id))
	if err != nil || !gotAt.Equal(at) || gotID != id {
		t.Fatalf("Decode(Encode(%v, %v)) = %v, %v, %v", at, id, gotAt, gotID, err)
	}
}

// A cursor carries the id as the API writes it; any other spelling of the
// id (which uuid.Parse would take) is a cursor this service did not issue.
func TestDecodeRefusesIDsInOtherForms(t *testing.T) {
	const id = "01890a5d-ac96-774b-bcce-b302099a8057"
	nanos := strconv.FormatInt(1_700_000_000_123_456_789, 10)
	encode := func(idText string) string {
		return base64.RawURLEncoding.EncodeToString([]byte(nanos + "_" + idText))
	}
	if _, _, err := cursor.Decode(encode(id)); err != nil {
		t.Fatalf("the canonical id: %v", err)
	}
	for name, form := range map[string]string{
		"UpperCase":      strings.ToUpper(id),
		"OneLetterUpper": "01890A5d-ac96-774b-bcce-b302099a8057",
		"WithoutHyphens": strings.ReplaceAll(id, "-", ""),
		"Braced":         "{" + id + "}",
		"URN":            "urn:uuid:" + id,
	} {
		t.Run(name, func(t *testing.T) {
			if _, _, err := cursor.Decode(encode(form)); !errors.Is(err, cursor.ErrInvalid) {
				t.Errorf("Decode of a cursor with the id %q: err = %v, want ErrInvalid", form, err)
			}
		})
	}
}
