package idem

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// FingerprintVersion identifies the canonicalisation and hashing below,
// and the members of each operation's body the contract excludes from it
// (F5). It is stored with every record (F3): if either changes, records
// made under the old version are treated as matching instead of turning
// honest retries into 422s. Version 2 added the exclusions (POST
// /v1/orders ignores /metadata/request_id): a record of version 1 holds
// the hash of the whole body, which the same body's retry no longer
// produces.
const FingerprintVersion = 2

// Fingerprint returns the SHA-256 of the canonical form of a request:
// the endpoint (method and route template), the path parameters and
// the decoded, validated-for-shape and defaulted body. body is the request
// value after defaults were applied, so an omitted field and its explicit
// default hash alike. Headers such as User-Agent, Date, tracing ids and
// Authorization are not inputs: they do not change what the request means.
// (A header that did, such as an API version, would be added here.)
//
// exclude are JSON Pointers (RFC 6901) to members of the body that the
// fingerprint ignores (F5): a retry may change them and still be replayed.
// The contract declares them per operation (x-idempotency in openapi.yaml);
// a member that is absent hashes as one that is present.
func Fingerprint(endpoint string, pathParams map[string]string, body any, exclude ...string) ([]byte, error) {
	if pathParams == nil {
		pathParams = map[string]string{}
	}
	if len(exclude) > 0 {
		var err error
		if body, err = without(body, exclude); err != nil {
			return nil, fmt.Errorf("fingerprint: %w", err)
		}
	}
	envelope, err := json.Marshal(struct {
		Version  int               `json:"v"`
		Endpoint string            `json:"endpoint"`
		Params   map[string]string `json:"params"`
		Body     any               `json:"body"`
	}{FingerprintVersion, endpoint, pathParams, body})
	if err != nil {
		return nil, fmt.Errorf("fingerprint: encode request: %w", err)
	}
	canonical, err := Canonicalize(envelope)
	if err != nil {
		return nil, fmt.Errorf("fingerprint: %w", err)
	}
	// Equal meaning, equal bytes, equal hash (F1); nothing else goes in (F2).
	sum := sha256.Sum256(canonical)
	return sum[:], nil
}

// ErrNotCanonicalizable is wrapped by Canonicalize's errors.
var ErrNotCanonicalizable = errors.New("JSON cannot be canonicalised")

// Canonicalize rewrites one JSON document into its canonical form, so that
// documents that mean the same thing produce the same bytes:
//
//   - object members sorted by name (byte order of their UTF-8 encoding);
//   - no insignificant whitespace;
//   - strings decoded and re-encoded with the minimal escaping (only ", \
//     and control characters), so "\u00e9" and "é" are the same;
//   - numbers in one format: an integer literal keeps its exact digits (-0
//     becomes 0); any other number is read as an IEEE-754 double and written
//     as an integer when it is one (1.0 and 1e2 become 1 and 100) or else in
//     Go's shortest round-trip form. Non-finite results are rejected.
//
// Duplicate member names and trailing data are rejected: such documents
// have no single meaning.
//
// Request bodies reach Fingerprint through a typed struct, where integer
// fields already reject 1.0 and 1e2 (see DecodeStrict); the number rules
// matter for free-form values.
func Canonicalize(data []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var out bytes.Buffer
	if err := canonicalValue(dec, &out); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotCanonicalizable, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: trailing data after the JSON document", ErrNotCanonicalizable)
	}
	return out.Bytes(), nil
}

func canonicalValue(dec *json.Decoder, out *bytes.Buffer) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch v := tok.(type) {
	case json.Delim:
		if v == '[' {
			out.WriteByte('[')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					out.WriteByte(',')
				}
				if err := canonicalValue(dec, out); err != nil {
					return err
				}
			}
			_, err := dec.Token() // ']'
			out.WriteByte(']')
			return err
		}
		return canonicalObject(dec, out)
	case string:
		writeCanonicalString(out, v)
	case json.Number:
		n, err := canonicalNumber(string(v))
		if err != nil {
			return err
		}
		out.WriteString(n)
	case bool:
		out.WriteString(strconv.FormatBool(v))
	case nil:
		out.WriteString("null")
	}
	return nil
}

func canonicalObject(dec *json.Decoder, out *bytes.Buffer) error {
	type member struct {
		name  string
		value []byte
	}
	var members []member
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		name := tok.(string) // json.Decoder guarantees a string in name position
		if seen[name] {
			return fmt.Errorf("duplicate member name %q", name)
		}
		seen[name] = true
		var value bytes.Buffer
		if err := canonicalValue(dec, &value); err != nil {
			return err
		}
		members = append(members, member{name, value.Bytes()})
	}
	if _, err := dec.Token(); err != nil { // '}'
		return err
	}
	slices.SortFunc(members, func(a, b member) int { return strings.Compare(a.name, b.name) })
	out.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			out.WriteByte(',')
		}
		writeCanonicalString(out, m.name)
		out.WriteByte(':')
		out.Write(m.value)
	}
	out.WriteByte('}')
	return nil
}

func writeCanonicalString(out *bytes.Buffer, s string) {
	const hex = "0123456789abcdef"
	out.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			out.WriteString(`\"`)
		case r == '\\':
			out.WriteString(`\\`)
		case r == '\n':
			out.WriteString(`\n`)
		case r == '\r':
			out.WriteString(`\r`)
		case r == '\t':
			out.WriteString(`\t`)
		case r < 0x20:
			out.WriteString(`\u00`)
			out.WriteByte(hex[r>>4])
			out.WriteByte(hex[r&0xf])
		default:
			// json.Decoder already replaced invalid UTF-8 with U+FFFD.
			out.WriteRune(r)
		}
	}
	out.WriteByte('"')
}

// maxExactInteger is 2^53: every integer of smaller magnitude is exact in a
// double, so converting such a float back to an integer loses nothing.
const maxExactInteger = 1 << 53

func canonicalNumber(s string) (string, error) {
	if isIntegerLiteral(s) {
		if strings.Trim(s, "-0") == "" {
			return "0", nil // -0 and 0 are the same number
		}
		return s, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return "", fmt.Errorf("number %s is out of range", s)
	}
	if f == math.Trunc(f) && math.Abs(f) < maxExactInteger {
		return strconv.FormatInt(int64(f), 10), nil
	}
	return strconv.FormatFloat(f, 'g', -1, 64), nil
}

// isIntegerLiteral reports whether a JSON number has neither a fraction nor
// an exponent. JSON forbids leading zeros and '+', so the digits are unique.
func isIntegerLiteral(s string) bool {
	return !strings.ContainsAny(s, ".eE") && utf8.ValidString(s)
}

// without returns body as a JSON value with the members at the pointers
// removed. A pointer to a member the body does not have removes nothing.
func without(body any, pointers []string) (any, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // numbers stay as written, for Canonicalize
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	for _, p := range pointers {
		tokens := strings.Split(strings.TrimPrefix(p, "/"), "/")
		parent, _ := v.(map[string]any)
		for i, tok := range tokens {
			tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
			if parent == nil {
				break
			}
			if i == len(tokens)-1 {
				delete(parent, tok)
				break
			}
			parent, _ = parent[tok].(map[string]any)
		}
	}
	return v, nil
}
