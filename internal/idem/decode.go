package idem

import (
	"bytes"
	"encoding"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/google/uuid"
)

// ErrAmbiguousBody is wrapped by every DecodeStrict error.
var ErrAmbiguousBody = errors.New("invalid JSON body")

// MaxDepth is the deepest nesting of arrays and objects a body may have,
// the top-level object counting as depth 1 (R3). Request bodies need 2.
const MaxDepth = 32

// DecodeStrict decodes a JSON request body into v (a pointer to a struct)
// and rejects every body whose meaning is not obvious, before anything is
// claimed:
//
//   - text that is not UTF-8, or a \u escape of a lone UTF-16 surrogate
//     (encoding/json would read either as U+FFFD, so different bodies
//     would decode alike);
//   - malformed JSON, a top level that is not an object, trailing data;
//   - arrays and objects nested deeper than MaxDepth;
//   - duplicate member names, unknown members, member names that only
//     match a field case-insensitively (encoding/json would accept "Amount"
//     for "amount");
//   - the NUL character (\u0000) in any string or member name (PostgreSQL
//     stores it neither in text nor in jsonb);
//   - wrong types (including 1.0 or 1e3 for an integer field), and strings
//     that the UnmarshalText method of a field's type rejects (a bad UUID).
//
// A null member is the same as an omitted one. Errors name the member at
// fault where there is one.
func DecodeStrict(data []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.Elem().Kind() != reflect.Struct {
		panic("idem.DecodeStrict: v must be a pointer to a struct")
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return fmt.Errorf("%w: the body is empty; send a JSON object", ErrAmbiguousBody)
	}
	if err := checkText(data); err != nil {
		return fmt.Errorf("%w: %w", ErrAmbiguousBody, err)
	}

	// Pass 1 walks the tokens alongside the target type: the standard
	// decoder silently keeps the last of duplicate names, matches names
	// case-insensitively and, token by token, nests without limit, so those
	// checks happen here (F4). Pass 2 runs only on bodies that pass 1
	// walked whole.
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := checkShape(dec, rv.Elem().Type(), nil, 0); err != nil {
		return fmt.Errorf("%w: %w", ErrAmbiguousBody, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: trailing data after the JSON object", ErrAmbiguousBody)
	}

	// Pass 2 decodes for real; types are checked here.
	dec = json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return fmt.Errorf("%w: field %q must be %s, got %s", ErrAmbiguousBody, typeErr.Field, describeType(typeErr.Type), typeErr.Value)
		}
		return fmt.Errorf("%w: %w", ErrAmbiguousBody, err)
	}
	return nil
}

// checkText rejects data that is not UTF-8 (RFC 8259, section 8.1) or
// whose strings escape a lone UTF-16 surrogate (section 8.2). It is one
// pass over the bytes that tracks only whether it is inside a string;
// everything else is left to the JSON parser.
func checkText(data []byte) error {
	inString := false
	for i := 0; i < len(data); i++ {
		switch c := data[i]; {
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(data[i:])
			// size 1 tells an invalid byte from a literal U+FFFD. Surrogate
			// code points encoded as UTF-8 (CESU-8) are invalid too.
			if r == utf8.RuneError && size == 1 {
				return fmt.Errorf("the body is not valid UTF-8 (byte offset %d)", i)
			}
			i += size - 1
		case c == '"':
			inString = !inString
		case c == '\\' && inString && i+1 < len(data) && (data[i+1] == '"' || data[i+1] == '\\'):
			i++ // an escaped quote does not end the string, an escaped backslash escapes nothing
		case c == '\\' && inString:
			unit, ok := escapedUnit(data[i:])
			if !ok || !utf16.IsSurrogate(unit) {
				continue // another escape, or a malformed one for the parser to report
			}
			// A pair is a high surrogate escape directly followed by a low
			// one; DecodeRune returns U+FFFD for anything else.
			low, _ := escapedUnit(data[i+6:])
			if utf16.DecodeRune(unit, low) == utf8.RuneError {
				return fmt.Errorf("the body contains a lone UTF-16 surrogate %s (byte offset %d)", data[i:i+6], i)
			}
			i += 11 // both escapes
		}
	}
	return nil
}

// escapedUnit decodes the UTF-16 code unit of the \uXXXX escape that b
// starts with; ok is false if b does not start with one.
func escapedUnit(b []byte) (unit rune, ok bool) {
	if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
		return 0, false
	}
	var u [2]byte
	if _, err := hex.Decode(u[:], b[2:6]); err != nil {
		return 0, false
	}
	return rune(u[0])<<8 | rune(u[1]), true
}

