package jsonstrict

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"
)

// TestDecode: the three leniencies of encoding/json refused, at any
// depth; map keys and raw values left to their owners (but for a key
// given twice, refused anywhere).
func TestDecode(t *testing.T) {
	type inner struct {
		Key string `json:"key"`
	}
	type base struct {
		ID string `json:"id"`
	}
	type req struct {
		base
		Items  []inner           `json:"items"`
		Labels map[string]string `json:"labels"`
		Nested map[string]inner  `json:"nested"`
		Raw    json.RawMessage   `json:"raw"`
		Ptr    *inner            `json:"ptr"`
		Plain  string            // no tag: its Go name
		Skip   string            `json:"-"`
	}
	for _, c := range []struct {
		body string
		want string // "" for success, else a piece of the error
	}{
		{`{"id":"a","items":[{"key":"k"}],"labels":{"A":"1","a":"2"},"raw":{"Any":1,"any":2},"ptr":{"key":"k"},"Plain":"p"}`, ""},
		{`{"nested":{"X":{"key":"k"}}}`, ""},
		{`{"ID":"a"}`, `unknown field "ID": names are case-sensitive ("id")`},
		{`{"items":[{"key":"k"},{"Key":"k"}]}`, `unknown field "Key" in "items"`},
		{`{"ptr":{"KEY":"k"}}`, `"KEY" in "ptr"`},
		{`{"nested":{"x":{"Key":"k"}}}`, `"Key" in "x"`},
		{`{"plain":"p"}`, `"plain"`},
		{`{"Skip":"s"}`, `unknown field "Skip"`},
		{`{"id":"a","id":"b"}`, `field "id" is given twice`},
		{`{"raw":{"a":1,"a":2}}`, `field "a" in "raw" is given twice`},
		{`{"labels":{"a":"1","a":"2"}}`, `given twice`},
		{`{"bogus":1}`, `unknown field "bogus"`},
		{`{"id":"a"} x`, ErrTrailing.Error()},
		{`{"id":1}`, `cannot unmarshal`},
	} {
		var r req
		err := Decode([]byte(c.body), &r)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.body, err)
		case c.want != "" && (err == nil || !bytes.Contains([]byte(err.Error()), []byte(c.want))):
			t.Errorf("%s: %v, want an error with %q", c.body, err, c.want)
		}
	}
	var ke *KeyError
	if err := Decode([]byte(`{"ID":"a"}`), &req{}); !errors.As(err, &ke) || ke.Field != "id" {
		t.Errorf("a case variant: %v, want a *KeyError naming the field", err)
	}
}

// repeatedKeyRef is repeatedKey written another way, recursively: it
// reads one value of d and reports a key repeated in one of its objects.
func repeatedKeyRef(d *json.Decoder) (string, bool) {
	tok, err := d.Token()
	if err != nil {
		return "", false
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for d.More() {
			k, _ := d.Token()
			key := k.(string)
			if seen[key] {
				return key, true
			}
			seen[key] = true
			if k, ok := repeatedKeyRef(d); ok {
				return k, true
			}
		}
		d.Token()
	case json.Delim('['):
		for d.More() {
			if k, ok := repeatedKeyRef(d); ok {
				return k, true
			}
		}
		d.Token()
	}
	return "", false
}

// FuzzRepeatedKey: Decode's check for a key given twice (at any depth)
// agrees with a recursive reading of the same JSON.
func FuzzRepeatedKey(f *testing.F) {
	f.Add([]byte(`{"size":"1GiB","size":"2GiB"}`))
	f.Add([]byte(`{"name":"t","stack":{"type":"file","params":{"path":"a","path":"b"}}}`))
	f.Add([]byte(`{"a":{"b":1,"c":[{"b":2},{"b":3,"b":4}]}}`))
	f.Add([]byte(`{"a":[{"a":1}],"a":2}`))
	f.Add([]byte(`{"a":{},"b":{},"c":{"a":1}}`))
	f.Add([]byte(`{"\u0061":1,"a":2}`))
	f.Add([]byte(`[[{"x":[]}],{"x":{"x":{"x":1}}}]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		if !json.Valid(body) {
			return // repeatedKey reads what Decode parsed
		}
		key, _, ok := repeatedKey(body)
		d := json.NewDecoder(bytes.NewReader(body))
		wantKey, want := repeatedKeyRef(d)
		if ok != want || (ok && key != wantKey) {
			t.Fatalf("body %q: repeatedKey %q %v, want %q %v", body, key, ok, wantKey, want)
		}
		if _, err := d.Token(); !want && err != io.EOF {
			t.Fatalf("body %q: the reference did not read the whole value", body)
		}
	})
}
