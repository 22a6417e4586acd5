package server

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/pki"
	"github.com/basalt-storage/basalt/internal/user"
)

// leafOf reads the client certificate of an identity directory.
func leafOf(t *testing.T, dir string) *x509.Certificate {
	t.Helper()
	id, err := pki.LoadIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pki.ParseCertPEM(id.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRemovedNodeAdminRevoked: every node writes itself a local
// admin identity, and the admin record lists its certificate as the
// node's. `node remove` revokes it: the removed node's admin
// certificate, valid for a year, no longer authenticates anywhere; the
// other nodes' stay valid.
func TestRemovedNodeAdminRevoked(t *testing.T) {
	checkEvery := adminCheckEvery
	adminCheckEvery = 50 * time.Millisecond // b would renew a revoked identity at once
	t.Cleanup(func() { adminCheckEvery = checkEvery })
	tmp := t.TempDir()
	store := filepath.Join(tmp, "store")
	a := firstNode(t, tmp, store, 1)
	defer a.Close()
	b := joinNode(t, a, "b", tmp, store)
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	aCert, bCert := leafOf(t, a.AdminDir), leafOf(t, filepath.Join(tmp, "b", "identities", "admin"))
	rec, err := a.meta.User(ctx, user.Admin)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{pki.SerialHex(aCert.SerialNumber): meta.CertForNode("a"), pki.SerialHex(bCert.SerialNumber): meta.CertForNode("b")}
	for _, c := range rec.Certs {
		if want[c.Serial] == c.IssuedFor {
			delete(want, c.Serial)
		}
	}
	if !rec.CertsListed || len(want) > 0 {
		t.Fatalf("admin record lists %+v (listed %v); missing %v", rec.Certs, rec.CertsListed, want)
	}
	if _, err := a.users.Authenticate(ctx, []*x509.Certificate{bCert}); err != nil {
		t.Fatalf("b's admin certificate before the removal: %v", err)
	}
	if err := a.cluster.Remove(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	_, err = a.users.Authenticate(ctx, []*x509.Certificate{bCert})
	if !errs.IsCode(err, errs.CodeCertificateRevoked) {
		t.Fatalf("the removed node's admin certificate: %v, want %s", err, errs.CodeCertificateRevoked)
	}
	if _, err := a.users.Authenticate(ctx, []*x509.Certificate{aCert}); err != nil {
		t.Fatalf("a's admin certificate after b's removal: %v", err)
	}
	// b, removed, is not given an identity again — neither by its own
	// renewal while it still ran nor later.
	time.Sleep(10 * adminCheckEvery)
	if rec, err = a.meta.User(ctx, user.Admin); err != nil {
		t.Fatal(err)
	}
	for _, c := range rec.Certs {
		if c.IssuedFor == meta.CertForNode("b") {
			t.Fatalf("the removed node b has a listed admin certificate again: %+v", c)
		}
	}
	if _, err := a.users.RenewNodeIdentity(ctx, "b"); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("renewing the removed node's identity: %v, want NotFound", err)
	}
	// A node marked as being removed (its record not yet gone) neither.
	if err := a.meta.PutNode(ctx, &meta.Node{Name: "c", API: "https://c:8443", Removing: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.users.RenewNodeIdentity(ctx, "c"); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("renewing the identity of a node being removed: %v, want NotFound", err)
	}
}

// renewingNode starts a one-node cluster that checks its local admin
// identity every 50 ms, closed when the test ends, and a context for the
// test's requests.
func renewingNode(t *testing.T) (*Node, context.Context) {
	checkEvery := adminCheckEvery
	adminCheckEvery = 50 * time.Millisecond
	t.Cleanup(func() { adminCheckEvery = checkEvery })
	tmp := t.TempDir()
	a := firstNode(t, tmp, filepath.Join(tmp, "store"), 1)
	t.Cleanup(a.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return a, ctx
}

// TestRunningNodeRenewsRevokedAdminIdentity: a running node whose local
// admin identity was revoked (admin's credentials rotated) writes itself
// a new one without a restart.
func TestRunningNodeRenewsRevokedAdminIdentity(t *testing.T) {
	a, ctx := renewingNode(t)
	first := leafOf(t, a.AdminDir)
	time.Sleep(5 * adminCheckEvery)
	if again := leafOf(t, a.AdminDir); again.SerialNumber.Cmp(first.SerialNumber) != 0 {
		t.Fatal("a valid admin identity was replaced")
	}
	if _, _, err := a.users.RotateCredentials(ctx, user.Admin); err != nil {
		t.Fatal(err)
	}
	for {
		renewed := leafOf(t, a.AdminDir)
		if renewed.SerialNumber.Cmp(first.SerialNumber) != 0 {
			if _, err := a.users.Authenticate(ctx, []*x509.Certificate{renewed}); err != nil {
				t.Fatalf("the renewed identity: %v", err)
			}
			return
		}
		if ctx.Err() != nil {
			t.Fatal("the revoked admin identity was not renewed while the node ran")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTornAdminIdentityRenewed: a local admin identity whose write was
// cut short — key.pem, or client-cert.pem (what NBD TLS clients present),
// of a new identity beside the old one's other files — authenticates by
// its certificate but cannot be used whole; the running node sees that
// (pki.CheckWritten) and writes itself a whole one.
func TestTornAdminIdentityRenewed(t *testing.T) {
	// key.pem of another identity: a pair that does not match;
	// client-cert.pem of another: a copy that is not the identity's.
	for _, file := range []string{"key.pem", "client-cert.pem"} {
		t.Run(file, func(t *testing.T) {
			a, ctx := renewingNode(t)
			first := leafOf(t, a.AdminDir)
			other, err := a.users.IssueIdentity(ctx, user.Admin, "")
			if err != nil {
				t.Fatal(err)
			}
			data := other.KeyPEM
			if file == "client-cert.pem" {
				data = other.CertPEM
			}
			if err := pki.WriteFileAtomic(filepath.Join(a.AdminDir, file), data, 0o600); err != nil {
				t.Fatal(err)
			}
			for {
				if _, err := pki.CheckWritten(a.AdminDir); err == nil {
					renewed := leafOf(t, a.AdminDir)
					if renewed.SerialNumber.Cmp(first.SerialNumber) == 0 {
						t.Fatalf("%s matches the old certificate again", file)
					}
					if _, err := a.users.Authenticate(ctx, []*x509.Certificate{renewed}); err != nil {
						t.Fatalf("the renewed identity: %v", err)
					}
					return
				}
				if ctx.Err() != nil {
					t.Fatal("the torn admin identity was not renewed while the node ran")
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// TestRestartRenewsRevokedAdminIdentity: a node restarted on its data
// keeps its local admin identity (still listed), and one whose identity
// was revoked (admin's credentials rotated) writes itself a new one.
func TestRestartRenewsRevokedAdminIdentity(t *testing.T) {
	tmp := t.TempDir()
	store := filepath.Join(tmp, "store")
	a := firstNode(t, tmp, store, 1)
	cfg := a.cfg
	first := leafOf(t, a.AdminDir)
	a.Close()
	a, err := startNode(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if again := leafOf(t, a.AdminDir); again.SerialNumber.Cmp(first.SerialNumber) != 0 {
		t.Fatal("a restart replaced a valid admin identity")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, _, err := a.users.RotateCredentials(ctx, user.Admin); err != nil {
		t.Fatal(err)
	}
	if _, err := a.users.Authenticate(ctx, []*x509.Certificate{first}); !errs.IsCode(err, errs.CodeCertificateRevoked) {
		t.Fatalf("node identity after admin's rotation: %v", err)
	}
	a.Close()
	a, err = startNode(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	renewed := leafOf(t, a.AdminDir)
	if renewed.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("the revoked admin identity was kept")
	}
	if _, err := a.users.Authenticate(ctx, []*x509.Certificate{renewed}); err != nil {
		t.Fatal(err)
	}
}

// s3As is an S3 client of the node's gateway with an identity's keys.
func s3As(id *pki.Identity) *s3.Client {
	return s3.New(s3.Options{
		Region: id.S3Region, BaseEndpoint: aws.String(id.S3Endpoint), UsePathStyle: true, RetryMaxAttempts: 1,
		Credentials: credentials.NewStaticCredentialsProvider(id.AccessKeyID, id.SecretAccessKey, ""),
	})
}

// TestRotatedS3Keys: after new credentials, the gateway refuses
// the user's old S3 key (InvalidAccessKeyId) and serves the new one, and
// the bucket made with the old key is still the user's.
func TestRotatedS3Keys(t *testing.T) {
	tmp := t.TempDir()
	a := firstNode(t, tmp, filepath.Join(tmp, "store"), 1)
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, old, err := a.users.Create(ctx, user.Spec{Name: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if old.S3Endpoint == "" {
		t.Fatal("the identity names no S3 endpoint")
	}
	bucket := aws.String("rotated")
	if _, err := s3As(old).CreateBucket(ctx, &s3.CreateBucketInput{Bucket: bucket}); err != nil {
		t.Fatal(err)
	}
	if _, err := s3As(old).PutObject(ctx, &s3.PutObjectInput{Bucket: bucket, Key: aws.String("k"), Body: strings.NewReader("kept")}); err != nil {
		t.Fatal(err)
	}
	_, fresh, err := a.users.RotateCredentials(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	_, err = s3As(old).ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: bucket})
	var ae smithy.APIError
	if !errors.As(err, &ae) || ae.ErrorCode() != "InvalidAccessKeyId" {
		t.Fatalf("the old S3 key after new credentials: %v, want InvalidAccessKeyId", err)
	}
	out, err := s3As(fresh).GetObject(ctx, &s3.GetObjectInput{Bucket: bucket, Key: aws.String("k")})
	if err != nil {
		t.Fatalf("the new S3 key, the user's bucket: %v", err)
	}
	body, _ := io.ReadAll(out.Body)
	out.Body.Close()
	if string(body) != "kept" {
		t.Fatalf("object: %q", body)
	}
	lb, err := s3As(fresh).ListBuckets(ctx, &s3.ListBucketsInput{})
	if err != nil || len(lb.Buckets) != 1 || *lb.Buckets[0].Name != "rotated" {
		t.Fatalf("buckets with the new key: %+v, %v", lb, err)
	}
}
