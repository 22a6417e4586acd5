package objects

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	"github.com/gofiber/fiber/v3"
	"github.com/versity/versitygw/auth"
	"github.com/versity/versitygw/s3api"
	"github.com/versity/versitygw/s3api/middlewares"
	"github.com/versity/versitygw/s3err"
)

// memBuckets is a BucketStore in memory.
type memBuckets struct {
	mu sync.Mutex
	m  map[string]Bucket
}

func (s *memBuckets) CreateBucket(_ context.Context, b Bucket) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[b.Name]; ok {
		return ErrBucketExists
	}
	s.m[b.Name] = b
	return nil
}

func (s *memBuckets) Bucket(_ context.Context, name string) (*Bucket, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[name]
	if !ok {
		return nil, ErrNoSuchBucket
	}
	return &b, nil
}

func (s *memBuckets) Buckets(context.Context) ([]Bucket, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Bucket
	for _, b := range s.m {
		out = append(out, b)
	}
	slices.SortFunc(out, func(x, y Bucket) int { return strings.Compare(x.Name, y.Name) })
	return out, nil
}

func (s *memBuckets) DeleteBucket(_ context.Context, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[name]; !ok {
		return ErrNoSuchBucket
	}
	delete(s.m, name)
	return nil
}

func (s *memBuckets) SetVersioning(_ context.Context, name, status string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[name]
	if !ok {
		return ErrNoSuchBucket
	}
	b.Versioning = status
	s.m[name] = b
	return nil
}

// testIAM is a fixed map of accounts (access key id → account).
type testIAM map[string]auth.Account

func (m testIAM) CreateAccount(auth.Account) error {
	return s3err.GetAPIError(s3err.ErrAdminMethodNotSupported)
}

func (m testIAM) GetUserAccount(access string) (auth.Account, error) {
	a, ok := m[access]
	if !ok {
		return auth.Account{}, auth.ErrNoSuchUser
	}
	return a, nil
}

func (m testIAM) ResolveAccounts(ids []string) ([]string, error) {
	var missing []string
	for _, id := range ids {
		if _, ok := m[id]; !ok {
			missing = append(missing, id)
		}
	}
	return missing, nil
}

func (m testIAM) UpdateUserAccount(string, auth.MutableProps) error {
	return s3err.GetAPIError(s3err.ErrAdminMethodNotSupported)
}

func (m testIAM) DeleteUserAccount(string) error {
	return s3err.GetAPIError(s3err.ErrAdminMethodNotSupported)
}

func (m testIAM) ListUserAccounts() ([]auth.Account, error) {
	var out []auth.Account
	for _, a := range m {
		out = append(out, a)
	}
	return out, nil
}

func (m testIAM) Shutdown() error { return nil }

// env is a backend served by s3api on a real listener, with clients.
type env struct {
	dir, root, work string
	be              *Backend
	buckets         *memBuckets
	alice, bob      *s3.Client
	admin           *s3.Client
	aliceKey        string
	iam             testIAM // the accounts; tests may change them
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func client(scheme, addr, access, secret string) *s3.Client {
	return s3.New(s3.Options{
		Region:           "us-east-1",
		BaseEndpoint:     aws.String(scheme + "://" + addr),
		UsePathStyle:     true,
		Credentials:      credentials.NewStaticCredentialsProvider(access, secret, ""),
		RetryMaxAttempts: 1,
		HTTPClient: &http.Client{Transport: &http.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}},
	})
}

// newEnv starts a server over a fresh store; sidecar forces sidecar
// metadata.
func newEnv(t *testing.T, sidecar bool) *env { return newEnvTLS(t, sidecar, false) }

// newEnvTLS is newEnv, over TLS if useTLS: aws-sdk-go-v2 then sends
// bodies as STREAMING-UNSIGNED-PAYLOAD-TRAILER with a trailing
// checksum. s3api can only serve TLS with versitygw's internal cert
// storage, so the test takes its fiber app (an unexported field, read
// with reflect; pinned to versitygw v1.8.0) and serves it on a
// tls.Listener.
func newEnvTLS(t *testing.T, sidecar, useTLS bool) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{dir: dir, root: filepath.Join(dir, "buckets"), work: filepath.Join(dir, "work"),
		buckets: &memBuckets{m: map[string]Bucket{}}, aliceKey: "AKALICE"}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	be, err := New(Config{Root: e.root, Work: e.work, Buckets: e.buckets, Log: log, Sidecar: sidecar})
	if err != nil {
		t.Fatal(err)
	}
	e.be = be
	e.iam = testIAM{
		"AKALICE": {Access: "AKALICE", Secret: "alice-secret", Role: auth.RoleUserPlus, Arn: "user/alice"},
		"AKBOB":   {Access: "AKBOB", Secret: "bob-secret", Role: auth.RoleUserPlus, Arn: "user/bob"},
	}
	addr := freeAddr(t)
	ready := make(chan struct{})
	var once sync.Once
	srv, err := s3api.New(be, middlewares.RootUserConfig{Access: "AKROOT", Secret: "root-secret"}, "us-east-1", e.iam,
		nil, nil, nil, nil,
		s3api.WithConcurrencyLimiter(1000, 1000), s3api.WithKeepAlive(), s3api.WithDisableACL(), s3api.WithQuiet(),
		s3api.WithOnListen(func() { once.Do(func() { close(ready) }) }))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	scheme := "http"
	if useTLS {
		scheme = "https"
		ln, err := tls.Listen("tcp", addr, &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}})
		if err != nil {
			t.Fatal(err)
		}
		f := reflect.ValueOf(srv).Elem().FieldByName("app")
		app := reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Interface().(*fiber.App)
		go func() { served <- app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true}) }()
	} else {
		go func() { served <- srv.ServeMultiPort([]string{addr}) }()
		select {
		case <-ready:
		case err := <-served:
			t.Fatalf("serve: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("server did not start")
		}
	}
	t.Cleanup(func() {
		srv.ShutDown()
		be.Shutdown()
	})
	e.alice = client(scheme, addr, "AKALICE", "alice-secret")
	e.bob = client(scheme, addr, "AKBOB", "bob-secret")
	e.admin = client(scheme, addr, "AKROOT", "root-secret")
	return e
}

// inBothModes runs fn as one subtest per metadata mode ("xattr",
// "sidecar"), each on a fresh env that really uses that mode.
func inBothModes(t *testing.T, fn func(t *testing.T, e *env, mode string)) {
	for _, mode := range []string{"xattr", "sidecar"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t, mode == "sidecar")
			if e.be.MetadataKind() != mode {
				t.Fatalf("metadata %s, want %s", e.be.MetadataKind(), mode)
			}
			fn(t, e, mode)
		})
	}
}

// noTempLeft fails if an upload left a file in Work/tmp.
func noTempLeft(t *testing.T, e *env) {
	t.Helper()
	if left := files(t, filepath.Join(e.work, "tmp")); len(left) != 0 {
		t.Errorf("temp files left in Work/tmp: %v", left)
	}
}

// selfSigned makes a certificate for 127.0.0.1.
func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "basalt-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// code returns the S3 error code of err ("" for nil).
func code(err error) string {
	if err == nil {
		return ""
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return err.Error()
}

func wantCode(t *testing.T, err error, want string) {
	t.Helper()
	if got := code(err); got != want {
		t.Fatalf("error %q (%v), want %s", got, err, want)
	}
}

// files lists every regular file and symlink under dir, relative.
func files(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
