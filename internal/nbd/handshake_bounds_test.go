package nbd

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/pki"
)

// stuckExports is an Exports whose Open waits for its context (as one
// waiting for an unreachable metadata store would), or at most max.
type stuckExports struct {
	max     time.Duration
	entered chan struct{} // receives once per Open
	ctxErr  chan error    // what ended each Open: its context's error, or nil after max
}

func newStuckExports(max time.Duration) *stuckExports {
	return &stuckExports{max: max, entered: make(chan struct{}, 16), ctxErr: make(chan error, 16)}
}

func (e *stuckExports) Open(ctx context.Context, _ string, _ *tls.ConnectionState) (*Export, error) {
	e.entered <- struct{}{}
	select {
	case <-ctx.Done():
		e.ctxErr <- ctx.Err()
		return nil, ctx.Err()
	case <-time.After(e.max):
		e.ctxErr <- nil
		return nil, errors.New("stuck")
	}
}

// An unauthenticated client can make the server call Exports.Open (INFO,
// GO, EXPORT_NAME). The handshake's time limit must bound that call too,
// or a client that names an export while the metadata store hangs holds
// a goroutine (and its connection) for as long as Open blocks, past
// HandshakeTimeout; and Server.Close, which waits for every connection,
// must not wait for it either.
func TestOpenBoundedByHandshake(t *testing.T) {
	t.Run("HandshakeTimeout", func(t *testing.T) {
		exps := newStuckExports(20 * time.Second)
		s, addr := serve(t, nil, func(s *Server) {
			s.Exports, s.HandshakeTimeout = exps, 300*time.Millisecond
		})
		c := connect(t, addr, clientFixed)
		start := time.Now()
		if err := c.sendOption(optGo, encInfoGo("disk")); err != nil {
			t.Fatal(err)
		}
		<-exps.entered
		select {
		case err := <-exps.ctxErr:
			if err == nil {
				t.Fatal("Open's context never ended")
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("Open still running %v after the handshake started (HandshakeTimeout 300ms)", time.Since(start))
		}
		if !waitFor(5*time.Second, func() bool { return s.Connections() == 0 }) {
			t.Fatalf("connection still open %v after the handshake started", time.Since(start))
		}
		c.nc.SetReadDeadline(time.Now().Add(ioTimeout))
		io.Copy(io.Discard, c.r) // an error reply at most, then the close
	})
	t.Run("ServerClose", func(t *testing.T) {
		exps := newStuckExports(20 * time.Second)
		s, addr := serve(t, nil, func(s *Server) { s.Exports = exps })
		c := connect(t, addr, clientFixed)
		if err := c.sendOption(optInfo, encInfoGo("disk")); err != nil {
			t.Fatal(err)
		}
		<-exps.entered
		var closed atomic.Bool
		go func() {
			s.Close()
			closed.Store(true)
		}()
		if !waitFor(5*time.Second, closed.Load) {
			t.Fatal("Server.Close waits for an Exports.Open that waits for its context")
		}
		if err := <-exps.ctxErr; err == nil {
			t.Error("Open's context was not cancelled by Server.Close")
		}
		c.close()
	})
}

// The spec (TLS support, server-side requirements): the server MUST
// operate in NOTLS mode unless the client replied with
// NBD_FLAG_C_FIXED_NEWSTYLE; in NOTLS mode STARTTLS gets ERR_POLICY (or
// ERR_UNSUP) and no option is answered with ERR_TLS_REQD. A server that
// requires TLS thus serves such a client nothing (EXPORT_NAME still ends
// the session); one that offers TLS serves it only exports that do not
// need TLS.
func TestNoTLSWithoutFixedNewstyle(t *testing.T) {
	fx := newTLSFixture(t)
	dev, _ := sparseFile(t, testSize)
	t.Run("FORCEDTLS", func(t *testing.T) {
		s, addr := serve(t, dev, func(s *Server) { s.TLS, s.RequireTLS = fx.server, true })
		c := connect(t, addr, clientNoZeroes)
		for _, code := range []uint32{optList, optInfo, optGo, optStructuredReply, 99} {
			d := []byte(nil)
			if code == optInfo || code == optGo {
				d = encInfoGo("disk")
			}
			rs := c.opt(code, d)
			if r := rs[len(rs)-1]; r.typ == repErrTLSReqd || r.typ == repAck {
				t.Errorf("option %d from a client without FIXED_NEWSTYLE: %v, want an error other than ERR_TLS_REQD", code, rs)
			}
		}
		rs := c.opt(optStartTLS, nil)
		if r := rs[len(rs)-1]; r.typ != repErrPolicy && r.typ != repErrUnsup {
			t.Fatalf("STARTTLS from a client without FIXED_NEWSTYLE: %v, want ERR_POLICY or ERR_UNSUP", rs)
		}
		c.sendOption(optExportName, []byte("disk"))
		c.expectClosed("EXPORT_NAME without TLS")
		drain(t, s, c)
	})
	t.Run("SELECTIVETLS", func(t *testing.T) {
		exps := tlsRequiredExports{mapExports{"disk": {Name: "disk", Device: dev}}}
		s, addr := serve(t, dev, func(s *Server) { s.TLS, s.Exports = fx.server, exps })
		c := connect(t, addr, 0)
		for _, code := range []uint32{optInfo, optGo} {
			rs := c.opt(code, encInfoGo("disk"))
			if r := rs[len(rs)-1]; r.typ == repErrTLSReqd {
				t.Errorf("option %d from a client without FIXED_NEWSTYLE answered ERR_TLS_REQD", code)
			}
		}
		rs := c.opt(optStartTLS, nil)
		if r := rs[len(rs)-1]; r.typ != repErrPolicy && r.typ != repErrUnsup {
			t.Fatalf("STARTTLS from a client without FIXED_NEWSTYLE: %v, want ERR_POLICY or ERR_UNSUP", rs)
		}
		drain(t, s, c)
	})
}

// Real clients over TLS (gnutls in libnbd and QEMU): STARTTLS first, then
// option haggling and transmission inside TLS, on a server that requires
// it; with a client certificate the server's CA signed.
func TestTLSInterop(t *testing.T) {
	ca, err := pki.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.ServerCertificate(t.TempDir(), []string{"127.0.0.1", "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	is, err := ca.IssueClient("alice", "uid-1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir() // the layout both libnbd and QEMU read
	for name, b := range map[string][]byte{"ca-cert.pem": ca.CertPEM, "client-cert.pem": is.CertPEM, "client-key.pem": is.KeyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	exp, path := fileExport(t, "disk", 16<<20, false)
	exps := &tlsSeenExports{mapExports: mapExports{"disk": exp}}
	s := &Server{Exports: exps, RequireTLS: true, TLS: &tls.Config{Certificates: []tls.Certificate{cert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool(), MinVersion: tls.VersionTLS12}}
	addr := startServer(t, s)
	uri := "nbds://" + addr + "/disk?tls-certificates=" + dir
	out := run(t, "nbdinfo", uri)
	for _, want := range []string{"export-size: 16777216", "base:allocation", "can_flush: true"} {
		if !strings.Contains(out, want) {
			t.Errorf("nbdinfo over TLS lacks %q:\n%s", want, out)
		}
	}
	if cs := exps.last(); cs == nil || len(cs.PeerCertificates) == 0 || cs.PeerCertificates[0].Subject.CommonName != "alice" {
		t.Errorf("Exports.Open did not see the client certificate: %+v", cs)
	}
	out = run(t, "nbdinfo", "--map", uri)
	if !strings.Contains(out, "hole,zero") {
		t.Errorf("block status over TLS:\n%s", out)
	}
	// Without TLS the client is refused (FORCEDTLS).
	if out, err := exec.Command("nbdinfo", "nbd://"+addr+"/disk").CombinedOutput(); err == nil {
		t.Errorf("nbdinfo without TLS succeeded:\n%s", out)
	}
	obj := "tls-creds-x509,id=tls0,endpoint=client,dir=" + dir
	img := "driver=nbd,host=127.0.0.1,port=" + addr[strings.LastIndexByte(addr, ':')+1:] + ",export=disk,tls-creds=tls0"
	run(t, "qemu-io", "--object", obj, "--image-opts", "-c", "write -P 0xcd 8192 1M", "-c", "flush", img)
	out = run(t, "qemu-io", "--object", obj, "--image-opts", "-c", "read -P 0xcd 8192 1M", img)
	if strings.Contains(out, "Pattern verification failed") {
		t.Fatalf("pattern mismatch over TLS:\n%s", out)
	}
	b, _ := os.ReadFile(path)
	if b[8192] != 0xcd || b[8192+1<<20-1] != 0xcd {
		t.Fatal("the backing file does not hold what was written over TLS")
	}
	if !waitFor(5*time.Second, func() bool { return s.Connections() == 0 }) {
		t.Errorf("%d connections left after the clients disconnected", s.Connections())
	}
}

// A client that sends STARTTLS and then never finishes the TLS handshake
// (nothing at all, half a ClientHello, or garbage) is dropped within
// HandshakeTimeout, and its goroutine goes with it.
func TestTLSHandshakeBounded(t *testing.T) {
	fx := newTLSFixture(t)
	dev, _ := sparseFile(t, testSize)
	s, addr := serve(t, dev, func(s *Server) {
		s.TLS, s.RequireTLS, s.HandshakeTimeout = fx.server, true, 300*time.Millisecond
	})
	for name, send := range map[string][]byte{
		"silent":          nil,
		"half a record":   {22, 3, 1, 0x02, 0x00, 1, 0, 0},
		"not TLS at all":  encOption(optList, nil),
		"handshake never": {22, 3, 1, 0x40, 0x00},
	} {
		c := connect(t, addr, clientFixed)
		c.final(optStartTLS, nil, repAck)
		if send != nil {
			c.write(send)
		}
		start := time.Now()
		c.nc.SetReadDeadline(time.Now().Add(ioTimeout))
		io.Copy(io.Discard, c.r) // an alert at most, then the close
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("%s: dropped after %v", name, d)
		}
		c.close()
	}
	if !waitFor(5*time.Second, func() bool { return s.Connections() == 0 }) {
		t.Fatalf("%d connections left", s.Connections())
	}
}
