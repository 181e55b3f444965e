package idem

import (
	"errors"
	"fmt"
	"strings"
)

// HeaderName is the request header that carries the key.
const HeaderName = "Idempotency-Key"

// MaxKeyLength is the longest key accepted, in bytes (all ASCII).
const MaxKeyLength = 255

var (
	// ErrKeyMissing: the endpoint requires a key and none was sent.
	ErrKeyMissing = errors.New("the Idempotency-Key header is required on this endpoint")
	// ErrKeyInvalid: a key was sent but is not acceptable. Errors
	// returned by ParseKey wrap it with the reason.
	ErrKeyInvalid = errors.New("invalid Idempotency-Key")
)

// ParseKey extracts the key from every value of the Idempotency-Key header
// (pass r.Header.Values(HeaderName)):
//
//   - The IETF draft defines the field as a structured-field String
//     (RFC 8941): "8e03978e-40d5-43e8-bc93-6894a57f9324", with \" and \\
//     as its only escapes. Stripe's clients send the bare token instead.
//     Both are accepted; a value that starts with a double quote is parsed
//     as an sf-string, anything else as a bare token.
//   - The key itself is 1 to 255 visible ASCII characters (0x21 to 0x7E).
//     Spaces, control characters and non-ASCII bytes are rejected rather
//     than trimmed or normalised: two clients must never disagree about
//     which key they sent.
//   - Several header lines are rejected: a proxy or client that duplicated
//     or merged the header makes the key ambiguous.
func ParseKey(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", ErrKeyMissing
	case 1:
	default:
		return "", invalid("the header was sent on %d lines; send it once", len(values))
	}
	// HTTP strips optional whitespace around a field value; do the same for
	// values that reach us through other paths (tests, fuzzing).
	raw := strings.Trim(values[0], " \t")
	var key string
	if strings.HasPrefix(raw, `"`) {
		var err error
		if key, err = parseSFString(raw); err != nil {
			return "", err
		}
	} else {
		key = raw
	}
	switch {
	case key == "":
		return "", invalid("the key is empty")
	case len(key) > MaxKeyLength:
		return "", invalid("the key is %d characters long; the maximum is %d", len(key), MaxKeyLength)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return "", invalid("character %d (byte 0x%02x) is not visible ASCII", i+1, c)
		}
	}
	return key, nil
}

// parseSFString parses an RFC 8941 sf-string: DQUOTE *(unescaped / "\" (DQUOTE / "\")) DQUOTE,
// where unescaped is 0x20-0x7E other than DQUOTE and backslash. Nothing may
// follow the closing quote (parameters are not part of this field).
func parseSFString(raw string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(raw); i++ {
		c := raw[i]
		switch {
		case c == '\\':
			i++
			if i >= len(raw) || (raw[i] != '"' && raw[i] != '\\') {
				return "", invalid(`a backslash in a quoted key may only escape " or \`)
			}
			b.WriteByte(raw[i])
		case c == '"':
			if i != len(raw)-1 {
				return "", invalid("unexpected characters after the closing quote")
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", invalid("byte 0x%02x is not allowed in a quoted key", c)
		default:
			b.WriteByte(c)
		}
	}
	return "", invalid("the quoted key has no closing quote")
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrKeyInvalid, fmt.Sprintf(format, args...))
}
