package nbd

import (
	"bytes"
	"testing"
)

// An option with more data than any option this server knows takes is
// still well framed: the spec lets a server skip what it does not
// understand, and wants options answered with errors, not the session
// dropped (save for a denial of service). Its data is discarded and the
// option refused; the session goes on.
func TestOversizedOptionRefused(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	_, addr := serve(t, dev, nil)
	big := bytes.Repeat([]byte{0xee}, maxOptionLen+1)
	meta := encMeta("disk", MetaContextAllocation)
	bigMeta := append(append([]byte{}, meta...), big...)

	c := connect(t, addr, clientFixed|clientNoZeroes)
	c.final(99, big, repErrUnsup)
	c.final(optList, nil, repAck) // still in step
	for _, code := range []uint32{optList, optStartTLS, optStructuredReply} {
		c.final(code, big, repErrInvalid) // they take no data
	}
	c.final(optInfo, append(encInfoGo("disk"), big...), repErrTooBig)
	c.final(optStructuredReply, nil, repAck)
	rs := c.opt(optSetMetaContext, meta)
	if len(rs) != 2 || rs[1].typ != repAck {
		t.Fatalf("SET_META_CONTEXT: %v", rs)
	}
	// A SET that fails still replaces the contexts selected before.
	c.final(optSetMetaContext, bigMeta, repErrTooBig)
	c.goExport("disk")
	cookie := uint64(0x51)
	c.send(0, cmdBlockStatus, cookie, 0, 4096, nil)
	if e, _ := c.reply(cookie)[0].err(); e != errInval {
		t.Errorf("BLOCK_STATUS after a refused SET_META_CONTEXT: errno %d, want EINVAL", e)
	}
	c.mustRead(0, 512)

	// ABORT's data is ignored, however long.
	c = connect(t, addr, clientFixed)
	c.final(optAbort, big, repAck)
	c.expectClosed("after ABORT")

	// EXPORT_NAME cannot be refused: no export has a name that long.
	c = connect(t, addr, clientFixed)
	c.sendOption(optExportName, big)
	c.expectClosed("EXPORT_NAME of an over-long name")

	// Beyond maxSkippedOption the option is taken for an attack.
	c = connect(t, addr, clientFixed)
	h := encOption(99, nil)
	be.PutUint32(h[12:], maxSkippedOption+1)
	c.write(h)
	c.expectClosed("option over maxSkippedOption")
}
