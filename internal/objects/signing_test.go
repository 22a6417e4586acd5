package objects

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/versity/versitygw/auth"
)

// The key derivation of AWS's Signature Version 4 documentation, worked
// example ("Examples of how to derive a signing key").
func TestDeriveSigningKey(t *testing.T) {
	s := signingScope{secret: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", date: "20150830", region: "us-east-1", service: "iam"}
	if got, want := hex.EncodeToString(deriveSigningKey(s)), "c4afb1cc5771d871763a393e44b703571b55cc28424d1a5e86da6ed3c154a4b9"; got != want {
		t.Fatalf("signing key %s, want %s", got, want)
	}
}

func TestSigningKeyCache(t *testing.T) {
	var c signingKeys
	a := signingScope{secret: "one", date: "20261127", region: "us-east-1", service: "s3"}
	k := c.get(a)
	if got := c.get(a); &got[0] != &k[0] {
		t.Fatal("a second request of the same scope derived its key again")
	}
	// A new secret (a rotated key) or another day never gets the old key.
	for _, s := range []signingScope{{"two", a.date, a.region, a.service}, {a.secret, "20261128", a.region, a.service}} {
		if got := c.get(s); hex.EncodeToString(got) != hex.EncodeToString(deriveSigningKey(s)) || string(got) == string(k) {
			t.Fatalf("scope %+v: wrong key", s)
		}
	}
	// Full, it starts again rather than growing.
	for i := range maxSigningKeys + 10 {
		c.get(signingScope{secret: string(rune(i)), date: a.date})
	}
	if n := len(c.keys); n > maxSigningKeys {
		t.Fatalf("%d keys cached, bound %d", n, maxSigningKeys)
	}
}

// basalt issues no session tokens: a request carrying one is refused
// before any account is looked up.
func TestSigningKeySessionToken(t *testing.T) {
	var i IAM
	if _, _, err := i.DeriveSigningKey("AKID", "token", "20261127", "us-east-1", "s3"); !errors.Is(err, auth.ErrInvalidSessionToken) {
		t.Fatalf("err %v, want ErrInvalidSessionToken", err)
	}
}

// aclJSON's spliced document is byte for byte what encoding/json makes.
func TestACLJSON(t *testing.T) {
	for _, owner := range []string{"AKIAIOSFODNN7EXAMPLE", "basalt-root-0123abcd", "", `quo"te`, `back\slash`, "<&>", "ünï", "tab\there"} {
		got, err := aclJSON(owner)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(auth.ACL{Owner: owner, Grantees: []auth.Grantee{{
			Permission: auth.PermissionFullControl, Access: owner, Type: types.TypeCanonicalUser}}})
		if string(got) != string(want) {
			t.Errorf("owner %q:\n got %s\nwant %s", owner, got, want)
		}
		acl, err := auth.ParseACL(got)
		if err != nil || acl.Owner != owner {
			t.Errorf("owner %q: parsed back as %q (%v)", owner, acl.Owner, err)
		}
	}
}
