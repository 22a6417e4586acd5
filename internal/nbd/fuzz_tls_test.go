package nbd

import (
	"bytes"
	"testing"
)

// FuzzHandshakeRequireTLS plays arbitrary client input against a server
// that requires TLS (the spec's FORCEDTLS). The input can never complete a
// TLS handshake, so whatever it says, every option reply the server sends
// before it acknowledges STARTTLS must be an error or the acknowledgement
// of ABORT: no export list, no export information, no transmission. A
// reply the server must not send (EXPORT_NAME's, for one) does not parse as
// an option reply and fails the check too.
func FuzzHandshakeRequireTLS(f *testing.F) {
	for _, s := range sessionSeeds() {
		f.Add(s)
	}
	for _, s := range tlsSessionSeeds() {
		f.Add(s)
	}
	fx := newTLSFixture(f)
	fs := newFuzzServer(f, func(s *Server) { s.TLS, s.RequireTLS = fx.server, true })
	f.Fuzz(func(t *testing.T, input []byte) {
		checkNothingBeforeTLS(t, fs.run(t, input))
	})
}

// tlsSessionSeeds start where a FORCEDTLS server's checks are: options
// before STARTTLS, STARTTLS with data, STARTTLS twice, and STARTTLS
// followed by bytes that are not a TLS ClientHello.
func tlsSessionSeeds() [][]byte {
	return [][]byte{
		new(session).flags(clientFixed).opt(optStructuredReply, nil).opt(optList, nil).
			opt(optInfo, encInfoGo("disk")).opt(optGo, encInfoGo("disk")).opt(optStartTLS, nil).
			raw([]byte{0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5}).b,
		new(session).flags(clientFixed).opt(optStartTLS, []byte("x")).opt(optExportName, []byte("disk")).b,
		new(session).flags(clientFixed).opt(optSetMetaContext, encMeta("disk", MetaContextAllocation)).
			opt(optAbort, nil).b,
		new(session).flags(clientFixed|clientNoZeroes).opt(optExportName, nil).req(0, cmdRead, 1, 0, 512, nil).b,
	}
}

// checkNothingBeforeTLS parses a FORCEDTLS server's output up to its
// acknowledgement of STARTTLS (after which TLS records follow).
func checkNothingBeforeTLS(t *testing.T, out []byte) {
	t.Helper()
	if len(out) < 18 || be.Uint64(out) != magicNBD || be.Uint64(out[8:]) != magicOpt {
		t.Fatalf("no greeting: % x", out[:min(len(out), 18)])
	}
	rest := out[18:]
	for len(rest) > 0 {
		if len(rest) < 20 || be.Uint64(rest) != magicOptReply {
			t.Fatalf("bytes that are not an option reply before TLS: % x", rest[:min(len(rest), 32)])
		}
		opt, typ, n := be.Uint32(rest[8:]), be.Uint32(rest[12:]), be.Uint32(rest[16:])
		if uint64(len(rest)-20) < uint64(n) {
			t.Fatalf("option %d: reply of %d bytes cut to %d", opt, n, len(rest)-20)
		}
		data := rest[20 : 20+n]
		rest = rest[20+n:]
		switch {
		case typ&repErr != 0:
			// Refused; which error depends on the input (TLS_REQD,
			// INVALID for a malformed option, POLICY for a client
			// without fixed newstyle, ...).
		case typ == repAck && opt == optAbort:
			if len(rest) != 0 {
				t.Fatalf("%d bytes after ABORT's acknowledgement", len(rest))
			}
		case typ == repAck && opt == optStartTLS && n == 0:
			return // TLS records follow
		default:
			t.Fatalf("option %d answered with reply %#x (% x) before TLS", opt, typ, data[:min(len(data), 16)])
		}
	}
}

// The seeds reach the checks they are for: every option before STARTTLS
// is refused with TLS_REQD, and EXPORT_NAME ends the connection silently.
func TestTLSSeedsRefusedBeforeTLS(t *testing.T) {
	fx := newTLSFixture(t)
	fs := newFuzzServer(t, func(s *Server) { s.TLS, s.RequireTLS = fx.server, true })
	seeds := tlsSessionSeeds()
	out := fs.run(t, seeds[0])
	checkNothingBeforeTLS(t, out)
	if c := bytes.Count(out, be.AppendUint32(nil, repErrTLSReqd)); c != 4 {
		t.Fatalf("seed 0: %d TLS_REQD replies, want 4 (STRUCTURED_REPLY, LIST, INFO, GO)", c)
	}
	if !bytes.Contains(out, append(be.AppendUint32(nil, optStartTLS), be.AppendUint32(nil, repAck)...)) {
		t.Fatal("seed 0: STARTTLS not acknowledged")
	}
	if out := fs.run(t, seeds[3]); len(out) != 18 {
		t.Fatalf("EXPORT_NAME without TLS: %d bytes after the greeting, want none", len(out)-18)
	}
	for _, s := range append(sessionSeeds(), seeds...) {
		checkNothingBeforeTLS(t, fs.run(t, s))
	}
}
