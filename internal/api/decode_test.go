package api

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/size"
)

// The codes a request parser may answer with. Every parser error must be a
// client error (KindInvalid → 400) with one of these codes, never an
// internal error or a bare error that the API would turn into a 500.
var parserCodes = map[string]bool{
	errs.CodeMalformedJSON:  true,
	errs.CodeInvalidSize:    true,
	errs.CodeInvalidName:    true,
	errs.CodeInvalidRequest: true,
	errs.CodeInvalidStack:   true,
}

func checkParseError(t *testing.T, body []byte, err error) *errs.Error {
	t.Helper()
	var e *errs.Error
	if !errors.As(err, &e) {
		t.Fatalf("body %q: error %T %v is not an *errs.Error", body, err, err)
	}
	if e.Kind != errs.KindInvalid {
		t.Fatalf("body %q: error kind %d, want KindInvalid (%v)", body, e.Kind, e)
	}
	if !parserCodes[e.Code] {
		t.Fatalf("body %q: unexpected error code %q (%v)", body, e.Code, e)
	}
	if e.Message == "" {
		t.Fatalf("body %q: error %q has an empty message", body, e.Code)
	}
	return e
}

// wantCode asserts that err is a parser error with the given code.
func wantCode(t *testing.T, body string, err error, code string) {
	t.Helper()
	if err == nil {
		t.Fatalf("body %q: no error, want %s", body, code)
	}
	e := checkParseError(t, []byte(body), err)
	if e.Code != code {
		t.Fatalf("body %q: code %s (%s), want %s", body, e.Code, e.Message, code)
	}
}

