// Package pki is basalt's certificate authority: it creates the cluster CA on
// first start, issues the server certificate every node presents and the
// client certificates that identify users (subject CN = user name).
//
// Invariants: the CA key never leaves DATA/pki (mode 0600); restarts reuse the
// CA and the server certificate unless the certificate is close to expiry or
// no longer names every host it must; client private keys are returned to the
// caller once and never stored by the server.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

const (
	caValidity     = 10 * 365 * 24 * time.Hour
	serverValidity = 365 * 24 * time.Hour
	// ClientValidity is the default lifetime of a user certificate.
	ClientValidity = 365 * 24 * time.Hour
	// RenewBefore: a certificate this close to expiry is reissued (a
	// node's server certificate at start, its local admin identity).
	RenewBefore = 30 * 24 * time.Hour
)

// CA is a loaded certificate authority.
type CA struct {
	Cert            *x509.Certificate
	CertPEM, KeyPEM []byte
	key             crypto.Signer
}

// NewCA creates a fresh certificate authority in memory.
func NewCA() (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "basalt CA " + host, Organization: []string{"basalt"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return ParseCA(pemBlock("CERTIFICATE", der), keyPEM)
}

// ParseCA loads a CA from its PEM certificate and key.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := ParseCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("CA certificate is not a CA")
	}
	// A key of another CA would sign certificates no node trusts.
	if pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(cert.PublicKey) {
		return nil, errors.New("CA key does not belong to the CA certificate")
	}
	return &CA{Cert: cert, CertPEM: certPEM, KeyPEM: keyPEM, key: key}, nil
}

// LoadOrCreateCA reads DIR/ca.pem and DIR/ca-key.pem, creating both on first use.
func LoadOrCreateCA(dir string) (*CA, error) {
	certPath, keyPath := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	if _, err := os.Stat(certPath); err == nil {
		return LoadCA(certPath, keyPath)
	} else if !errors.Is(err, fs.ErrNotExist) {
		// Only a CA that is not there is made anew: one that cannot be
		// read now (permissions, a link loop, an I/O error) is still the
		// cluster's, and a new one would overwrite its key.
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	ca, err := NewCA()
	if err != nil {
		return nil, err
	}
	return ca, ca.Save(dir)
}

// Save writes the CA to DIR/ca.pem and DIR/ca-key.pem.
func (ca *CA) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create pki dir: %w", err)
	}
	// Key first: a crash between the writes leaves no CA certificate, so the
	// next start regenerates both instead of trusting a cert without its key.
	if err := WriteFileAtomic(filepath.Join(dir, "ca-key.pem"), ca.KeyPEM, 0o600); err != nil {
		return err
	}
	return WriteFileAtomic(filepath.Join(dir, "ca.pem"), ca.CertPEM, 0o644)
}

// LoadCA reads an existing CA.
func LoadCA(certPath, keyPath string) (*CA, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("read CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("read CA key: %w", err)
	}
	return ParseCA(certPEM, keyPEM)
}

// Pool is a cert pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Issued is a freshly issued certificate and its private key, PEM-encoded.
type Issued struct {
	CertPEM, KeyPEM []byte
	Serial          string    // hex (SerialHex), as user records list it
	NotAfter        time.Time // the certificate's, UTC
}

// IssueClient issues a client certificate for user name cn whose user record
// has the random id uid. The id goes into the subject's OU so that a user
// deleted and created again under the same name does not inherit the old
// certificates.
func (ca *CA) IssueClient(cn, uid string, validFor time.Duration) (*Issued, error) {
	return ca.IssueClientWindow(cn, uid, time.Now().Add(-5*time.Minute), time.Now().Add(validFor))
}

// IssueClientWindow issues a client certificate valid between notBefore and
// notAfter (tests use it to make expired certificates).
func (ca *CA) IssueClientWindow(cn, uid string, notBefore, notAfter time.Time) (*Issued, error) {
	return ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: cn, Organization: []string{"basalt users"}, OrganizationalUnit: []string{UserIDPrefix + uid}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, notBefore, notAfter)
}

// UserIDPrefix marks the subject OU that carries the user record's id.
const UserIDPrefix = "basalt-user-id:"

// UserID returns the user record id a client certificate was issued for.
func UserID(c *x509.Certificate) string {
	for _, ou := range c.Subject.OrganizationalUnit {
		if id, ok := strings.CutPrefix(ou, UserIDPrefix); ok {
			return id
		}
	}
	return ""
}

