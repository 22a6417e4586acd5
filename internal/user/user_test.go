package user

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/pki"
)

// One embedded etcd member (real, with mTLS, as the server runs it) serves
// every test of the package; starting one costs about a second. Tests
// isolate themselves with unique names and ids.
var (
	testOnce sync.Once
	testMeta *meta.Store
	testEnv  struct {
		dir string
		ca  *pki.CA
		err error
	}
)

func TestMain(m *testing.M) {
	code := m.Run()
	if testMeta != nil {
		testMeta.Close()
	}
	if testEnv.dir != "" {
		os.RemoveAll(testEnv.dir)
	}
	os.Exit(code)
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// openTestStore returns the package's shared metadata store and its CA.
func openTestStore(t testing.TB) (*meta.Store, *pki.CA) {
	t.Helper()
	testOnce.Do(func() {
		testEnv.err = func() error {
			dir, err := os.MkdirTemp("", "basalt-test-")
			if err != nil {
				return err
			}
			testEnv.dir = dir
			pkiDir := filepath.Join(dir, "pki")
			ca, err := pki.LoadOrCreateCA(pkiDir)
			if err != nil {
				return err
			}
			cert, err := ca.ServerCertificate(pkiDir, []string{"localhost", "127.0.0.1"})
			if err != nil {
				return err
			}
			testEnv.ca = ca
			clientAddr, err := freeAddr()
			if err != nil {
				return err
			}
			peerAddr, err := freeAddr()
			if err != nil {
				return err
			}
			testMeta, err = meta.Open(context.Background(), meta.Config{
				ClientTLS: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12},
				Embed: meta.EmbedConfig{
					Name: "test", Dir: filepath.Join(dir, "meta"),
					ClientAddr: clientAddr, PeerAddr: peerAddr,
					CertFile: filepath.Join(pkiDir, "server.pem"), KeyFile: filepath.Join(pkiDir, "server-key.pem"),
					CAFile: filepath.Join(pkiDir, "ca.pem"),
				},
			}, quietLog())
			return err
		}()
	})
	if testEnv.err != nil {
		t.Fatalf("open test metadata store: %v", testEnv.err)
	}
	return testMeta, testEnv.ca
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var uniqN atomic.Int64

// uniq makes a name unique within the shared store.
func uniq(prefix string) string {
	return prefix + strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + strconv.FormatInt(uniqN.Add(1), 36)
}

func newService(t *testing.T) *Service {
	m, ca := openTestStore(t)
	return New(m, ca)
}

// chain parses an issued certificate as a TLS peer chain.
func chain(t *testing.T, certPEM []byte) []*x509.Certificate {
	t.Helper()
	c, err := pki.ParseCertPEM(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	return []*x509.Certificate{c}
}

func wantAuthError(t *testing.T, err error, code string) {
	t.Helper()
	e, ok := errs.As(err)
	if !ok || e.Code != code || e.Kind != errs.KindUnauthenticated {
		t.Fatalf("Authenticate: %v, want %s (unauthenticated)", err, code)
	}
}
