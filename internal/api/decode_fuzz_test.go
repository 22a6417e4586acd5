package api

// Fuzz targets of the request body parsers (decode.go, types.go): each
// runs on its seed corpus with go test, and under make fuzz beyond it.

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/big"
	"strconv"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/cluster"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/size"
)

// seeds shared by every fuzz target: valid bodies of each request type,
// boundary sizes, and the malformed shapes the table tests cover.
var fuzzSeeds = []string{
	`{"size":"10GiB"}`,
	`{"size":1073741824}`,
	`{"size":"1073741824"}`,
	`{"size":"512MiB","name":"data","type":"standard","multiattach":true,"client_token":"t-1"}`,
	`{"from_snapshot":"snap-0123456789abcdef"}`,
	`{"from_snapshot":"base","size":"20G"}`,
	`{"from_object":"s3://images/db.raw"}`,
	`{"from_object":"s3://images/db.raw","from_snapshot":"base"}`,
	`{"size":"1EiB"}`,
	`{"size":"1024PiB"}`,
	`{"size":1152921504606846976}`,
	`{"size":1152921504606846977}`,
	`{"size":9223372036854775807}`,
	`{"size":99999999999999999999999}`,
	`{"size":0}`,
	`{"size":-1}`,
	`{"size":"-1GiB"}`,
	`{"size":1.5}`,
	`{"size":1e3}`,
	`{"size":"1.5GiB"}`,
	`{"size":"0.3B"}`,
	`{"size":""}`,
	`{"size":null}`,
	`{"size":true}`,
	`{"size":[]}`,
	`{"size":{}}`,
	`{"size":"10GiB","bogus":1}`,
	`{"size":"10GiB"} {"size":"1GiB"}`,
	`{"size":"10GiB"}x`,
	`{"size":"10GiB"`,
	`{"volume":"vol-0123456789abcdef","name":"s1","client_token":"abc"}`,
	`{"volume":"data"}`,
	`{"volume":""}`,
	`{"name":"alice","uid":1000,"gid":1000,"admin":true}`,
	`{"name":"bob"}`,
	`{"name":""}`,
	`{"name":"bob","uid":"1000"}`,
	`{"name":"bob","uid":1e40}`,
	`{}`,
	`[]`,
	`null`,
	`"x"`,
	`1`,
	``,
	`   `,
	"\xff\xfe",
	`{"name":"\ud800"}`,
	`{"Size":"1GiB"}`,
	`{"size":"1GiB","size":"2GiB"}`,
	`{"volume":"vol-0123456789abcdef","host":"hv1","mode":"ro"}`,
	`{"volume":"data","host":""}`,
	`{"to":"s3://bucket/key"}`,
	`{"to":""}`,
	`{"name":"fast","description":"x","stack":{"type":"file"}}`,
	`{"name":"fast","stack":null}`,
	`{"name":"fast","stack":[1,2]}`,
}

func addSeeds(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
}

func FuzzParseCreateVolume(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseCreateVolume(body)
		if err != nil {
			checkParseError(t, body, err)
			return
		}
		if r.SizeBytes < 0 || r.SizeBytes > size.Max {
			t.Fatalf("body %q: size %d out of (0, %d]", body, r.SizeBytes, size.Max)
		}
		// A volume from an object takes the object's size.
		if r.SizeBytes == 0 && r.FromSnapshot == "" && r.FromObject == "" {
			t.Fatalf("body %q: accepted with neither a size nor a source", body)
		}
		if !json.Valid(body) {
			t.Fatalf("body %q: accepted but is not valid JSON", body)
		}
	})
}

func FuzzParseExtendVolume(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		n, err := ParseExtendVolume(body)
		if err != nil {
			checkParseError(t, body, err)
			return
		}
		if n <= 0 || n > size.Max {
			t.Fatalf("body %q: size %d out of (0, %d]", body, n, size.Max)
		}
		if !json.Valid(body) {
			t.Fatalf("body %q: accepted but is not valid JSON", body)
		}
	})
}

func FuzzParseCreateSnapshot(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseCreateSnapshot(body)
		if err != nil {
			checkParseError(t, body, err)
			return
		}
		if r.Volume == "" {
			t.Fatalf("body %q: accepted without a volume", body)
		}
		if !json.Valid(body) {
			t.Fatalf("body %q: accepted but is not valid JSON", body)
		}
	})
}

func FuzzParseCreateUser(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseCreateUser(body)
		if err != nil {
			checkParseError(t, body, err)
			return
		}
		if r.Name == "" {
			t.Fatalf("body %q: accepted without a name", body)
		}
		if !json.Valid(body) {
			t.Fatalf("body %q: accepted but is not valid JSON", body)
		}
	})
}

func FuzzParseAttach(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseAttach(body)
		if err != nil {
			checkParseError(t, body, err)
			return
		}
		if r.Volume == "" || r.Host == "" {
			t.Fatalf("body %q: accepted without a volume or a host", body)
		}
		if !json.Valid(body) {
			t.Fatalf("body %q: accepted but is not valid JSON", body)
		}
	})
}

func FuzzParseExportSnapshot(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseExportSnapshot(body)
		if err != nil {
			checkParseError(t, body, err)
			return
		}
		if r.To == "" {
			t.Fatalf("body %q: accepted without a destination", body)
		}
		if !json.Valid(body) {
			t.Fatalf("body %q: accepted but is not valid JSON", body)
		}
	})
}

