package server

// TLS of the S3 gateway (docs/objects.md, "TLS"). The rule mirrors NBD's:
// on a loopback --s3 address the gateway speaks plain HTTP unless told
// otherwise (--s3-tls, or a site certificate); beyond loopback it serves
// HTTPS, and plain HTTP there needs --s3-insecure. The certificate is
// issued by the cluster CA for the names clients use (DATA/pki/s3.pem),
// so identities, which hold that CA, verify the gateway with nothing to
// install; --s3-cert/--s3-key present a site's own certificate instead
// (e.g. from a public CA, which clients already trust).

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/pki"
	"github.com/versity/versitygw/s3api"
)

// S3TLSConfig is how the S3 gateway serves HTTPS (Config embeds it).
type S3TLSConfig struct {
	// S3TLS serves HTTPS on a loopback S3 address too; beyond loopback
	// HTTPS is the default.
	S3TLS bool
	// S3Insecure allows plain HTTP on a non-loopback S3 address.
	S3Insecure bool
	// S3Cert and S3Key are PEM files of a site's own certificate (chain)
	// and key, presented instead of one issued by the cluster CA. They
	// imply HTTPS.
	S3Cert, S3Key string
}

// usageCode is the CLI's code for a bad command line (cli.CodeUsage;
// that package imports this one).
const usageCode = "UsageError"

// check rejects contradicting settings before anything is started.
func (c S3TLSConfig) check() error {
	if (c.S3Cert == "") != (c.S3Key == "") {
		return errs.Invalid(usageCode, "--s3-cert and --s3-key go together: the certificate and its private key")
	}
	if c.S3Insecure && (c.S3TLS || c.S3Cert != "") {
		return errs.Invalid(usageCode, "--s3-insecure (plain HTTP) contradicts --s3-tls and --s3-cert")
	}
	return nil
}

// checkS3TLS refuses the S3 TLS settings the gateway could not start
// with — contradicting ones, or a site certificate that does not load —
// at the start of Start, before anything is made or joined.
func (n *Node) checkS3TLS() error {
	if err := n.cfg.S3TLSConfig.check(); err != nil {
		return err
	}
	if n.cfg.S3Cert != "" {
		return n.checkSiteCert(n.cfg.S3Cert, n.cfg.S3Key)
	}
	return nil
}

// s3UsesTLS says whether the gateway on cfg.S3 serves HTTPS.
func (c Config) s3UsesTLS() bool {
	if c.S3TLS || c.S3Cert != "" {
		return true
	}
	host, _, err := net.SplitHostPort(c.S3)
	if err != nil {
		return !c.S3Insecure
	}
	return !loopbackHost(host) && !c.S3Insecure
}

