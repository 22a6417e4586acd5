package pki

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Identity is what a user holds to talk to basalt: the cluster CA to trust,
// a client certificate and key for the control API (and NBD TLS), and an S3
// key pair. On disk it is a directory of ca.pem, cert.pem, key.pem, s3.env
// (plus ca-cert.pem, client-cert.pem, client-key.pem for NBD TLS clients).
type Identity struct {
	CAPEM, CertPEM, KeyPEM []byte
	AccessKeyID            string
	SecretAccessKey        string
	// S3Endpoint is the gateway's URL (AWS_ENDPOINT_URL in s3.env), with
	// S3Region the region requests are signed for.
	S3Endpoint, S3Region string
	// S3CABundle: the gateway serves HTTPS with a certificate of the
	// cluster CA, so s3.env points AWS_CA_BUNDLE at this directory's
	// ca.pem (the aws cli, boto3 and the AWS SDKs read it). Unset for
	// plain HTTP and for a site's own certificate, which clients verify
	// with their usual trust store.
	S3CABundle bool
}

// S3Env is the content of s3.env for an identity kept in dir: the S3
// keys, endpoint, region and, with S3CABundle, AWS_CA_BUNDLE (an absolute
// path, so the file works from any working directory; moving the
// directory means editing that line).
func (id *Identity) S3Env(dir string) (string, error) {
	env := fmt.Sprintf("AWS_ACCESS_KEY_ID=%s\nAWS_SECRET_ACCESS_KEY=%s\n", id.AccessKeyID, id.SecretAccessKey)
	if id.S3Endpoint != "" {
		env += "AWS_ENDPOINT_URL=" + id.S3Endpoint + "\n"
	}
	if id.S3Region != "" {
		env += "AWS_REGION=" + id.S3Region + "\nAWS_DEFAULT_REGION=" + id.S3Region + "\n"
	}
	if id.S3CABundle && id.S3Endpoint != "" {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return "", fmt.Errorf("identity dir: %w", err)
		}
		env += "AWS_CA_BUNDLE=" + filepath.Join(abs, "ca.pem") + "\n"
	}
	return env, nil
}

// Write stores the identity in dir (created 0700; key and s3.env 0600).
func (id *Identity) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create identity dir: %w", err)
	}
	files, err := id.files(dir)
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := WriteFileAtomic(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return err
		}
	}
	return nil
}

// identityFile is one file of an identity directory.
type identityFile struct {
	name string
	data []byte
	mode os.FileMode
}

// files are the files Write writes to dir, in the order it writes them.
//
// Each file is replaced atomically, the set is not: a write cut short
// leaves some files of this identity, the rest of the one before.
// key.pem and cert.pem go last, after their copies under the GnuTLS
// names, so that CheckWritten tells such a directory by a pair that does
// not match (cut between key.pem and cert.pem) or by copies that differ
// from it (cut before). A write cut before the copies leaves ca.pem and
// s3.env new and the rest old, a whole identity of the same cluster: the
// owner's check of the certificate (revoked by the new one's issue, or
// not) decides whether it is still good.
func (id *Identity) files(dir string) ([]identityFile, error) {
	env, err := id.S3Env(dir)
	if err != nil {
		return nil, err
	}
	return []identityFile{
		{"ca.pem", id.CAPEM, 0o644},
		{"s3.env", []byte(env), 0o600},
		// The same certificates under the names GnuTLS clients look for,
		// so the directory is also a libnbd tls-certificates directory and
		// a qemu tls-creds-x509 dir (endpoint=client).
		{"ca-cert.pem", id.CAPEM, 0o644},
		{"client-key.pem", id.KeyPEM, 0o600},
		{"client-cert.pem", id.CertPEM, 0o644},
		{"key.pem", id.KeyPEM, 0o600},
		{"cert.pem", id.CertPEM, 0o644},
	}, nil
}

// CheckWritten loads the identity that Write stored in dir and checks that
// it is whole: its certificate and key a pair, and their copies under the
// GnuTLS names (which Write also writes) the same bytes. An error means a
// write cut short (or a directory someone edited): the owner writes a new
// identity.
func CheckWritten(dir string) (*Identity, error) {
	id, err := LoadIdentity(dir)
	if err != nil {
		return nil, err
	}
	if _, err := id.ClientTLS(); err != nil {
		return nil, fmt.Errorf("identity %s: %w", dir, err)
	}
	for _, c := range []struct {
		name string
		want []byte
	}{{"ca-cert.pem", id.CAPEM}, {"client-key.pem", id.KeyPEM}, {"client-cert.pem", id.CertPEM}} {
		got, err := os.ReadFile(filepath.Join(dir, c.name))
		if err != nil {
			return nil, fmt.Errorf("identity %s: %w", dir, err)
		}
		if !bytes.Equal(got, c.want) {
			return nil, fmt.Errorf("identity %s: %s is not the identity's", dir, c.name)
		}
	}
	return id, nil
}

// LoadIdentity reads an identity directory. s3.env is optional.
func LoadIdentity(dir string) (*Identity, error) {
	id := &Identity{}
	var err error
	if id.CAPEM, err = os.ReadFile(filepath.Join(dir, "ca.pem")); err != nil {
		return nil, fmt.Errorf("identity %s: %w", dir, err)
	}
	if id.CertPEM, err = os.ReadFile(filepath.Join(dir, "cert.pem")); err != nil {
		return nil, fmt.Errorf("identity %s: %w", dir, err)
	}
	if id.KeyPEM, err = os.ReadFile(filepath.Join(dir, "key.pem")); err != nil {
		return nil, fmt.Errorf("identity %s: %w", dir, err)
	}
	if env, err := os.ReadFile(filepath.Join(dir, "s3.env")); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(env))
		for sc.Scan() {
			k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
			if !ok {
				continue
			}
			switch strings.TrimPrefix(k, "export ") {
			case "AWS_ACCESS_KEY_ID":
				id.AccessKeyID = v
			case "AWS_SECRET_ACCESS_KEY":
				id.SecretAccessKey = v
			case "AWS_ENDPOINT_URL":
				id.S3Endpoint = v
			case "AWS_REGION":
				id.S3Region = v
			case "AWS_CA_BUNDLE":
				id.S3CABundle = v != ""
			}
		}
	}
	return id, nil
}

// ClientTLS is a TLS config presenting this identity and trusting its CA.
func (id *Identity) ClientTLS() (*tls.Config, error) {
	cert, err := tls.X509KeyPair(id.CertPEM, id.KeyPEM)
	if err != nil {
		return nil, fmt.Errorf("identity certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(id.CAPEM) {
		return nil, fmt.Errorf("identity ca.pem holds no certificate")
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
