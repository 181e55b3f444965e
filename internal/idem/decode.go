package idem

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
)

// ErrAmbiguousBody is wrapped by every DecodeStrict error.
var ErrAmbiguousBody = errors.New("invalid JSON body")

// DecodeStrict decodes a JSON request body into v (a pointer to a struct)
// and rejects every body whose meaning is not obvious, before anything is
// claimed (F4): malformed JSON, a top level that is not an object, duplicate
// member names, unknown members, member names that only match a field
// case-insensitively (encoding/json would accept "Amount" for "amount"),
// wrong types (including 1.0 or 1e3 for an integer field) and trailing data.
//
// A null member is the same as an omitted one.
func DecodeStrict(data []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.Elem().Kind() != reflect.Struct {
		panic("idem.DecodeStrict: v must be a pointer to a struct")
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return fmt.Errorf("%w: the body is empty; send a JSON object", ErrAmbiguousBody)
	}

	// Pass 1 walks the tokens alongside the target type: the standard
	// decoder silently keeps the last of duplicate names and matches names
	// case-insensitively, so those checks happen here.
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := checkShape(dec, rv.Elem().Type(), ""); err != nil {
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

// checkShape consumes one value from dec. t is the Go type it will be
// decoded into (nil for free-form values); path names it in errors.
func checkShape(dec *json.Decoder, t reflect.Type, path string) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, err := dec.Token()
	if err != nil {
		return syntaxError(err)
	}
	if path == "" && tok != json.Delim('{') {
		return errors.New("the body must be a JSON object")
	}
	switch tok {
	case json.Delim('['):
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if err := checkShape(dec, elem, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		_, err := dec.Token()
		return syntaxError(err)
	case json.Delim('{'):
		return checkObject(dec, t, path)
	}
	return nil
}

func checkObject(dec *json.Decoder, t reflect.Type, path string) error {
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
		member := strings.TrimPrefix(path+"."+name, ".")
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
		if err := checkShape(dec, elem, member); err != nil {
			return err
		}
	}
	_, err := dec.Token()
	return syntaxError(err)
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
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return errors.New("the JSON document is incomplete")
	}
	if err != nil {
		return fmt.Errorf("malformed JSON: %w", err)
	}
	return nil
}

func describeType(t reflect.Type) string {
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
	}
	return t.String()
}
