package api

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestUserCredentials: POST /v1/users/{name}/credentials (admin)
// answers a new identity; the user's earlier certificate is refused from
// then on, the new one works, the user keeps its volumes, and GET
// /v1/users/{name} lists the certificate now valid (never a secret).
func TestUserCredentials(t *testing.T) {
	e := newNodeEnv(t, nil)
	alice, aliceOld := e.user("alice", false)
	_, admin := e.user("root", true)
	if st, _, out := e.do(aliceOld, "POST", "/v1/volumes", `{"size":"1GiB","name":"keep"}`); st != 201 {
		t.Fatalf("create volume: %d %s", st, out)
	}
	st, _, out := e.do(admin, "POST", "/v1/users/"+alice+"/credentials", "")
	if st != 201 {
		t.Fatalf("credentials: HTTP %d %s, want 201", st, out)
	}
	var r CredentialsResponse
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.User.Name != alice || r.Identity.KeyPEM == "" || r.Identity.SecretAccessKey == "" || r.Identity.AccessKeyID != r.User.AccessKeyID {
		t.Fatalf("answer: %s", out)
	}
	b, _ := pem.Decode([]byte(r.Identity.CertPEM))
	leaf, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	aliceNew := []*x509.Certificate{leaf}

	if st, code, out := e.do(aliceOld, "GET", "/v1/volumes", ""); st != 401 || code != "CertificateRevoked" {
		t.Errorf("old certificate after rotation: HTTP %d %s, want 401 CertificateRevoked", st, out)
	}
	st, _, out = e.do(aliceNew, "GET", "/v1/volumes/keep", "")
	if st != 200 {
		t.Errorf("new certificate, the user's volume: HTTP %d %s", st, out)
	}
	st, _, out = e.do(aliceNew, "GET", "/v1/users/"+alice, "")
	var u User
	if st != 200 || json.Unmarshal([]byte(out), &u) != nil {
		t.Fatalf("show: %d %s", st, out)
	}
	serial := strings.ToLower(leaf.SerialNumber.Text(16))
	if len(u.Certificates) != 1 || strings.TrimLeft(u.Certificates[0].Serial, "0") != strings.TrimLeft(serial, "0") ||
		u.Certificates[0].IssuedFor != "user" || !u.Certificates[0].NotAfter.Equal(leaf.NotAfter) || u.LegacyCertificates {
		t.Errorf("show after rotation: %s (new serial %s)", out, serial)
	}
	if strings.Contains(out, r.Identity.SecretAccessKey) || strings.Contains(out, "secret") {
		t.Errorf("show carries a secret: %s", out)
	}

	cases := []struct {
		who    []*x509.Certificate
		target string
		status int
		code   string
	}{
		{aliceNew, "/v1/users/" + alice + "/credentials", 403, "AdminRequired"},
		{admin, "/v1/users/" + uniq("nobody") + "/credentials", 404, "NotFound"},
		{aliceOld, "/v1/users/" + alice + "/credentials", 401, "CertificateRevoked"},
	}
	op := openapiOp(t, "POST", "/v1/users/{name}/credentials")
	responses, _ := op["responses"].(map[string]any)
	codes, _ := op["x-error-codes"].([]any)
	for _, c := range cases {
		st, code, out := e.do(c.who, "POST", c.target, "")
		if st != c.status || code != c.code {
			t.Errorf("POST %s: HTTP %d %s, want %d %s", c.target, st, out, c.status, c.code)
		}
		if _, ok := responses[strconv.Itoa(st)]; !ok {
			t.Errorf("credentials answers %d, which openapi.json does not declare", st)
		}
		if !slices.Contains(codes, any(code)) {
			t.Errorf("credentials answers %s, not among its x-error-codes %v", code, codes)
		}
	}
	if _, ok := responses["201"]; !ok {
		t.Error("openapi.json does not declare the 201 of credentials")
	}
}
