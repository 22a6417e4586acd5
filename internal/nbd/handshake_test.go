package nbd

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/pki"
)

const (
	testSize = 1 << 20
	// rwFlags is what a writable File export advertises without structured
	// replies.
	rwFlags = tflagHasFlags | tflagSendFlush | tflagSendFUA | tflagMultiConn | tflagSendTrim |
		tflagSendZeroes | tflagSendFastZero | tflagSendCache
)

func TestGreeting(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	_, addr := serve(t, dev, nil)
	c := dialRaw(t, addr)
	if c.hsFlags != flagFixedNewstyle|flagNoZeroes {
		t.Fatalf("handshake flags %#x, want FIXED_NEWSTYLE|NO_ZEROES", c.hsFlags)
	}
}

// The server MUST close the connection on client flags it does not know.
func TestUnknownClientFlags(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	s, addr := serve(t, dev, nil)
	for _, f := range []uint32{1 << 2, 1 << 31, clientFixed | 1<<5, 0xffffffff} {
		c := connect(t, addr, f)
		// Whatever the client sends next, nothing comes back.
		c.sendOption(optList, nil)
		c.expectClosed("unknown client flags")
	}
	if !waitFor(5*time.Second, func() bool { return s.Connections() == 0 }) {
		t.Fatalf("%d connections left", s.Connections())
	}
}

