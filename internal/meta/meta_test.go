package meta

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/pki"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// One embedded etcd member serves every test of the package (starting one
// costs about a second). Tests isolate themselves by unique names and ids
// and do not run in parallel, so that counters (capacity/provisioned) can be
// checked by difference.
var (
	testOnce  sync.Once
	testStore *Store
	testEnv   struct {
		dir       string
		clientURL string
		ca        *pki.CA
		clientTLS *tls.Config
		err       error
	}
)

func TestMain(m *testing.M) {
	code := m.Run()
	if testStore != nil {
		testStore.Close()
	}
	if testEnv.dir != "" {
		os.RemoveAll(testEnv.dir)
	}
	os.Exit(code)
}

// freeAddr returns a 127.0.0.1 address that was free a moment ago.
//
// The port is drawn below Linux's ephemeral range (32768 and up by
// default), which the kernel hands out to bind(":0") and to every
// outgoing connection: a port taken from there, free when drawn, was
// sometimes a connection's by the time a member bound it, seconds later
// (CI: "bind: address already in use").
func freeAddr(t testing.TB) string {
	t.Helper()
	for range 100 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(20000+rand.IntN(12000)))
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			return addr
		}
	}
	t.Fatal("no free port below the ephemeral range")
	return ""
}

// openTestStore returns the package's shared store, starting the embedded
// member on first use: a fresh CA, a node certificate for localhost and
// 127.0.0.1, mTLS on client and peer ports exactly as the server sets it up.
func openTestStore(t testing.TB) *Store {
	t.Helper()
	testOnce.Do(func() {
		dir, err := os.MkdirTemp("", "basalt-meta-test-")
		if err != nil {
			testEnv.err = err
			return
		}
		testEnv.dir = dir
		pkiDir := filepath.Join(dir, "pki")
		ca, err := pki.LoadOrCreateCA(pkiDir)
		if err != nil {
			testEnv.err = err
			return
		}
		cert, err := ca.ServerCertificate(pkiDir, []string{"localhost", "127.0.0.1"})
		if err != nil {
			testEnv.err = err
			return
		}
		testEnv.ca = ca
		testEnv.clientTLS = &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
		clientAddr, peerAddr := freeAddr(t), freeAddr(t)
		testEnv.clientURL = "https://" + clientAddr
		testStore, testEnv.err = Open(context.Background(), Config{
			ClientTLS: testEnv.clientTLS,
			Embed: EmbedConfig{
				Name: "test", Dir: filepath.Join(dir, "meta"),
				ClientAddr: clientAddr, PeerAddr: peerAddr,
				CertFile: filepath.Join(pkiDir, "server.pem"), KeyFile: filepath.Join(pkiDir, "server-key.pem"),
				CAFile: filepath.Join(pkiDir, "ca.pem"),
			},
		}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	})
	if testEnv.err != nil {
		t.Fatalf("open test store: %v", testEnv.err)
	}
	return testStore
}

// clientStore opens a store of its own on the test member, without a
// member of its own (as a client node's): for a test that changes how its
// store answers or counts what it reads. Closed at the test's end.
func clientStore(t *testing.T) *Store {
	t.Helper()
	openTestStore(t)
	s, err := Open(ctxT(t), Config{Endpoints: []string{testEnv.clientURL}, ExternalTLS: testEnv.clientTLS}, testStore.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// newOpener is a memberOpener for members of a new cluster, with a CA of
// its own.
func newOpener(t *testing.T) *memberOpener {
	t.Helper()
	base := t.TempDir()
	ca, err := pki.LoadOrCreateCA(filepath.Join(base, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	return &memberOpener{t: t, base: base, ca: ca}
}

// rawClient is a plain etcd client to the test member, for writing keys
// behind the Store's back.
func rawClient(t *testing.T) *clientv3.Client {
	t.Helper()
	openTestStore(t)
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{testEnv.clientURL},
		DialTimeout: 5 * time.Second,
		TLS:         testEnv.clientTLS,
		Logger:      zapNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// uniq makes names unique per test.
var uniqMu sync.Mutex
var uniqN int

func uniq(prefix string) string {
	uniqMu.Lock()
	defer uniqMu.Unlock()
	uniqN++
	return prefix + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.Itoa(uniqN)
}
