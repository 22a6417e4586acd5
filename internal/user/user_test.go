package user

import (
	"context"
	"crypto/x509"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/meta/metatest"
	"github.com/basalt-storage/basalt/internal/pki"
)

func TestMain(m *testing.M) { metatest.Main(m) }

// openTestStore returns the package's shared metadata store and its CA.
func openTestStore(t testing.TB) (*meta.Store, *pki.CA) {
	e := metatest.Shared(t)
	return e.Meta, e.CA
}

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