func TestOptionReplies(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	_, addr := serve(t, dev, nil)
	c := connect(t, addr, clientFixed|clientNoZeroes)

	t.Run("LIST", func(t *testing.T) {
		c.t = t
		rs := c.opt(optList, nil)
		// Export names are per-attachment secrets: none is listed.
		if len(rs) != 1 || rs[0].typ != repAck {
			t.Fatalf("LIST: %v", rs)
		}
		c.final(optList, []byte("x"), repErrInvalid)
	})

	t.Run("INFO", func(t *testing.T) {
		c.t = t
		rs := c.opt(optInfo, encInfoGo("disk", infoName, infoDescription, infoBlockSize, 0x7777))
		if last := rs[len(rs)-1]; last.typ != repAck {
			t.Fatalf("INFO: %v", rs)
		}
		ei := parseInfoReplies(t, rs)
		if ei.rawExportInfoPayloads != 1 || ei.size != testSize || ei.flags != rwFlags {
			t.Errorf("INFO_EXPORT: size %d flags %#x (count %d), want %d %#x", ei.size, ei.flags, ei.rawExportInfoPayloads, testSize, rwFlags)
		}
		if !ei.haveBlockSize || ei.minBlock != 1 || ei.prefBlock != 4096 || ei.maxPayload != MaxPayload {
			t.Errorf("INFO_BLOCK_SIZE: have %v min %d pref %d max %d", ei.haveBlockSize, ei.minBlock, ei.prefBlock, ei.maxPayload)
		}
		if ei.name != "disk" || ei.desc != "test disk" {
			t.Errorf("INFO_NAME %q INFO_DESCRIPTION %q", ei.name, ei.desc)
		}
		// Without information requests the export info (and block size)
		// still come.
		rs = c.opt(optInfo, encInfoGo("disk"))
		ei2 := parseInfoReplies(t, rs)
		if ei2.size != ei.size || ei2.flags != ei.flags || !ei2.haveBlockSize || ei2.haveName {
			t.Errorf("INFO without requests: %+v", ei2)
		}
	})

	t.Run("UnknownExport", func(t *testing.T) {
		c.t = t
		for _, code := range []uint32{optInfo, optGo} {
			rs := c.opt(code, encInfoGo("nope", infoBlockSize))
			if len(rs) != 1 || rs[0].typ != repErrUnknown {
				t.Errorf("option %d on an unknown export: %v (want only ERR_UNKNOWN, no INFO)", code, rs)
			}
		}
	})

	t.Run("Unsupported", func(t *testing.T) {
		c.t = t
		for _, code := range []uint32{0, 4, 11, 12, 99, 1 << 20, 0x7fffffff, 0xffffffff} {
			c.final(code, nil, repErrUnsup)
			// Data of an unknown option is skipped; the next option parses.
			c.final(code, bytes.Repeat([]byte{0xee}, 300), repErrUnsup)
		}
		c.final(optList, nil, repAck)
	})

	t.Run("MalformedInfoGo", func(t *testing.T) {
		c.t = t
		long := strings.Repeat("n", maxString+1)
		cases := map[string][]byte{
			"empty":            {},
			"short":            {0, 0, 0, 0, 0},
			"name past end":    append(be.AppendUint32(nil, 10), "disk\x00\x00"...),
			"missing count":    append(be.AppendUint32(nil, 4), "disk\x00"...),
			"count too big":    encInfoGo("disk", 1, 2)[:4+4+2+2],
			"trailing byte":    append(encInfoGo("disk", 1), 0),
			"odd trailing":     append(encInfoGo("disk"), 0, 3, 0),
			"name over 4 KiB":  encInfoGo(long),
			"huge name length": append(be.AppendUint32(nil, 0xffffffff), 0, 0),
		}
		for name, d := range cases {
			for _, code := range []uint32{optInfo, optGo} {
				rs := c.opt(code, d)
				if len(rs) != 1 || rs[0].typ != repErrInvalid {
					t.Errorf("%s (option %d): %v, want ERR_INVALID", name, code, rs)
				}
			}
		}
		c.final(optList, nil, repAck)
	})

	t.Run("StartTLSWithoutTLS", func(t *testing.T) {
		c.t = t
		c.final(optStartTLS, nil, repErrPolicy)
		c.final(optStartTLS, []byte("x"), repErrPolicy)
	})

	t.Run("MetaContextBeforeStructured", func(t *testing.T) {
		c.t = t
		c.final(optSetMetaContext, encMeta("disk", MetaContextAllocation), repErrInvalid)
		c.final(optListMetaContext, encMeta("disk"), repErrInvalid)
	})

	t.Run("StructuredReply", func(t *testing.T) {
		c.t = t
		c.final(optStructuredReply, []byte{0}, repErrInvalid)
		if c.structured {
			t.Fatal("client thinks structured replies were negotiated")
		}
		c.final(optStructuredReply, nil, repAck)
	})

	t.Run("MalformedMetaContext", func(t *testing.T) {
		c.t = t
		long := strings.Repeat("q", maxString+1)
		cases := map[string][]byte{
			"empty":             {},
			"short":             {0, 0, 0, 0, 0, 0, 0},
			"name past end":     append(be.AppendUint32(nil, 100), 0, 0, 0, 0),
			"count too big":     encMeta("disk", "base:allocation")[:4+4+4],
			"query past end":    append(encMeta("disk")[:8], append(be.AppendUint32([]byte{0, 0, 0, 1}, 50), "base:"...)...),
			"trailing bytes":    append(encMeta("disk", "base:allocation"), 1),
			"query over 4 KiB":  encMeta("disk", long),
			"name over 4 KiB":   encMeta(long, "base:allocation"),
			"huge count":        append(encMeta("disk")[:8], 0xff, 0xff, 0xff, 0xff),
			"huge query length": append(encMeta("disk")[:8], 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff),
		}
		for name, d := range cases {
			for _, code := range []uint32{optListMetaContext, optSetMetaContext} {
				rs := c.opt(code, d)
				if len(rs) != 1 || rs[0].typ != repErrInvalid {
					t.Errorf("%s (option %d): %v, want ERR_INVALID", name, code, rs)
				}
			}
		}
	})

	t.Run("ListMetaContext", func(t *testing.T) {
		c.t = t
		for _, qs := range [][]string{nil, {"base:"}, {MetaContextAllocation}, {"x-foo:bar", "base:"}} {
			rs := c.opt(optListMetaContext, encMeta("disk", qs...))
			if len(rs) != 2 || rs[0].typ != repMetaContext || string(rs[0].data[4:]) != MetaContextAllocation || rs[1].typ != repAck {
				t.Errorf("LIST_META_CONTEXT %q: %v", qs, rs)
			}
		}
		for _, qs := range [][]string{{"x-foo:bar"}, {"base:nothing"}, {"qemu:dirty-bitmap:x"}} {
			rs := c.opt(optListMetaContext, encMeta("disk", qs...))
			if len(rs) != 1 || rs[0].typ != repAck {
				t.Errorf("LIST_META_CONTEXT %q: %v, want a single ACK", qs, rs)
			}
		}
	})

	t.Run("SetMetaContext", func(t *testing.T) {
		c.t = t
		rs := c.opt(optSetMetaContext, encMeta("disk", "x-foo:bar", MetaContextAllocation))
		if len(rs) != 2 || rs[0].typ != repMetaContext || len(rs[0].data) < 4 || string(rs[0].data[4:]) != MetaContextAllocation || rs[1].typ != repAck {
			t.Fatalf("SET_META_CONTEXT base:allocation: %v", rs)
		}
		// "base:" MUST be ignored by SET; no queries select nothing.
		for _, qs := range [][]string{{"base:"}, nil, {"x-foo:bar"}} {
			rs := c.opt(optSetMetaContext, encMeta("disk", qs...))
			if len(rs) != 1 || rs[0].typ != repAck {
				t.Errorf("SET_META_CONTEXT %q: %v, want a single ACK", qs, rs)
			}
		}
	})

	t.Run("Abort", func(t *testing.T) {
		c.t = t
		// The server SHOULD ignore data sent with ABORT.
		c.final(optAbort, []byte("ignored"), repAck)
		c.expectClosed("after ABORT")
	})
}