// loopbackHost reports whether a listen host reaches only this machine:
// a loopback IP, or a name resolving to loopback addresses only. An
// empty or unspecified host (all interfaces) and an unresolvable name
// count as beyond loopback, so a mistake errs towards TLS.
func loopbackHost(host string) bool {
	if host == "" {
		return false
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	ips, err := net.LookupIP(host)
	if err != nil || len(ips) == 0 {
		return false
	}
	return !slices.ContainsFunc(ips, func(ip net.IP) bool { return !ip.IsLoopback() })
}

// s3Host is the host clients use for the gateway: --advertise, else the
// listen host, else (listening on every interface) the host name.
func (n *Node) s3Host() (host, port string, err error) {
	host, port, err = n.advertised(n.cfg.S3)
	if err != nil {
		return "", "", fmt.Errorf("--s3 %q: %w", n.cfg.S3, err)
	}
	return host, port, nil
}

// s3CertNames are the names the gateway's certificate carries: the host
// of s3.env's URL first, loopback, the host name and --advertise, the
// listen address, and when listening on every interface each address of
// this machine (clients may use any of them; a changed address gets a
// new certificate at the next start).
func (n *Node) s3CertNames() []string {
	urlHost, _, _ := n.s3Host()
	hostname, _ := os.Hostname()
	names := []string{urlHost, "localhost", "127.0.0.1", "::1", hostname, n.cfg.Advertise}
	listen, _, _ := net.SplitHostPort(n.cfg.S3)
	if ip := net.ParseIP(listen); listen == "" || ip != nil && ip.IsUnspecified() {
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if in, ok := a.(*net.IPNet); ok && !in.IP.IsLinkLocalUnicast() && !in.IP.IsLinkLocalMulticast() {
					names = append(names, in.IP.String())
				}
			}
		}
	} else {
		names = append(names, listen)
	}
	var out []string
	for _, s := range names {
		if s != "" && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// s3TLS returns the s3api option that makes the gateway serve HTTPS, and
// whether its certificate is the cluster CA's (identities then set
// AWS_CA_BUNDLE to their ca.pem).
//
// s3api serves TLS only through versitygw's certificate storage
// (s3api.WithTLS takes a *netutil.CertStorage, a type of an internal
// package that basalt cannot import or name). Its zero value is ready to
// use, and Go infers the type from the exported field
// S3ApiServer.CertStorage, so newOf makes one; SetCertificate then loads
// the PEM files. This is versitygw's own TLS listener (TLS 1.2 minimum),
// checked by the compiler against the pinned v1.8.0.
func (n *Node) s3TLS() (opt s3api.Option, fromCA bool, err error) {
	certFile, keyFile := n.cfg.S3Cert, n.cfg.S3Key
	if certFile == "" { // a site's was checked at the start (checkS3TLS)
		// The cluster CA, as settled by openMeta (which always leaves it
		// in DATA/pki, joined or not).
		pkiDir := filepath.Join(n.cfg.Data, "pki")
		ca, err := pki.LoadCA(filepath.Join(pkiDir, "ca.pem"), filepath.Join(pkiDir, "ca-key.pem"))
		if err != nil {
			return nil, false, fmt.Errorf("s3 certificate: %w", err)
		}
		if _, certFile, keyFile, err = ca.ServiceCertificate(pkiDir, "s3", n.s3CertNames()); err != nil {
			return nil, false, fmt.Errorf("s3 certificate: %w", err)
		}
		fromCA = true
	}
	var probe s3api.S3ApiServer
	cs := newOf(probe.CertStorage)
	if err := cs.SetCertificate(certFile, keyFile); err != nil {
		return nil, false, fmt.Errorf("s3 certificate %s: %w", certFile, err)
	}
	// Loaded once, the certificate would be presented until it expired
	// however long the node runs: keepCertificates calls this to renew
	// the cluster CA's when due, and to pick up a site's certificate
	// replaced in its files.
	n.reloadS3Cert = func() error {
		if fromCA {
			pkiDir := filepath.Join(n.cfg.Data, "pki")
			ca, err := pki.LoadCA(filepath.Join(pkiDir, "ca.pem"), filepath.Join(pkiDir, "ca-key.pem"))
			if err != nil {
				return fmt.Errorf("s3 certificate: %w", err)
			}
			if _, _, _, err := ca.ServiceCertificate(pkiDir, "s3", n.s3CertNames()); err != nil {
				return fmt.Errorf("s3 certificate: %w", err)
			}
		}
		if err := cs.SetCertificate(certFile, keyFile); err != nil {
			return fmt.Errorf("s3 certificate %s: %w", certFile, err)
		}
		return nil
	}
	return s3api.WithTLS(cs), fromCA, nil
}

// newOf returns a new zero T given a *T, for types that cannot be named.
func newOf[T any](*T) *T { return new(T) }

// checkSiteCert loads a site's certificate to fail at start rather than at
// the first handshake, and warns about what clients will refuse: expiry,
// or no name for the host in s3.env's URL.
func (n *Node) checkSiteCert(certFile, keyFile string) error {
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return errs.Invalid(usageCode, "--s3-cert %s / --s3-key %s: %v", certFile, keyFile, err)
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return errs.Invalid(usageCode, "--s3-cert %s: %v", certFile, err)
	}
	if time.Now().After(leaf.NotAfter) {
		n.log.Warn("s3 certificate has expired; clients will refuse it", "cert", certFile, "not_after", leaf.NotAfter)
	}
	if host, _, err := n.s3Host(); err == nil && leaf.VerifyHostname(host) != nil {
		n.log.Warn("s3 certificate does not name the gateway's host; clients will refuse it (set --advertise to a name it carries)",
			"cert", certFile, "host", host, "dns_names", leaf.DNSNames, "ips", leaf.IPAddresses)
	}
	return nil
}

// refreshS3Env rewrites the s3.env of this node's admin identity when the
// gateway's URL or certificate changed since it was written (the identity
// itself is kept across restarts while valid). Identities handed to users
// are theirs to update (docs/objects.md).
func (n *Node) refreshS3Env(url string, caBundle bool) error {
	id, err := pki.LoadIdentity(n.AdminDir)
	if err != nil {
		return err
	}
	id.S3Endpoint, id.S3Region, id.S3CABundle = url, s3Region, caBundle
	env, err := id.S3Env(n.AdminDir)
	if err != nil {
		return err
	}
	path := filepath.Join(n.AdminDir, "s3.env")
	if old, err := os.ReadFile(path); err == nil && string(old) == env {
		return nil
	}
	if err := pki.WriteFileAtomic(path, []byte(env), 0o600); err != nil {
		return err
	}
	n.log.Info("admin identity's s3.env updated", "endpoint", url, "ca_bundle", caBundle)
	return nil
}
