// Package jsonstrict decodes JSON that must mean exactly one thing: the
// API's request bodies, and the stacks and layer parameters of new volume
// types (block.CheckNew; saved ones are read as they were accepted, see
// block.DecodeStrict). encoding/json is lenient in three ways that let a
// body say something other than it seems to: it ignores unknown keys
// (DisallowUnknownFields helps), it keeps the last of a key given twice
// ({"size":"1GiB","size":"1EiB"} is 1 EiB), and it matches a key to a field
// whatever its case ({"size":"1GiB","Size":"1EiB"} is 1 EiB too). Decode
// refuses all three, and anything after the value.
//
// Keys are checked against the Go type being filled: a struct's keys must
// be its fields' JSON names, case included, at any depth; a map's keys
// are data (only a repeated one is refused); a json.Unmarshaler (such as
// json.RawMessage) judges its own content, except for repeated keys,
// which are refused anywhere in the document.
package jsonstrict

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"strings"
)

// ErrTrailing: something follows the JSON value.
var ErrTrailing = errors.New("unexpected data after the JSON value")

// KeyError is a key Decode refuses after encoding/json accepted it.
type KeyError struct {
	Key string
	// Field is the field's real name when Key differs from it in case
	// only; "" for a key given twice.
	Field string
	// In is the key of the object holding Key ("" at the top).
	In string
}

func (e *KeyError) Error() string {
	at := ""
	if e.In != "" {
		at = fmt.Sprintf(" in %q", e.In)
	}
	if e.Field == "" {
		return fmt.Sprintf("field %q%s is given twice", e.Key, at)
	}
	return fmt.Sprintf("unknown field %q%s: names are case-sensitive (%q)", e.Key, at, e.Field)
}

// Decode decodes exactly one JSON value from data into v (a pointer), or
// fails: with encoding/json's own errors (syntax, types, unknown fields),
// a *KeyError, or ErrTrailing.
func Decode(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if _, err := d.Token(); err != io.EOF {
		return ErrTrailing
	}
	if k, in, ok := repeatedKey(data); ok {
		return &KeyError{Key: k, In: in}
	}
	var tree any
	if err := json.Unmarshal(data, &tree); err != nil {
		return err
	}
	return exactKeys(tree, reflect.TypeOf(v), "")
}

// repeatedKey finds a key given twice in one object of data, at any
// depth, and the key of the object holding it. data is valid JSON.
func repeatedKey(data []byte) (key, in string, found bool) {
	type level struct {
		keys map[string]bool // nil: an array
		key  bool            // an object that expects a key next
		name string          // the key this object or array is the value of
	}
	var stack []level
	last := "" // the last key read
	d := json.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := d.Token()
		if err != nil {
			return "", "", false
		}
		top := len(stack) - 1
		if s, ok := tok.(string); ok && top >= 0 && stack[top].key {
			if stack[top].keys[s] {
				return s, stack[top].name, true
			}
			stack[top].keys[s], stack[top].key = true, false
			last = s
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, level{keys: map[string]bool{}, key: true, name: last})
			continue
		case json.Delim('['):
			stack = append(stack, level{name: last})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:top]
		}
		// A value ended: the object holding it expects a key next.
		if n := len(stack) - 1; n >= 0 && stack[n].keys != nil {
			stack[n].key = true
		}
		if len(stack) == 0 {
			return "", "", false
		}
	}
}

var unmarshaler = reflect.TypeFor[json.Unmarshaler]()

// exactKeys checks that every key of tree (a decoded JSON value) that
// fills a field of a struct of type t, at any depth, is the field's JSON
// name, case included. in is the key tree is the value of.
func exactKeys(tree any, t reflect.Type, in string) error {
	for t.Kind() == reflect.Pointer {
		if t.Implements(unmarshaler) {
			return nil
		}
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshaler) {
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := tree.(map[string]any)
		if !ok {
			return nil // a type error, which the decoder reported
		}
		fields := fieldTypes(t)
		for k, val := range obj {
			ft, ok := fields[k]
			if !ok {
				for name := range fields {
					if strings.EqualFold(name, k) {
						return &KeyError{Key: k, Field: name, In: in}
					}
				}
				return fmt.Errorf("json: unknown field %q", k) // not reached: the decoder refused it
			}
			if err := exactKeys(val, ft, k); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		if arr, ok := tree.([]any); ok {
			for _, e := range arr {
				if err := exactKeys(e, t.Elem(), in); err != nil {
					return err
				}
			}
		}
	case reflect.Map:
		if obj, ok := tree.(map[string]any); ok {
			for k, e := range obj {
				if err := exactKeys(e, t.Elem(), k); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// fieldTypes maps the JSON names of struct type t's fields (those of
// embedded structs included, as encoding/json promotes them unless an
// outer field has the name) to their types.
func fieldTypes(t reflect.Type) map[string]reflect.Type {
	out, promoted := map[string]reflect.Type{}, map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || !f.IsExported() && !f.Anonymous {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		et := f.Type
		if et.Kind() == reflect.Pointer {
			et = et.Elem()
		}
		if f.Anonymous && name == "" && et.Kind() == reflect.Struct {
			maps.Copy(promoted, fieldTypes(et))
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	for k, v := range promoted {
		if _, ok := out[k]; !ok {
			out[k] = v
		}
	}
	return out
}