// INFO and GO report the flags the device supports; SEND_DF only with
// structured replies; READ_ONLY (and no write commands) for a read-only
// export.
func TestTransmissionFlags(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	ro, _ := sparseFile(t, testSize)
	_, addr := serve(t, dev, nil, &Export{Name: "ro", Device: ro, ReadOnly: true})

	c := connect(t, addr, clientFixed)
	info := parseInfoReplies(t, c.opt(optInfo, encInfoGo("disk")))
	if info.flags != rwFlags {
		t.Errorf("INFO flags %#x, want %#x", info.flags, rwFlags)
	}
	roInfo := parseInfoReplies(t, c.opt(optInfo, encInfoGo("ro")))
	if want := uint16(tflagHasFlags | tflagReadOnly | tflagSendFlush | tflagSendFUA | tflagMultiConn | tflagSendCache); roInfo.flags != want {
		t.Errorf("read-only INFO flags %#x, want %#x", roInfo.flags, want)
	}
	c.final(optStructuredReply, nil, repAck)
	sinfo := parseInfoReplies(t, c.opt(optInfo, encInfoGo("disk")))
	if sinfo.flags != rwFlags|tflagSendDF {
		t.Errorf("INFO flags with structured replies %#x, want %#x", sinfo.flags, rwFlags|tflagSendDF)
	}
	// GO right after the same INFO MUST give the same information.
	g := c.goExport("disk")
	if g.flags != sinfo.flags || g.size != sinfo.size {
		t.Errorf("GO %+v differs from INFO %+v", g, sinfo)
	}
	// No padding after GO's ACK: a request is answered at once.
	c.mustRead(0, 512)
}

// EXPORT_NAME answers with size and flags, plus 124 zero bytes unless the
// client set NO_ZEROES.
func TestExportName(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	s, addr := serve(t, dev, nil)
	for _, noZeroes := range []bool{false, true} {
		flags := uint32(clientFixed)
		if noZeroes {
			flags |= clientNoZeroes
		}
		c := connect(t, addr, flags)
		ei := c.exportName("disk", !noZeroes)
		if ei.size != testSize || ei.flags != rwFlags {
			t.Errorf("NO_ZEROES=%v: size %d flags %#x", noZeroes, ei.size, ei.flags)
		}
		// The stream is aligned: the next bytes are the reply to a READ.
		c.mustWrite(4096, []byte("hello"))
		if got := c.mustRead(4096, 5); string(got) != "hello" {
			t.Errorf("read back %q", got)
		}
		c.disc()
		c.expectClosed("after DISC")
	}
	// Non-fixed newstyle clients may only send EXPORT_NAME; that works.
	c := connect(t, addr, 0)
	c.exportName("disk", true)
	c.mustRead(0, 1)

	// An unknown export ends the session: EXPORT_NAME cannot error.
	c = connect(t, addr, clientFixed|clientNoZeroes)
	c.sendOption(optExportName, []byte("nope"))
	c.expectClosed("EXPORT_NAME of an unknown export")
	c.close()
	if !waitFor(5*time.Second, func() bool { return s.Connections() == 1 }) {
		t.Errorf("%d connections, want 1", s.Connections())
	}
}

