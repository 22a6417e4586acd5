package api

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/user"
)

// Every user-scoped endpoint, asked by another (non-admin) user about a
// volume, snapshot or attachment by its id, answers NotFound — existence
// must not leak — and changes nothing; the owner's resources are intact
// afterwards. A user created again under the owner's name after the owner
// was deleted is a stranger too, and the deleted owner's certificate no
// longer works. Admins see everything throughout.
func TestCrossUserAccessByID(t *testing.T) {
	e := newNodeEnv(t, nil)
	aliceName, alice := e.user("alice", false)
	_, bob := e.user("bob", false)
	_, admin := e.user("adm", true)

	create := func(who []*x509.Certificate, method, target, body string, want int, out any) {
		t.Helper()
		st, code, b := e.do(who, method, target, body)
		if st != want {
			t.Fatalf("%s %s: %d %s %s", method, target, st, code, b)
		}
		if out != nil {
			if err := json.Unmarshal([]byte(b), out); err != nil {
				t.Fatal(err)
			}
		}
	}
	var v struct {
		ID        string `json:"id"`
		SizeBytes int64  `json:"size_bytes"`
	}
	create(alice, "POST", "/v1/volumes", `{"size":"1MiB","name":"va"}`, 201, &v)
	var sn struct {
		ID string `json:"id"`
	}
	create(alice, "POST", "/v1/snapshots", `{"volume":"`+v.ID+`","name":"sa"}`, 201, &sn)
	var at struct {
		ID     string `json:"id"`
		Export string `json:"export"`
	}
	create(alice, "POST", "/v1/attachments", `{"volume":"`+v.ID+`","host":"h1","mode":"rw"}`, 201, &at)
	if v.ID == "" || sn.ID == "" || at.ID == "" {
		t.Fatalf("ids: %q %q %q", v.ID, sn.ID, at.ID)
	}

	probes := []struct{ method, target, body string }{
		{"GET", "/v1/volumes/" + v.ID, ""},
		{"GET", "/v1/volumes/va", ""},
		{"POST", "/v1/volumes/" + v.ID + "/extend", `{"size":"2MiB"}`},
		{"POST", "/v1/volumes/" + v.ID + "/flatten", ""},
		{"POST", "/v1/volumes/" + v.ID + "/repair", ""},
		{"POST", "/v1/volumes/" + v.ID + "/scrub", ""},
		{"POST", "/v1/snapshots", `{"volume":"` + v.ID + `"}`},
		{"GET", "/v1/snapshots?volume=" + v.ID, ""},
		{"GET", "/v1/snapshots/" + sn.ID, ""},
		{"GET", "/v1/snapshots/sa", ""},
		{"POST", "/v1/volumes", `{"from_snapshot":"` + sn.ID + `"}`},
		{"POST", "/v1/attachments", `{"volume":"` + v.ID + `","host":"h2","mode":"ro"}`},
		{"GET", "/v1/attachments?volume=" + v.ID, ""},
		{"GET", "/v1/attachments/" + at.ID, ""},
		{"DELETE", "/v1/attachments/" + at.ID, ""},
		{"DELETE", "/v1/snapshots/" + sn.ID, ""},
		{"DELETE", "/v1/volumes/" + v.ID, ""},
	}
	check := func(who string, cert []*x509.Certificate) {
		t.Helper()
		for _, p := range probes {
			st, code, b := e.do(cert, p.method, p.target, p.body)
			if st != 404 || code != "NotFound" {
				t.Errorf("%s: %s %s: %d %s, want 404 NotFound: %s", who, p.method, p.target, st, code, b)
			}
		}
		for _, list := range []string{"/v1/volumes", "/v1/snapshots", "/v1/attachments"} {
			st, _, b := e.do(cert, "GET", list, "")
			if st != 200 || strings.Contains(b, v.ID) || strings.Contains(b, sn.ID) || strings.Contains(b, at.ID) {
				t.Errorf("%s: GET %s: %d %s", who, list, st, b)
			}
		}
	}
	intact := func(who string) {
		t.Helper()
		for _, target := range []string{"/v1/volumes/" + v.ID, "/v1/snapshots/" + sn.ID, "/v1/attachments/" + at.ID} {
			st, code, b := e.do(admin, "GET", target, "")
			if st != 200 {
				t.Fatalf("after %s's probes: GET %s: %d %s %s", who, target, st, code, b)
			}
			if strings.HasPrefix(target, "/v1/volumes/") {
				var got struct {
					SizeBytes int64 `json:"size_bytes"`
				}
				json.Unmarshal([]byte(b), &got)
				if got.SizeBytes != v.SizeBytes {
					t.Errorf("after %s's probes the volume is %d bytes, was %d", who, got.SizeBytes, v.SizeBytes)
				}
			}
		}
	}
	check("bob", bob)
	intact("bob")

	// The owner is deleted and a user of the same name created again.
	if _, err := e.us.Delete(context.Background(), aliceName); err != nil {
		t.Fatal(err)
	}
	if st, code, _ := e.do(alice, "GET", "/v1/volumes/"+v.ID, ""); st != 401 || code != "CertificateRevoked" {
		t.Errorf("deleted user's certificate: %d %s, want 401 CertificateRevoked", st, code)
	}
	_, id, err := e.us.Create(context.Background(), user.Spec{Name: aliceName})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(id.CertPEM)
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	newAlice := []*x509.Certificate{c}
	if st, code, _ := e.do(alice, "GET", "/v1/volumes/"+v.ID, ""); st != 401 || code != "CertificateRevoked" {
		t.Errorf("the old user's certificate after the name was reused: %d %s, want 401 CertificateRevoked", st, code)
	}
	check("new alice", newAlice)
	intact("new alice")
}