func (ca *CA) issue(tmpl *x509.Certificate, notBefore, notAfter time.Time) (*Issued, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore, tmpl.NotAfter = notBefore, notAfter
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	// Whole seconds, as the certificate encodes them: Issued.NotAfter,
	// which user records list, is then the certificate's own.
	tmpl.NotBefore, tmpl.NotAfter = tmpl.NotBefore.UTC().Truncate(time.Second), tmpl.NotAfter.UTC().Truncate(time.Second)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.key)
	if err != nil {
		return nil, fmt.Errorf("issue certificate for %q: %w", tmpl.Subject.CommonName, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return &Issued{CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: keyPEM, Serial: SerialHex(serial), NotAfter: tmpl.NotAfter}, nil
}

// MemberName is a DNS name every node certificate carries (besides the
// node's own names) and no other certificate the CA issues does: the
// embedded etcd admits a client only if its certificate bears it, so that
// a user's certificate — signed by the same CA, for the API — does not
// open the metadata store (the CA key, S3 secrets) to its holder. The
// .invalid domain is reserved: no host has this name.
const MemberName = "member.basalt.invalid"

// ServerCertificate loads DIR/server.pem, reissuing it when it is missing,
// near expiry, signed by another CA or missing one of names (DNS names or
// IPs) or MemberName.
func (ca *CA) ServerCertificate(dir string, names []string) (tls.Certificate, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return tls.Certificate{}, fmt.Errorf("create pki dir: %w", err)
	}
	certPath, keyPath := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	if len(names) > 0 {
		names = append(slices.Clone(names), MemberName)
	}
	if c, err := tls.LoadX509KeyPair(certPath, keyPath); err == nil && ca.serverCertFits(c, names) {
		return c, nil
	}
	if len(names) == 0 || names[0] == "" {
		return tls.Certificate{}, errors.New("server certificate needs at least one name")
	}
	var dns []string
	var ips []net.IP
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			ips = append(ips, ip)
		} else if n != "" && !slices.Contains(dns, n) {
			dns = append(dns, n)
		}
	}
	is, err := ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: names[0], Organization: []string{"basalt nodes"}},
		DNSNames:    dns,
		IPAddresses: ips,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		// A node is a server to clients and a client to its peers.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}, time.Now().Add(-5*time.Minute), time.Now().Add(serverValidity))
	if err != nil {
		return tls.Certificate{}, err
	}
	if err := WriteFileAtomic(keyPath, is.KeyPEM, 0o600); err != nil {
		return tls.Certificate{}, err
	}
	if err := WriteFileAtomic(certPath, is.CertPEM, 0o644); err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(is.CertPEM, is.KeyPEM)
}

// RenewalDue reports whether a certificate of this CA that expires at
// notAfter is due for renewal: within RenewBefore of its expiry, unless
// it expires with the CA itself. Every certificate the CA issues ends by
// the CA's own expiry (issue caps it), so in the CA's last RenewBefore a
// new certificate would expire no later than the one it replaced: called
// due, a certificate would be reissued at every check — a node's local
// admin identity every minute, each one listed in admin's record.
func (ca *CA) RenewalDue(notAfter time.Time) bool {
	return time.Until(notAfter) < RenewBefore && notAfter.Before(ca.Cert.NotAfter)
}

func (ca *CA) serverCertFits(c tls.Certificate, names []string) bool {
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil || ca.RenewalDue(leaf.NotAfter) {
		return false
	}
	if leaf.CheckSignatureFrom(ca.Cert) != nil {
		return false
	}
	for _, n := range names {
		if n != "" && leaf.VerifyHostname(n) != nil {
			return false
		}
	}
	return true
}

// ParseCertPEM parses the first certificate of a PEM bundle.
func ParseCertPEM(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(blk.Bytes)
}

// SerialHex renders a certificate serial the way user records store it.
func SerialHex(n *big.Int) string { return hex.EncodeToString(n.Bytes()) }

func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func encodeKey(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pemBlock("PRIVATE KEY", der), nil
}

func parseKey(b []byte) (crypto.Signer, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM key")
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		if ek, err2 := x509.ParseECPrivateKey(blk.Bytes); err2 == nil {
			return ek, nil
		}
		return nil, err
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("key cannot sign")
	}
	return s, nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// WriteFileAtomic writes data to path via a synced temp file and rename, so a
// crash leaves either the old file or the new one.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