// Malformed option framing ends (only) that connection.
func TestOptionFraming(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	s, addr := serve(t, dev, nil)

	c := connect(t, addr, clientFixed)
	b := encOption(optList, nil)
	b[0] ^= 0xff
	c.write(b)
	c.expectClosed("bad option magic")

	// An option longer than the server skips (32 MiB) ends the session;
	// a shorter one that is still too long is refused
	// (TestOversizedOptionRefused).
	c = connect(t, addr, clientFixed)
	h := encOption(99, nil)
	be.PutUint32(h[12:], maxSkippedOption+1)
	c.write(h)
	c.expectClosed("over-long option")

	// Closing mid-option is fine.
	c = connect(t, addr, clientFixed)
	c.write(encOption(optInfo, encInfoGo("disk"))[:20])
	c.close()

	good := connect(t, addr, clientFixed)
	good.goExport("disk")
	good.mustRead(0, 4096)
	if !waitFor(5*time.Second, func() bool { return s.Connections() == 1 }) {
		t.Errorf("%d connections, want 1", s.Connections())
	}
}

// ---- TLS ----

type tlsFixture struct {
	server     *tls.Config
	client     *tls.Config // presents a client certificate
	clientNoID *tls.Config // presents none
}

func newTLSFixture(t testing.TB) tlsFixture {
	t.Helper()
	ca, err := pki.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.ServerCertificate(t.TempDir(), []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	is, err := ca.IssueClient("alice", "uid-1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ccert, err := tls.X509KeyPair(is.CertPEM, is.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return tlsFixture{
		server: &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAndVerifyClientCert,
			ClientCAs: ca.Pool(), MinVersion: tls.VersionTLS12},
		client:     &tls.Config{Certificates: []tls.Certificate{ccert}, RootCAs: ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12},
		clientNoID: &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12},
	}
}

// tlsSeenExports records the TLS state Open was called with.
type tlsSeenExports struct {
	mapExports
	mu   sync.Mutex
	seen []*tls.ConnectionState
}

func (e *tlsSeenExports) Open(ctx context.Context, name string, cs *tls.ConnectionState) (*Export, error) {
	e.mu.Lock()
	e.seen = append(e.seen, cs)
	e.mu.Unlock()
	return e.mapExports.Open(ctx, name, cs)
}

func (e *tlsSeenExports) last() *tls.ConnectionState {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.seen) == 0 {
		return nil
	}
	return e.seen[len(e.seen)-1]
}

// drain closes c and waits until the server has let go of every
// connection (so that Server.Close in the cleanup finds none; see
// TestCloseWithTLSConnection for why that matters).
func drain(t *testing.T, s *Server, cs ...*rawClient) {
	t.Helper()
	for _, c := range cs {
		c.close()
	}
	if !waitFor(5*time.Second, func() bool { return s.Connections() == 0 }) {
		t.Fatalf("%d connections still open", s.Connections())
	}
}