// memberPath names a value inside the body in errors ("lines[0].sku"). Each
// level links to its parent and the text is built only when an error is
// reported: building it at every level made a deeply nested body cost
// memory quadratic in its size.
type memberPath struct {
	parent *memberPath
	member string // the member name, if index < 0
	index  int    // the array index, or -1 for an object member
}

func (p *memberPath) String() string {
	switch {
	case p == nil:
		return ""
	case p.index >= 0:
		return p.parent.String() + "[" + strconv.Itoa(p.index) + "]"
	case p.parent == nil:
		return p.member
	}
	return p.parent.String() + "." + p.member
}

// checkShape consumes one value from dec. t is the Go type it will be
// decoded into (nil for free-form values); p names it in errors; depth
// is the number of arrays and objects around it.
func checkShape(dec *json.Decoder, t reflect.Type, p *memberPath, depth int) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, err := dec.Token()
	if err != nil {
		return syntaxError(err)
	}
	if depth == 0 && tok != json.Delim('{') {
		return errors.New("the body must be a JSON object")
	}
	if s, ok := tok.(string); ok {
		return checkString(s, t, p)
	}
	if tok != json.Delim('[') && tok != json.Delim('{') {
		return nil
	}
	// Checked before reading anything inside, so the recursion, the
	// decoder's stack and pass 2 never go deeper.
	if depth == MaxDepth {
		return fmt.Errorf("the JSON nests deeper than %d levels", MaxDepth)
	}
	if tok == json.Delim('{') {
		return checkObject(dec, t, p, depth+1)
	}
	var elem reflect.Type
	if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
		elem = t.Elem()
	}
	for i := 0; dec.More(); i++ {
		if err := checkShape(dec, elem, &memberPath{parent: p, index: i}, depth+1); err != nil {
			return err
		}
	}
	_, err = dec.Token()
	return syntaxError(err)
}

// checkObject consumes the members of an object, up to and including its
// closing brace; depth counts the object itself.
func checkObject(dec *json.Decoder, t reflect.Type, p *memberPath, depth int) error {
	var fields map[string]reflect.Type
	var elem reflect.Type
	switch {
	case t != nil && t.Kind() == reflect.Struct:
		fields = jsonFields(t)
	case t != nil && t.Kind() == reflect.Map:
		elem = t.Elem()
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return syntaxError(err)
		}
		name := tok.(string)
		member := &memberPath{parent: p, member: name, index: -1}
		if strings.IndexByte(name, 0) >= 0 {
			return fmt.Errorf("member name %q must not contain the NUL character (\\u0000)", member)
		}
		if seen[name] {
			return fmt.Errorf("duplicate member %q", member)
		}
		seen[name] = true
		if fields != nil {
			ft, ok := fields[name]
			if !ok {
				return fmt.Errorf("unknown field %q", member)
			}
			elem = ft
		}
		if err := checkShape(dec, elem, member, depth); err != nil {
			return err
		}
	}
	_, err := dec.Token()
	return syntaxError(err)
}

var (
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
	jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	uuidType            = reflect.TypeFor[uuid.UUID]()
)

// checkString checks a string value that will be decoded into t (nil for
// free-form values). For a type with an UnmarshalText method it decodes
// the string into a throwaway value, because pass 2 reports that method's
// error without naming the field ("invalid UUID length: 4").
func checkString(s string, t reflect.Type, p *memberPath) error {
	if strings.IndexByte(s, 0) >= 0 {
		return fmt.Errorf("field %q must not contain the NUL character (\\u0000)", p)
	}
	if t == nil || !readsText(t) {
		return nil
	}
	err := reflect.New(t).Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(s))
	switch {
	case err == nil:
		return nil
	case t == uuidType:
		return fmt.Errorf("field %q must be a valid UUID such as \"123e4567-e89b-12d3-a456-426614174000\": %w", p, err)
	}
	return fmt.Errorf("field %q: %w", p, err)
}

// readsText reports whether encoding/json decodes a JSON string into a t
// with its UnmarshalText method: t or *t has one, and no UnmarshalJSON.
func readsText(t reflect.Type) bool {
	pt := reflect.PointerTo(t)
	return pt.Implements(textUnmarshalerType) && !pt.Implements(jsonUnmarshalerType)
}

// jsonFields maps the exact JSON names of t's exported fields to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		fields[name] = f.Type
	}
	return fields
}

func syntaxError(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("the JSON document is incomplete")
	}
	if err != nil {
		return fmt.Errorf("malformed JSON: %w", err)
	}
	return nil
}

func describeType(t reflect.Type) string {
	if readsText(t) {
		// Such a type reads JSON strings, whatever its kind: a uuid.UUID
		// is an array of bytes, and not "an array" to a client.
		return "a string"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Float32, reflect.Float64:
		return "a number"
	default:
		return t.String()
	}
}
