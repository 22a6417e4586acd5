package nbd

import (
	"context"
	"crypto/tls"
	"strings"
	"sync/atomic"
	"testing"
	"unicode/utf8"
)

// The protocol's strings are valid UTF-8 of at most 4096 bytes. An
// export's description is made from attachment fields nobody bounds (a
// host name given to the API), so NBD_INFO_DESCRIPTION must be cut to
// fit rather than sent as it is.
func TestInfoDescriptionIsAProtocolString(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	long := &Export{Name: "long", Description: strings.Repeat("é", 3000) + "\xff", Device: dev}
	_, addr := serve(t, dev, nil, long)
	c := connect(t, addr, clientFixed|clientNoZeroes)
	for _, code := range []uint32{optInfo, optGo} {
		rs := c.opt(code, encInfoGo("long", infoDescription))
		if last := rs[len(rs)-1]; last.typ != repAck {
			t.Fatalf("option %d: %v", code, rs)
		}
		ei := parseInfoReplies(t, rs)
		if !ei.haveDesc {
			t.Fatalf("option %d: no NBD_INFO_DESCRIPTION", code)
		}
		if len(ei.desc) > maxString || !utf8.ValidString(ei.desc) || !strings.HasPrefix(ei.desc, "éé") {
			t.Errorf("option %d: description of %d bytes (valid UTF-8: %v), want a prefix of at most %d bytes",
				code, len(ei.desc), utf8.ValidString(ei.desc), maxString)
		}
	}
	c.mustRead(0, 512) // in transmission after GO
}

// An export name longer than the protocol allows is not looked up: INFO
// and GO refuse it as malformed, and EXPORT_NAME, which cannot be
// refused, ends the session as for any export it cannot serve.
func TestOverlongExportName(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	var opens atomic.Int32
	exps := openCounter{mapExports: mapExports{"disk": {Name: "disk", Device: dev}}, opens: &opens}
	_, addr := serve(t, dev, func(s *Server) { s.Exports = exps })
	name := strings.Repeat("n", maxString+1)

	c := connect(t, addr, clientFixed|clientNoZeroes)
	c.final(optGo, encInfoGo(name), repErrInvalid)
	c.sendOption(optExportName, []byte(name))
	c.expectClosed("EXPORT_NAME of an over-long name")
	if n := opens.Load(); n != 0 {
		t.Errorf("Exports.Open called %d times for a name over %d bytes", n, maxString)
	}
	// The longest legal name is still looked up.
	c = connect(t, addr, clientFixed|clientNoZeroes)
	c.sendOption(optExportName, []byte(name[1:]))
	c.expectClosed("EXPORT_NAME of an unknown export")
	if n := opens.Load(); n != 1 {
		t.Errorf("Exports.Open called %d times for a name of %d bytes, want 1", n, maxString)
	}
}

type openCounter struct {
	mapExports
	opens *atomic.Int32
}

func (e openCounter) Open(ctx context.Context, name string, cs *tls.ConnectionState) (*Export, error) {
	e.opens.Add(1)
	return e.mapExports.Open(ctx, name, cs)
}