// FORCEDTLS: every option but STARTTLS and ABORT gets ERR_TLS_REQD (and no
// information), EXPORT_NAME ends the session; after STARTTLS everything
// works and ERR_TLS_REQD is never sent again.
func TestForcedTLS(t *testing.T) {
	fx := newTLSFixture(t)
	dev, _ := sparseFile(t, testSize)
	exps := &tlsSeenExports{mapExports: mapExports{"disk": {Name: "disk", Device: dev}}}
	s, addr := serve(t, dev, func(s *Server) { s.TLS, s.RequireTLS, s.Exports = fx.server, true, exps })

	c := connect(t, addr, clientFixed|clientNoZeroes)
	for _, o := range []struct {
		code uint32
		data []byte
	}{
		{optList, nil},
		{optInfo, encInfoGo("disk", infoBlockSize)},
		{optGo, encInfoGo("disk")},
		{optInfo, encInfoGo("nope")},
		{optStructuredReply, nil},
		{optListMetaContext, encMeta("disk")},
		{optSetMetaContext, encMeta("disk", MetaContextAllocation)},
		{99, []byte("whatever")},
		{4, nil},
	} {
		rs := c.opt(o.code, o.data)
		if len(rs) != 1 || rs[0].typ != repErrTLSReqd {
			t.Errorf("option %d before TLS: %v, want only ERR_TLS_REQD", o.code, rs)
		}
	}
	if len(exps.seen) != 0 {
		t.Errorf("Exports.Open called %d times before TLS", len(exps.seen))
	}
	// STARTTLS with data is invalid; the session continues.
	c.final(optStartTLS, []byte("x"), repErrInvalid)
	if err := c.startTLS(fx.client); err != nil {
		t.Fatal(err)
	}
	c.final(optStartTLS, nil, repErrInvalid) // TLS is already active
	c.final(optList, nil, repAck)
	c.final(optStructuredReply, nil, repAck)
	rs := c.opt(optSetMetaContext, encMeta("disk", MetaContextAllocation))
	if rs[len(rs)-1].typ != repAck || len(rs) != 2 {
		t.Fatalf("SET_META_CONTEXT over TLS: %v", rs)
	}
	ei := c.goExport("disk", infoBlockSize)
	if ei.flags&tflagSendDF == 0 {
		t.Errorf("structured replies negotiated over TLS but no SEND_DF: %#x", ei.flags)
	}
	cs := exps.last()
	if cs == nil || len(cs.PeerCertificates) == 0 || cs.PeerCertificates[0].Subject.CommonName != "alice" {
		t.Errorf("Exports.Open did not see the client certificate: %+v", cs)
	}
	c.mustWrite(8192, []byte("over tls"))
	if got := c.mustRead(8192, 8); string(got) != "over tls" {
		t.Errorf("read back %q", got)
	}
	// Big payloads both ways: a plain-TCP shortcut (low-water mark,
	// MSG_MORE) taken under TLS would hang or send clear text.
	big := pattern(testSize/2+4096, 5)
	c.mustWrite(0, big)
	if !bytes.Equal(c.mustRead(0, uint32(len(big))), big) {
		t.Error("a big write over TLS did not read back")
	}
	if e, _, _ := c.do(0, cmdBlockStatus, 0, 4096, nil); e != 0 {
		t.Errorf("BLOCK_STATUS over TLS: errno %d", e)
	}
	c.disc()
	c.expectClosed("DISC over TLS")

	// EXPORT_NAME before TLS cannot be refused: the session ends.
	c = connect(t, addr, clientFixed|clientNoZeroes)
	c.sendOption(optExportName, []byte("disk"))
	c.expectClosed("EXPORT_NAME before STARTTLS")

	// ABORT is allowed before TLS.
	c = connect(t, addr, clientFixed)
	c.final(optAbort, nil, repAck)
	c.expectClosed("ABORT before STARTTLS")

	// A client without a certificate fails the handshake; the server
	// closes the session.
	c = connect(t, addr, clientFixed)
	if err := c.startTLS(fx.clientNoID); err == nil {
		// TLS 1.3 reports the rejected client certificate only on read.
		if _, err := c.tryOpt(optList, nil); err == nil {
			t.Error("a client without a certificate negotiated TLS")
		}
	}
	drain(t, s, c)
}

