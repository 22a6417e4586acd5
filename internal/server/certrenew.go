package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"time"

	"github.com/basalt-storage/basalt/internal/pki"
)

// certCheckEvery is how often a running node looks whether its
// certificates are due for renewal (keepCertificates).
var certCheckEvery = time.Hour

// The node certificate (DATA/pki/server.pem, a year) is what the API and
// NBD present, and what the node's etcd client presents to the members.
// Issued at a start when missing or due (pki.RenewBefore), it would
// otherwise be served by a running node until it expired — then clients
// refuse the API and the members refuse one another, every node of a
// cluster made the same day at once. So the node serves it from n.cert,
// which keepCertificates replaces once renewed. (The embedded member reads
// the files at each handshake: renewed on disk, it presents the new one.)

// serverCert is tls.Config.GetCertificate of the node's listeners.
func (n *Node) serverCert(*tls.ClientHelloInfo) (*tls.Certificate, error) { return n.cert.Load(), nil }

// clientCert is tls.Config.GetClientCertificate of the node's etcd client.
func (n *Node) clientCert(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return n.cert.Load(), nil
}

// keepCertificates renews the node's certificates while it runs, as its
// start does, until ctx ends.
func (n *Node) keepCertificates(ctx context.Context, ca *pki.CA) {
	for range ticks(ctx, certCheckEvery) {
		n.renewCertificates(ca)
	}
}

// renewCertificates reissues the node certificate when it is due
// (pki.CA.ServerCertificate decides, as at a start) and serves the new
// one; and has the S3 gateway present its certificate as now on disk.
func (n *Node) renewCertificates(ca *pki.CA) {
	cert, err := ca.ServerCertificate(filepath.Join(n.cfg.Data, "pki"), n.certNames())
	if err != nil {
		n.log.Warn("renewing the node certificate failed; retrying", "err", err)
	} else if old := n.cert.Load(); old == nil || !bytes.Equal(old.Certificate[0], cert.Certificate[0]) {
		n.cert.Store(&cert)
		attrs := []any{}
		if leaf, err := x509.ParseCertificate(cert.Certificate[0]); err == nil {
			attrs = append(attrs, "not_after", leaf.NotAfter)
		}
		n.log.Info("node certificate renewed", attrs...)
	}
	if n.reloadS3Cert != nil {
		if err := n.reloadS3Cert(); err != nil {
			n.log.Warn("renewing the s3 certificate failed; retrying", "err", err)
		}
	}
}