// FuzzParseCreateVolumeType: the stack is kept as raw JSON for the layer
// registry to check (block/layers' FuzzCheckSpec); the parser must still
// hand on only a present, valid JSON value.
func FuzzParseCreateVolumeType(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseCreateVolumeType(body)
		if err != nil {
			checkParseError(t, body, err)
			return
		}
		if r.Name == "" {
			t.Fatalf("body %q: accepted without a name", body)
		}
		if len(r.Stack) == 0 || string(r.Stack) == "null" || !json.Valid(r.Stack) {
			t.Fatalf("body %q: accepted with stack %q", body, r.Stack)
		}
		if !json.Valid(body) {
			t.Fatalf("body %q: accepted but is not valid JSON", body)
		}
	})
}

func FuzzParseObjectsRequest(f *testing.F) {
	addSeeds(f)
	f.Add([]byte(`{"objects":[{"bucket":"b","key":"k"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseObjectsRequest(body)
		if err != nil {
			checkParseError(t, body, err)
			return
		}
		if len(r.Objects) == 0 || len(r.Objects) > MaxObjectsPerRequest {
			t.Fatalf("accepted %d objects", len(r.Objects))
		}
	})
}

// FuzzDecodeNodeRequests: the node endpoints' bodies (nodes.go) have no
// Parse function of their own; decode alone must refuse what is not one
// JSON object with MalformedJSON, and never hand on anything else.
func FuzzDecodeNodeRequests(f *testing.F) {
	addSeeds(f)
	f.Add([]byte(`{"ttl":"1h"}`))
	f.Add([]byte(`{"ttl":null}`))
	f.Add([]byte(`{"name":"n2","peer":"https://h:2380","client":"https://h:2379","api":"https://h:8443","s3":"","nbd":""}`))
	f.Add([]byte(`{"name":"n2","name":"n3"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var tok JoinTokenRequest
		var join cluster.JoinRequest
		for _, v := range []any{&tok, &join} {
			err := decode(body, v)
			if err != nil {
				if e := checkParseError(t, body, err); e.Code != errs.CodeMalformedJSON {
					t.Fatalf("body %q: %s, want MalformedJSON", body, e.Code)
				}
				continue
			}
			if b := bytes.TrimSpace(body); len(b) == 0 || b[0] != '{' || !json.Valid(body) {
				t.Fatalf("body %q: accepted but is not a JSON object", body)
			}
		}
	})
}

// FuzzSizeUnmarshalJSON: a size is either refused with InvalidSize or in
// (0, 1 EiB]; a string and the same number written as a string agree
// with size.Parse; a number in any notation (1e3, 512.0) is accepted
// exactly when exact arithmetic says it is a whole number in range.
func FuzzSizeUnmarshalJSON(f *testing.F) {
	for _, s := range []string{`1`, `512`, `"10GiB"`, `"1EiB"`, `"1.5GiB"`, `"0.3B"`, `-1`, `0`, `-0`, `1e3`, `1.0`, `1.5e3`, `1e-3`, `1.0000000000000000001e3`, `1.152921504606846977e18`,
		`1152921504606846976`, `1152921504606846977`, `99999999999999999999`, `"  7 k "`, `"\u0031G"`, `null`, `true`,
		`[]`, `{}`, `""`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			return // encoding/json calls UnmarshalJSON with one valid value
		}
		var s Size
		err := s.UnmarshalJSON(b)
		want, decided := exactWholeBytes(b)
		if err != nil {
			var e *errs.Error
			if !errors.As(err, &e) || e.Code != errs.CodeInvalidSize || e.Kind != errs.KindInvalid || e.Message == "" {
				t.Fatalf("%q: error %v, want InvalidSize", b, err)
			}
			if decided && want > 0 {
				t.Fatalf("%q: refused (%v), but it is exactly %d bytes", b, err, want)
			}
			return
		}
		if s <= 0 || int64(s) > size.Max {
			t.Fatalf("%q: size %d out of (0, %d]", b, s, size.Max)
		}
		var str string
		if json.Unmarshal(b, &str) == nil {
			if n, err := size.Parse(str); err != nil || n != int64(s) {
				t.Fatalf("%q: size %d, size.Parse %d %v", b, s, n, err)
			}
			return
		}
		if decided && want != int64(s) {
			t.Fatalf("%q: size %d, exactly %d", b, s, want)
		}
		if !bytes.ContainsAny(b, "eE") {
			// A number in size syntax's grammar (digits, an optional
			// fraction): the same bytes as a string mean the same.
			var again Size
			if err := again.UnmarshalJSON([]byte(strconv.Quote(string(bytes.TrimSpace(b))))); err != nil || again != s {
				t.Fatalf("%q: %d as a number, %d %v as a string", b, s, again, err)
			}
		}
	})
}

// exactWholeBytes is an oracle for a JSON number b, by exact rational
// arithmetic: its value when that is a whole number in (0, size.Max],
// else 0. decided is false for what it does not judge: not a number, or
// too long for big.Rat to be cheap (an exponent of 10^6 takes it a
// while, and ParseJSONNumber's own tests cover the long ones).
func exactWholeBytes(b []byte) (n int64, decided bool) {
	lit := string(bytes.TrimSpace(b))
	if len(lit) == 0 || len(lit) > 40 || !(lit[0] == '-' || lit[0] >= '0' && lit[0] <= '9') {
		return 0, false
	}
	if i := strings.IndexAny(lit, "eE"); i >= 0 && len(strings.TrimLeft(lit[i+1:], "+-0")) > 3 {
		return 0, false
	}
	r, ok := new(big.Rat).SetString(lit)
	if !ok {
		return 0, false
	}
	if !r.IsInt() || r.Sign() <= 0 || !r.Num().IsInt64() || r.Num().Int64() > size.Max {
		return 0, true
	}
	return r.Num().Int64(), true
}