// The spec: after DISC the server MUST shut the TLS session down before
// closing the connection, so the client can tell the end of the session
// from a truncation; after ABORT the client shuts TLS down, and the
// server answers in kind.
func TestTLSShutdown(t *testing.T) {
	fx := newTLSFixture(t)
	dev, _ := sparseFile(t, testSize)
	s, addr := serve(t, dev, func(s *Server) { s.TLS, s.RequireTLS = fx.server, true })
	// TLS 1.2, whose record headers tell an alert (close_notify) from
	// data: TLS 1.3 encrypts the record type.
	cfg := fx.client.Clone()
	cfg.MaxVersion = tls.VersionTLS12

	c := connect(t, addr, clientFixed|clientNoZeroes)
	if err := c.startTLS(cfg); err != nil {
		t.Fatal(err)
	}
	c.goExport("disk")
	c.mustWrite(0, []byte("bye"))
	c.disc()
	c.expectTLSShutdown("DISC")

	c = connect(t, addr, clientFixed)
	if err := c.startTLS(cfg); err != nil {
		t.Fatal(err)
	}
	c.final(optAbort, nil, repAck)
	if err := c.nc.(*tls.Conn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	c.expectTLSShutdown("ABORT")
	drain(t, s, c)
}

// After STARTTLS no negotiation state survives: structured replies and
// the metadata context negotiated before must be negotiated again.
func TestStartTLSResetsState(t *testing.T) {
	fx := newTLSFixture(t)
	dev, _ := sparseFile(t, testSize)
	s, addr := serve(t, dev, func(s *Server) { s.TLS = fx.server })

	c := connect(t, addr, clientFixed|clientNoZeroes)
	// SELECTIVETLS: options work without TLS.
	c.final(optStructuredReply, nil, repAck)
	rs := c.opt(optSetMetaContext, encMeta("disk", MetaContextAllocation))
	if rs[len(rs)-1].typ != repAck || len(rs) != 2 {
		t.Fatalf("SET_META_CONTEXT: %v", rs)
	}
	if err := c.startTLS(fx.client); err != nil {
		t.Fatal(err)
	}
	ei := c.goExport("disk")
	if ei.flags&tflagSendDF != 0 {
		t.Errorf("SEND_DF advertised after STARTTLS reset structured replies: %#x", ei.flags)
	}
	// Replies are simple: a READ reply is magic, error, cookie, data.
	c.mustWrite(0, []byte("abc"))
	if got := c.mustRead(0, 3); string(got) != "abc" {
		t.Errorf("read %q", got)
	}
	cookie := uint64(0xabcdef)
	c.send(0, cmdBlockStatus, cookie, 0, 4096, nil)
	ch := c.reply(cookie)
	if len(ch) != 1 || !ch[0].simple || ch[0].errno != errInval {
		t.Errorf("BLOCK_STATUS after the context was reset by STARTTLS: %v, want a simple EINVAL", ch)
	}
	drain(t, s, c)
}

// Server.Close with a live connection that did STARTTLS. Under -race this
// reports a data race on conn.nc: startTLS (handshake.go, "c.nc, c.tls =
// tc, true") replaces c.nc in the connection's goroutine, and
// conn.shutdown, called by Server.Close from another goroutine, reads it
// (c.nc.Close()) with no synchronisation.
// (The race detector treats every socket write/read pair as a
// synchronisation, so the test must call Close without reading from the
// connection after the server finished its TLS handshake.)
func TestCloseWithTLSConnection(t *testing.T) {
	fx := newTLSFixture(t)
	dev, _ := sparseFile(t, testSize)
	s, addr := serve(t, dev, func(s *Server) { s.TLS, s.RequireTLS = fx.server, true })
	c := connect(t, addr, clientFixed)
	if err := c.startTLS(fx.client); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the server completes its side of the handshake
	done := make(chan struct{})
	go func() {
		s.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Server.Close did not return")
	}
	c.expectClosed("after Server.Close")
}

// tlsRequiredExports says TLS is required unless the client is "admin".
type tlsRequiredExports struct{ mapExports }

func (e tlsRequiredExports) Open(ctx context.Context, name string, cs *tls.ConnectionState) (*Export, error) {
	if cs == nil || len(cs.PeerCertificates) == 0 || !isAdmin(cs.PeerCertificates[0]) {
		return nil, ErrTLSRequired
	}
	return e.mapExports.Open(ctx, name, cs)
}

func isAdmin(c *x509.Certificate) bool { return c.Subject.CommonName == "admin" }

// The spec: a server MUST NOT send ERR_TLS_REQD once TLS is up, and never
// in NOTLS mode. An Exports returning ErrTLSRequired (documented as a
// valid answer) must not make the server break that rule.
func TestNoTLSReqdWhenMeaningless(t *testing.T) {
	fx := newTLSFixture(t)
	dev, _ := sparseFile(t, testSize)
	exps := tlsRequiredExports{mapExports{"disk": {Name: "disk", Device: dev}}}

	t.Run("AfterSTARTTLS", func(t *testing.T) {
		s, addr := serve(t, dev, func(s *Server) { s.TLS, s.Exports = fx.server, exps })
		c := connect(t, addr, clientFixed)
		if rs := c.opt(optInfo, encInfoGo("disk")); rs[0].typ != repErrTLSReqd {
			t.Errorf("INFO before TLS: %v", rs) // SELECTIVETLS, TLS-only export: fine
		}
		if err := c.startTLS(fx.client); err != nil {
			t.Fatal(err)
		}
		for _, code := range []uint32{optInfo, optGo} {
			rs := c.opt(code, encInfoGo("disk"))
			if r := rs[len(rs)-1]; r.typ == repErrTLSReqd {
				t.Errorf("option %d after STARTTLS answered ERR_TLS_REQD (spec: MUST NOT once TLS is initiated)", code)
			}
		}
		drain(t, s, c)
	})
	t.Run("NOTLS", func(t *testing.T) {
		s, addr := serve(t, dev, func(s *Server) { s.Exports = exps })
		c := connect(t, addr, clientFixed)
		for _, code := range []uint32{optInfo, optGo} {
			rs := c.opt(code, encInfoGo("disk"))
			if r := rs[len(rs)-1]; r.typ == repErrTLSReqd {
				t.Errorf("option %d on a server without TLS answered ERR_TLS_REQD (spec NOTLS mode: MUST NOT)", code)
			}
		}
		drain(t, s, c)
	})
}

// Every Open is matched by exactly one Release: INFO releases at once, GO
// when the connection ends.
func TestReleasePerOpen(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	var opens, releases atomic.Int32
	exps := countingExports{Export: &Export{Name: "disk", Device: dev}, opens: &opens, releases: &releases}
	s, addr := serve(t, dev, func(s *Server) { s.Exports = exps })

	c := connect(t, addr, clientFixed)
	c.opt(optInfo, encInfoGo("disk"))
	c.opt(optInfo, encInfoGo("disk"))
	if o, r := opens.Load(), releases.Load(); o != 2 || r != 2 {
		t.Errorf("after two INFOs: %d opens, %d releases", o, r)
	}
	c.goExport("disk")
	c.mustRead(0, 1)
	if r := releases.Load(); r != 2 {
		t.Errorf("release during transmission: %d", r)
	}
	c.disc()
	c.expectClosed("DISC")
	c2 := connect(t, addr, clientFixed|clientNoZeroes)
	c2.exportName("disk", false)
	c2.close()
	if !waitFor(5*time.Second, func() bool { return s.Connections() == 0 }) {
		t.Fatal("connections left")
	}
	if o, r := opens.Load(), releases.Load(); o != 4 || r != 4 {
		t.Errorf("at the end: %d opens, %d releases", o, r)
	}
}

type countingExports struct {
	*Export
	opens, releases *atomic.Int32
	revoked         <-chan struct{}
}

func (e countingExports) Open(_ context.Context, name string, _ *tls.ConnectionState) (*Export, error) {
	if name != e.Name {
		return nil, ErrUnknownExport
	}
	e.opens.Add(1)
	cp := *e.Export
	cp.Revoked = e.revoked
	cp.Release = func() { e.releases.Add(1) }
	return &cp, nil
}

// A client that stalls during haggling is dropped after HandshakeTimeout;
// one that idles in transmission is not.
func TestHandshakeTimeout(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	s, addr := serve(t, dev, func(s *Server) { s.HandshakeTimeout = 300 * time.Millisecond })
	stalled := connect(t, addr, clientFixed)
	stalled.write(encOption(optList, nil)[:10])
	idle, _ := open(t, addr, false, false)
	start := time.Now()
	stalled.expectClosed("stalled handshake")
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("stalled client dropped after %v", d)
	}
	time.Sleep(500 * time.Millisecond) // past the handshake deadline
	idle.mustRead(0, 512)
	if n := s.Connections(); n != 1 {
		t.Errorf("%d connections, want the idle one", n)
	}
}
