package pki

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// ServiceCertificate is ServerCertificate for another server of the node
// (the S3 gateway: name "s3"): DIR/<name>.pem and DIR/<name>-key.pem, a
// server-only certificate (no client auth: it identifies a service to its
// clients, never the node to its peers) signed by the cluster CA and
// naming every one of names (DNS names or IPs). It is reissued when
// missing, near expiry, signed by another CA or missing a name, so a new
// --advertise or listen address takes effect at the next start. It
// returns the loaded certificate and the two file paths.
func (ca *CA) ServiceCertificate(dir, name string, names []string) (c tls.Certificate, certPath, keyPath string, err error) {
	// The files share DIR with the CA's (ca.pem, ca-key.pem) and the
	// node's (server.pem, server-key.pem): a name whose files would be
	// one of those, or another service's key file (a name ending in
	// "-key"), would overwrite it — for "ca-key", the CA's private key.
	if name == "" || name == "server" || name == "ca" || strings.HasSuffix(name, "-key") || filepath.Base(name) != name {
		return tls.Certificate{}, "", "", fmt.Errorf("service certificate name %q is not usable: it is empty, a path, or its files would clash with the CA's, the node's or another service's", name)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return tls.Certificate{}, "", "", fmt.Errorf("create pki dir: %w", err)
	}
	certPath, keyPath = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	if c, err := tls.LoadX509KeyPair(certPath, keyPath); err == nil && ca.serverCertFits(c, names) {
		return c, certPath, keyPath, nil
	}
	var dns []string
	var ips []net.IP
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			if !slices.ContainsFunc(ips, ip.Equal) {
				ips = append(ips, ip)
			}
		} else if n != "" && !slices.Contains(dns, n) {
			dns = append(dns, n)
		}
	}
	if len(dns)+len(ips) == 0 {
		return tls.Certificate{}, "", "", errors.New("service certificate needs at least one name")
	}
	// The subject names the first name given (the host clients use).
	cn := names[slices.IndexFunc(names, func(n string) bool { return n != "" })]
	is, err := ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: cn, Organization: []string{"basalt " + name}},
		DNSNames:    dns,
		IPAddresses: ips,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, time.Now().Add(-5*time.Minute), time.Now().Add(serverValidity))
	if err != nil {
		return tls.Certificate{}, "", "", err
	}
	// Key first: a certificate is never on disk without its key.
	if err := WriteFileAtomic(keyPath, is.KeyPEM, 0o600); err != nil {
		return tls.Certificate{}, "", "", err
	}
	if err := WriteFileAtomic(certPath, is.CertPEM, 0o644); err != nil {
		return tls.Certificate{}, "", "", err
	}
	c, err = tls.X509KeyPair(is.CertPEM, is.KeyPEM)
	if err != nil {
		return tls.Certificate{}, "", "", fmt.Errorf("%s certificate: %w", name, err)
	}
	return c, certPath, keyPath, nil
}
