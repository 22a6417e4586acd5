// Package metatest gives the tests of packages built on meta a real
// embedded etcd member, configured as a node runs it: mutual TLS with a
// cluster CA and a node certificate, on free loopback ports.
//
// One member serves a whole test binary (starting one costs about a
// second); tests isolate themselves with unique names. Call Main from the
// package's TestMain so that the member is stopped at the end.
package metatest

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/pki"
)

// Env is a running test member and the CA it trusts.
type Env struct {
	Meta *meta.Store
	CA   *pki.CA
	Dir  string

	url string      // the member's client URL
	tls *tls.Config // a node's client TLS
}

// Connect opens another Store on the member, with a connection of its
// own (as another node has); it is closed at cleanup.
func (e *Env) Connect(t testing.TB) *meta.Store {
	t.Helper()
	m, err := meta.Open(context.Background(), meta.Config{Endpoints: []string{e.url}, ExternalTLS: e.tls},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("connect to the test metadata store: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

var (
	once   sync.Once
	shared *Env
	err    error
)

// Main runs the tests and stops the shared member.
func Main(m *testing.M) {
	code := m.Run()
	if shared != nil {
		shared.Meta.Close()
		os.RemoveAll(shared.Dir)
	}
	os.Exit(code)
}

// Shared returns the binary's member, starting it on first use.
func Shared(t testing.TB) *Env {
	t.Helper()
	once.Do(func() { shared, err = start() })
	if err != nil {
		t.Fatalf("start test metadata store: %v", err)
	}
	return shared
}

// Private starts a member of the test's own, stopped at cleanup: for a
// test whose services act on every record in the store (adopting the
// workflows of nodes that are gone), which the shared member's other
// tests leave behind.
func Private(t testing.TB) *Env {
	t.Helper()
	e, err := start()
	if err != nil {
		t.Fatalf("start a private test metadata store: %v", err)
	}
	t.Cleanup(func() {
		e.Meta.Close()
		os.RemoveAll(e.Dir)
	})
	return e
}

func start() (*Env, error) {
	dir, err := os.MkdirTemp("", "basalt-meta-test-")
	if err != nil {
		return nil, err
	}
	pkiDir := filepath.Join(dir, "pki")
	ca, err := pki.LoadOrCreateCA(pkiDir)
	if err != nil {
		return nil, err
	}
	cert, err := ca.ServerCertificate(pkiDir, []string{"localhost", "127.0.0.1"})
	if err != nil {
		return nil, err
	}
	clientAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	peerAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	clientTLS := &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	m, err := meta.Open(context.Background(), meta.Config{
		ClientTLS: clientTLS,
		Embed: meta.EmbedConfig{
			Name: "test", Dir: filepath.Join(dir, "meta"),
			ClientAddr: clientAddr, PeerAddr: peerAddr,
			CertFile: filepath.Join(pkiDir, "server.pem"), KeyFile: filepath.Join(pkiDir, "server-key.pem"),
			CAFile: filepath.Join(pkiDir, "ca.pem"),
		},
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &Env{Meta: m, CA: ca, Dir: dir, url: "https://" + clientAddr, tls: clientTLS}, nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
