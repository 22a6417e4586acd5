package pki

import (
	"testing"
	"time"
)

// TestIssuedMatchesCertificate: what IssueClient reports of a
// certificate — the serial and NotAfter that user records list and
// `basalt user show` prints — is the certificate's own (a NotAfter with
// the nanoseconds the certificate cannot carry differs from it).
func TestIssuedMatchesCertificate(t *testing.T) {
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Duration{time.Hour, ClientValidity, 100 * 365 * 24 * time.Hour} {
		is, err := ca.IssueClient("alice", "id-1", d)
		if err != nil {
			t.Fatal(err)
		}
		c, err := ParseCertPEM(is.CertPEM)
		if err != nil {
			t.Fatal(err)
		}
		if is.Serial != SerialHex(c.SerialNumber) || is.Serial == "" {
			t.Errorf("serial %q, certificate's %q", is.Serial, SerialHex(c.SerialNumber))
		}
		if !is.NotAfter.Equal(c.NotAfter) || is.NotAfter.Location() != time.UTC {
			t.Errorf("NotAfter %v, certificate's %v", is.NotAfter, c.NotAfter)
		}
	}
}
