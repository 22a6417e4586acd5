package api

import (
	"encoding/json"
	"testing"
)

// TestSizeJSONFloatNotation: a size written as a JSON number in float
// notation that is exactly a whole number of bytes — 1e3, 1073741824.0,
// what JavaScript, jq or Python write for a number that went through a
// float — creates and extends a volume. They were refused 400
// InvalidSize "not a whole number of bytes", which they are. What is not
// whole, however little (1.5, 1.0000000000000000001e3, which float64
// rounds to 1000), stays InvalidSize.
func TestSizeJSONFloatNotation(t *testing.T) {
	e := newNodeEnv(t, nil)
	_, alice := e.user("alice", false)
	if st, _, out := e.do(alice, "POST", "/v1/volumes", `{"size":1.048576e6,"name":"v"}`); st != 201 {
		t.Fatalf("create with size 1.048576e6: HTTP %d %s, want 201", st, out)
	}
	for _, c := range []struct {
		size string
		want int64
	}{
		{`2097152.0`, 2 << 20},
		{`4.194304E6`, 4 << 20},
		{`1073741824.000`, 1 << 30},
		{`2048e+6`, 2048e6},
	} {
		st, _, out := e.do(alice, "POST", "/v1/volumes/v/extend", `{"size":`+c.size+`}`)
		var v Volume
		if st != 200 && st != 202 || json.Unmarshal([]byte(out), &v) != nil || v.SizeBytes != c.want {
			t.Errorf("extend to %s: HTTP %d %s, want size_bytes %d", c.size, st, out, c.want)
		}
	}
	for _, size := range []string{`1.5`, `512.5`, `1.0000000000000000001e3`, `5.12e-1`, `1e19`} {
		body := `{"size":` + size + `}`
		if st, code, out := e.do(alice, "POST", "/v1/volumes", body); st != 400 || code != "InvalidSize" {
			t.Errorf("POST /v1/volumes %s: HTTP %d %s, want 400 InvalidSize", body, st, out)
		}
	}
}
