package meta

import "testing"

func TestCheckNodeName(t *testing.T) {
	for _, ok := range []string{"n1", "node-a.example.org", "x_1"} {
		if err := CheckNodeName(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a/b", "a,b", "a=b", "a b", "a\tb", "a\x00b"} {
		if err := CheckNodeName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
