package cluster

import (
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
)

// FuzzParseJoinToken: any string is either a well-formed token, whose parts
// round-trip, or an InvalidJoinToken error; nothing panics.
func FuzzParseJoinToken(f *testing.F) {
	f.Add("basalt-join." + strings.Repeat("a", 48) + "." + strings.Repeat("0", 64))
	f.Add("basalt-join..")
	f.Add("")
	f.Add("basalt-join.x.y.z")
	f.Fuzz(func(t *testing.T, tok string) {
		secret, hash, err := ParseJoinToken(tok)
		if err != nil {
			if !errs.IsCode(err, CodeJoinTokenBad) {
				t.Fatalf("error %v is not %s", err, CodeJoinTokenBad)
			}
			return
		}
		if "basalt-join."+secret+"."+hash != tok {
			t.Fatalf("parts %q %q do not make %q", secret, hash, tok)
		}
	})
}

func TestCAHash(t *testing.T) {
	if CAHash([]byte("not a certificate")) != "" {
		t.Fatal("a hash for a non-certificate")
	}
}
