package meta

import (
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
)

// TestUserKeyReplaced: a user record written with a new S3 access
// key drops the index entry of the key it replaces, so that the old key
// resolves to nobody; the certificate list round-trips.
func TestUserKeyReplaced(t *testing.T) {
	s := openTestStore(t)
	ctx := ctxT(t)
	u := &User{Name: uniq("keys"), ID: uniq("id"), AccessKeyID: uniq("AK1"), SecretKey: "s1", CreatedAt: time.Now().UTC()}
	if err := s.Update(ctx, func(tx *Tx) error { tx.PutUser(u); return nil }); err != nil {
		t.Fatal(err)
	}
	old := u.AccessKeyID
	nu := *u
	nu.AccessKeyID, nu.SecretKey = uniq("AK2"), "s2"
	nu.CertsListed = true
	nu.Certs = []UserCert{{Serial: "0a1b", NotAfter: time.Now().Add(time.Hour).UTC().Truncate(time.Second), IssuedFor: CertForNode("n1")}}
	if err := s.Update(ctx, func(tx *Tx) error {
		cur, err := tx.User(u.Name)
		if err != nil || cur == nil {
			t.Fatalf("read back: %+v, %v", cur, err)
		}
		tx.PutUser(&nu)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UserByAccessKey(ctx, old); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("replaced access key: %v, want NotFound", err)
	}
	got, err := s.UserByAccessKey(ctx, nu.AccessKeyID)
	if err != nil || got.SecretKey != "s2" {
		t.Fatalf("new access key: %+v, %v", got, err)
	}
	if !got.CertsListed || len(got.Certs) != 1 || got.Certs[0] != nu.Certs[0] || got.Certs[0].IssuedFor != "node n1" {
		t.Fatalf("certificates round trip: %+v", got.Certs)
	}
	if !got.HasCert("0a1b") || got.HasCert("0a1c") {
		t.Fatal("HasCert")
	}
}