func TestParseCreateVolume(t *testing.T) {
	good := []struct {
		body string
		want int64
		src  string
	}{
		{`{"size":"10GiB"}`, 10 << 30, ""},
		{`{"size":"10G"}`, 10 << 30, ""},
		{`{"size":1073741824}`, 1 << 30, ""},
		{`{"size":"1073741824"}`, 1 << 30, ""},
		{` {"size" : 4096 } `, 4096, ""},
		{"{\"size\":4096}\n", 4096, ""},
		{`{"size":"1.5GiB"}`, 3 << 29, ""},
		{`{"size":1152921504606846976}`, size.Max, ""},
		{`{"size":"1024PiB"}`, size.Max, ""},
		{`{"from_snapshot":"snap-0123456789abcdef"}`, 0, "snap-0123456789abcdef"},
		{`{"from_snapshot":"base","size":"20G"}`, 20 << 30, "base"},
	}
	for _, c := range good {
		r, err := ParseCreateVolume([]byte(c.body))
		if err != nil {
			t.Errorf("%s: %v", c.body, err)
			continue
		}
		if r.SizeBytes != c.want || r.FromSnapshot != c.src {
			t.Errorf("%s: got size %d from %q, want %d from %q", c.body, r.SizeBytes, r.FromSnapshot, c.want, c.src)
		}
	}

	r, err := ParseCreateVolume([]byte(`{"size":"512MiB","name":"data","type":"standard","multiattach":true,"client_token":"t-1"}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Name != "data" || r.Type != "standard" || !r.Multiattach || r.ClientToken != "t-1" || r.SizeBytes != 512<<20 {
		t.Fatalf("fields not carried over: %+v", r)
	}

	bad := []struct{ body, code string }{
		{``, errs.CodeMalformedJSON},
		{`   `, errs.CodeMalformedJSON},
		{"\n\t", errs.CodeMalformedJSON},
		{`{"size":"10GiB","bogus":1}`, errs.CodeMalformedJSON},    // unknown field
		{`{"size":"1GiB","Size":"2GiB"}`, errs.CodeMalformedJSON}, // given twice, in two cases
		{`{"SIZE":"1GiB"}`, errs.CodeMalformedJSON},               // names are case-sensitive
		{`{"size":"1GiB","Client_Token":"t"}`, errs.CodeMalformedJSON},
		{`{"size":"10GiB"} {"size":"1GiB"}`, errs.CodeMalformedJSON}, // a second object
		{`{"size":"10GiB"}x`, errs.CodeMalformedJSON},                // trailing garbage
		{`{"size":"10GiB"}]`, errs.CodeMalformedJSON},
		{`{"size":"10GiB"`, errs.CodeMalformedJSON}, // truncated
		{`{"size":`, errs.CodeMalformedJSON},
		{`{size:1}`, errs.CodeMalformedJSON},
		{`[]`, errs.CodeMalformedJSON},
		{`"10GiB"`, errs.CodeMalformedJSON},
		{`{"name":1,"size":"1GiB"}`, errs.CodeMalformedJSON}, // wrong type
		{`{"size":"1GiB","multiattach":"yes"}`, errs.CodeMalformedJSON},
		{`{}`, errs.CodeInvalidSize},     // neither size nor source
		{`null`, errs.CodeMalformedJSON}, // not an object (TestBodyNotAnObject)
		{`{"size":0}`, errs.CodeInvalidSize},
		{`{"size":"0"}`, errs.CodeInvalidSize},
		{`{"size":"0GiB"}`, errs.CodeInvalidSize},
		{`{"size":-1}`, errs.CodeInvalidSize},
		{`{"size":-0}`, errs.CodeInvalidSize},
		{`{"size":"-1GiB"}`, errs.CodeInvalidSize},
		{`{"size":1.5}`, errs.CodeInvalidSize},
		{`{"size":1e-3}`, errs.CodeInvalidSize},
		{`{"size":1.5e0}`, errs.CodeInvalidSize},
		{`{"size":"0.3B"}`, errs.CodeInvalidSize},
		{`{"size":""}`, errs.CodeInvalidSize},
		{`{"size":"lots"}`, errs.CodeInvalidSize},
		{`{"size":"10XB"}`, errs.CodeInvalidSize},
		{`{"size":1152921504606846977}`, errs.CodeInvalidSize}, // size.Max + 1
		{`{"size":9223372036854775807}`, errs.CodeInvalidSize},
		{`{"size":99999999999999999999999}`, errs.CodeInvalidSize},
		{`{"size":"2EiB"}`, errs.CodeInvalidSize},
		{`{"size":"1025PiB"}`, errs.CodeInvalidSize},
		{`{"size":"99999999999999999999999"}`, errs.CodeInvalidSize},
		{`{"size":true}`, errs.CodeInvalidSize},
		{`{"size":null}`, errs.CodeInvalidSize},
	}
	for _, c := range bad {
		_, err := ParseCreateVolume([]byte(c.body))
		wantCode(t, c.body, err, c.code)
	}
}

func TestParseCreateVolumeMessages(t *testing.T) {
	// Messages name the problem so that a CLI user can fix the request.
	cases := []struct{ body, want string }{
		{``, "empty"},
		{`{"bogus":1}`, "bogus"},
		{`{"size":"1GiB"}{}`, "after the object"},
		{`{"size":"1GiB"`, "unexpected end"},
		{`{"name":1,"size":"1GiB"}`, "name"},
		{`{"size":1152921504606846977}`, "maximum"},
		{`{"size":"1GiB","Size":"2GiB"}`, `"Size": names are case-sensitive ("size")`},
	}
	for _, c := range cases {
		_, err := ParseCreateVolume([]byte(c.body))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v does not mention %q", c.body, err, c.want)
		}
	}
}

func TestParseExtendVolume(t *testing.T) {
	for body, want := range map[string]int64{
		`{"size":"20GiB"}`:             20 << 30,
		`{"size":2147483648}`:          2 << 30,
		`{"size":"2147483648"}`:        2 << 30,
		`{"size":1152921504606846976}`: size.Max,
		"  {\"size\":\"1T\"}\r\n\t   ": 1 << 40,
	} {
		n, err := ParseExtendVolume([]byte(body))
		if err != nil || n != want {
			t.Errorf("%s: got %d, %v; want %d", body, n, err, want)
		}
	}
	for body, code := range map[string]string{
		``:                               errs.CodeMalformedJSON,
		`{"size":"1GiB","name":"x"}`:     errs.CodeMalformedJSON,
		`{"size":"1GiB"}{"size":"2GiB"}`: errs.CodeMalformedJSON,
		`{"size":"1GiB"} 1`:              errs.CodeMalformedJSON,
		`{}`:                             errs.CodeInvalidSize,
		`{"size":0}`:                     errs.CodeInvalidSize,
		`{"size":-4096}`:                 errs.CodeInvalidSize,
		`{"size":1.5}`:                   errs.CodeInvalidSize,
		`{"size":"1.5B"}`:                errs.CodeInvalidSize,
		`{"size":1152921504606846977}`:   errs.CodeInvalidSize,
		`{"size":"8EiB"}`:                errs.CodeInvalidSize,
	} {
		_, err := ParseExtendVolume([]byte(body))
		wantCode(t, body, err, code)
	}
}

func TestParseCreateSnapshot(t *testing.T) {
	r, err := ParseCreateSnapshot([]byte(`{"volume":"vol-0123456789abcdef","name":"nightly","client_token":"tok"}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Volume != "vol-0123456789abcdef" || r.Name != "nightly" || r.ClientToken != "tok" {
		t.Fatalf("fields not carried over: %+v", r)
	}
	for body, code := range map[string]string{
		``:                                errs.CodeMalformedJSON,
		`{"volume":"v","size":"1GiB"}`:    errs.CodeMalformedJSON, // no size on a snapshot
		`{"volume":"v"}{}`:                errs.CodeMalformedJSON,
		`{"volume":1}`:                    errs.CodeMalformedJSON,
		`{"volume":"v","name":["x"]}`:     errs.CodeMalformedJSON,
		`{}`:                              errs.CodeInvalidRequest,
		`{"volume":""}`:                   errs.CodeInvalidRequest,
		`{"name":"nightly"}`:              errs.CodeInvalidRequest,
		`null`:                            errs.CodeMalformedJSON,
		`{"volume":"v","client_token":2}`: errs.CodeMalformedJSON,
	} {
		_, err := ParseCreateSnapshot([]byte(body))
		wantCode(t, body, err, code)
	}
}

func TestParseCreateUser(t *testing.T) {
	r, err := ParseCreateUser([]byte(`{"name":"alice","uid":1000,"gid":100,"admin":true}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Name != "alice" || r.UID == nil || *r.UID != 1000 || r.GID == nil || *r.GID != 100 || !r.Admin {
		t.Fatalf("fields not carried over: %+v", r)
	}
	r, err = ParseCreateUser([]byte(`{"name":"bob"}`))
	if err != nil || r.UID != nil || r.GID != nil || r.Admin {
		t.Fatalf("optional fields: %+v, %v", r, err)
	}
	for body, code := range map[string]string{
		``:                            errs.CodeMalformedJSON,
		`{"name":"bob","password":1}`: errs.CodeMalformedJSON,
		`{"name":"bob"} trailing`:     errs.CodeMalformedJSON,
		`{"name":"bob","uid":"1000"}`: errs.CodeMalformedJSON,
		`{"name":"bob","uid":1.5}`:    errs.CodeMalformedJSON,
		`{"name":"bob","uid":1e40}`:   errs.CodeMalformedJSON,
		`{"name":"bob","admin":1}`:    errs.CodeMalformedJSON,
		`{}`:                          errs.CodeInvalidName,
		`{"name":""}`:                 errs.CodeInvalidName,
		`{"uid":1}`:                   errs.CodeInvalidName,
	} {
		_, err := ParseCreateUser([]byte(body))
		wantCode(t, body, err, code)
	}
}

func TestSizeUnmarshalJSON(t *testing.T) {
	good := map[string]int64{
		`1`:                   1,
		`4096`:                4096,
		` 4096 `:              4096,
		`1073741824`:          1 << 30,
		`"1073741824"`:        1 << 30,
		`"1GiB"`:              1 << 30,
		`"10G"`:               10 << 30,
		`"512MiB"`:            512 << 20,
		`"1.5GiB"`:            3 << 29,
		`" 64 GiB "`:          64 << 30,
		`"1TiB"`:              1 << 40,
		`1152921504606846976`: size.Max,
		`"1024PiB"`:           size.Max,
		`"\u0031GiB"`:         1 << 30, // JSON escapes are decoded before parsing
	}
	for in, want := range good {
		var s Size
		if err := s.UnmarshalJSON([]byte(in)); err != nil || int64(s) != want {
			t.Errorf("UnmarshalJSON(%s) = %d, %v; want %d", in, s, err, want)
		}
		// The same through encoding/json, as a field.
		var r ExtendVolumeRequest
		if err := json.Unmarshal([]byte(`{"size":`+in+`}`), &r); err != nil || int64(r.Size) != want {
			t.Errorf("json.Unmarshal size %s = %d, %v; want %d", in, r.Size, err, want)
		}
	}
	bad := []string{
		`0`, `-0`, `-1`, `-9223372036854775808`, `1.5`, `1e-3`, `1.5e0`, `1152921504606846977`,
		`9223372036854775807`, `9223372036854775808`, `99999999999999999999`,
		`"0"`, `"-1"`, `""`, `"   "`, `"1.5B"`, `"ten"`, `"1GiB x"`, `"1 ZiB"`, `"2EiB"`,
		`null`, `true`, `abc`, ``,
	}
	for _, in := range bad {
		s := Size(77)
		err := s.UnmarshalJSON([]byte(in))
		if err == nil {
			t.Errorf("UnmarshalJSON(%s) accepted as %d", in, s)
			continue
		}
		if !errs.IsCode(err, errs.CodeInvalidSize) {
			t.Errorf("UnmarshalJSON(%s): error %v is not InvalidSize", in, err)
		}
		if s != 77 {
			t.Errorf("UnmarshalJSON(%s) failed but changed the value to %d", in, s)
		}
	}
}

// TestSizeRoundTrip: every size the API accepts marshals (as a plain number)
// and unmarshals back to itself, at powers of two and their neighbours.
func TestSizeRoundTrip(t *testing.T) {
	for shift := 0; shift <= 60; shift++ {
		for _, d := range []int64{-1, 0, 1} {
			n := int64(1)<<shift + d
			if n <= 0 || n > size.Max {
				continue
			}
			b, err := json.Marshal(Size(n))
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != strconv.FormatInt(n, 10) {
				t.Fatalf("Marshal(%d) = %s", n, b)
			}
			var s Size
			if err := json.Unmarshal(b, &s); err != nil || int64(s) != n {
				t.Fatalf("round trip %d: %d, %v", n, s, err)
			}
			if d == 0 && n < size.Max { // Max: see TestSizeMaxFormatParses
				// size.Format renders an exact power of two exactly
				// ("1 GiB"); the string form must read back the same.
				var q Size
				f := strconv.Quote(size.Format(n))
				if err := json.Unmarshal([]byte(f), &q); err != nil || int64(q) != n {
					t.Fatalf("formatted round trip %s: %d, %v; want %d", f, q, err, n)
				}
			}
		}
	}
}

// TestSizeMaxFormatParses: the largest accepted size must be writable in the
// syntax basalt itself prints. size.Format(size.Max) is "1 EiB", and the
// InvalidSize message for a too-large size says "maximum of 1 EiB", but
// size.Parse knows no EiB unit, so {"size":"1EiB"} is refused with "unknown
// unit". (Product bug in internal/size: add e/eb/eib to its unit table.)
func TestSizeMaxFormatParses(t *testing.T) {
	for _, in := range []string{strconv.Quote(size.Format(size.Max)), `"1EiB"`} {
		var s Size
		if err := json.Unmarshal([]byte(in), &s); err != nil || int64(s) != size.Max {
			t.Errorf("Size from %s = %d, %v; want %d (size.Max, printed by size.Format as %q)", in, s, err, size.Max, size.Format(size.Max))
		}
	}
}
