package nbd

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
)

// open connects and enters transmission on "disk", optionally with
// structured replies and the base:allocation context.
func open(t testing.TB, addr string, structured, meta bool) (*rawClient, exportInfo) {
	t.Helper()
	c := connect(t, addr, clientFixed|clientNoZeroes)
	if structured {
		c.final(optStructuredReply, nil, repAck)
	}
	if meta {
		rs := c.opt(optSetMetaContext, encMeta("disk", MetaContextAllocation))
		if len(rs) != 2 || rs[0].typ != repMetaContext {
			t.Fatalf("SET_META_CONTEXT: %v", rs)
		}
	}
	return c, c.goExport("disk", infoBlockSize)
}

func modes(t *testing.T, f func(t *testing.T, structured bool)) {
	t.Run("simple", func(t *testing.T) { f(t, false) })
	t.Run("structured", func(t *testing.T) { f(t, true) })
}

func TestReadWrite(t *testing.T) {
	modes(t, func(t *testing.T, structured bool) {
		dev, path := sparseFile(t, testSize)
		_, addr := serve(t, dev, nil)
		c, _ := open(t, addr, structured, false)
		p := pattern(10000, 3)
		c.mustWrite(12345, p)
		if e := c.writeAt(cflagFUA, 100, []byte("fua")); e != 0 {
			t.Fatalf("FUA write: errno %d", e)
		}
		if got := c.mustRead(12345, 10000); !bytes.Equal(got, p) {
			t.Fatal("read back differs")
		}
		if got := c.mustRead(0, 4096); !bytes.Equal(got[100:103], []byte("fua")) || got[0] != 0 {
			t.Fatal("FUA write not read back")
		}
		// The last byte of the export.
		c.mustWrite(testSize-1, []byte{0x5a})
		if got := c.mustRead(testSize-1, 1); got[0] != 0x5a {
			t.Fatal("last byte")
		}
		b, _ := os.ReadFile(path)
		if !bytes.Equal(b[12345:12345+10000], p) || b[testSize-1] != 0x5a {
			t.Fatal("backing file lacks the data")
		}
		// Structured READ: one OFFSET_DATA chunk, flagged DONE, offset echoed.
		if structured {
			c.send(cflagDF, cmdRead, 77, 12345, 100, nil)
			cs := c.reply(77)
			if len(cs) != 1 || cs[0].typ != replyTypeOffsetData || cs[0].flags != replyFlagDone ||
				be.Uint64(cs[0].payload) != 12345 || !bytes.Equal(cs[0].payload[8:], p[:100]) {
				t.Fatalf("structured READ reply %v", cs)
			}
		}
		// Zero-length TRIM and WRITE_ZEROES succeed (and do nothing).
		for _, typ := range []uint16{cmdTrim, cmdWriteZeroes, cmdCache} {
			if e := c.cmd(0, typ, 0, 0); e != 0 {
				t.Errorf("%s of length 0: errno %d", commandName(typ), e)
			}
		}
		c.disc()
		c.expectClosed("DISC")
	})
}

// Many requests in flight on one connection, all sent before any reply is
// read: each is answered exactly once, with its own cookie.
func TestPipelined(t *testing.T) {
	modes(t, func(t *testing.T, structured bool) {
		dev, _ := sparseFile(t, testSize)
		_, addr := serve(t, dev, nil)
		c, _ := open(t, addr, structured, false)
		// Regions 0..31 are written first; the pipelined requests read
		// them while writing regions 32..63.
		const n, region = 64, 8192
		for i := 0; i < n/2; i++ {
			c.mustWrite(uint64(i*region), pattern(region, byte(i)))
		}
		type req struct {
			typ uint16
			i   int
		}
		cookies := map[uint64]req{}
		var order []uint64
		for i := 0; i < n; i++ {
			// Cookies are opaque: include 0, the maximum and big gaps.
			cookie := uint64(i) * 0x0123456789abcdef
			if i == n-1 {
				cookie = math.MaxUint64
			}
			typ := uint16(cmdRead)
			if i%2 == 1 {
				typ = cmdWrite
			}
			cookies[cookie] = req{typ, i}
			order = append(order, cookie)
		}
		sendErr := make(chan error, 1)
		go func() {
			for _, cookie := range order {
				r := cookies[cookie]
				var err error
				if r.typ == cmdRead {
					err = c.send(0, cmdRead, cookie, uint64(r.i/2*region), region, nil)
				} else {
					err = c.send(0, cmdWrite, cookie, uint64((n/2+r.i/2)*region), region, pattern(region, byte(n/2+r.i/2)))
				}
				if err != nil {
					sendErr <- err
					return
				}
			}
			sendErr <- nil
		}()
		seen := map[uint64]int{}
		for range order {
			ch, err := c.readReply()
			if err != nil {
				t.Fatal(err)
			}
			r, ok := cookies[ch.cookie]
			if !ok {
				t.Fatalf("reply with unknown cookie %#x", ch.cookie)
			}
			seen[ch.cookie]++
			if seen[ch.cookie] > 1 {
				t.Fatalf("cookie %#x answered twice", ch.cookie)
			}
			if !ch.simple && ch.flags&replyFlagDone == 0 {
				t.Fatalf("chunk without DONE: %v", ch)
			}
			if e, msg := ch.err(); e != 0 {
				t.Fatalf("%s %d: errno %d %s", commandName(r.typ), r.i, e, msg)
			}
			if r.typ == cmdRead && !bytes.Equal(ch.data(), pattern(region, byte(r.i/2))) {
				t.Fatalf("READ %d returned wrong data", r.i)
			}
		}
		if err := <-sendErr; err != nil {
			t.Fatal(err)
		}
		for i := n / 2; i < n; i++ {
			if !bytes.Equal(c.mustRead(uint64(i*region), region), pattern(region, byte(i))) {
				t.Fatalf("pipelined WRITE to region %d not read back", i)
			}
		}
	})
}

// Replies come back out of order when a request finishes early: the
// server does not serialise requests.
func TestOutOfOrderReplies(t *testing.T) {
	file, _ := sparseFile(t, testSize)
	release := make(chan struct{})
	dev := &hookDevice{Device: file, read: func(p []byte, off int64, next func([]byte, int64) error) error {
		if off == 0 {
			<-release // held until the later requests have been answered
		}
		return next(p, off)
	}}
	_, addr := serve(t, dev, nil)
	c, _ := open(t, addr, true, false)
	const slow = 1000
	c.send(0, cmdRead, slow, 0, 4096, nil)
	var got []uint64
	for i := uint64(1); i <= 5; i++ {
		c.send(0, cmdRead, i, 4096*i, 4096, nil)
		c.send(0, cmdWrite, 100+i, 65536*i, 4, []byte("abcd"))
	}
	for range 10 {
		ch, err := c.readReply()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ch.cookie)
	}
	close(release)
	ch, err := c.readReply()
	if err != nil || ch.cookie != slow {
		t.Fatalf("last reply %v %v, want the slow READ", ch, err)
	}
	t.Logf("reply order: %v then %d", got, slow)
}

// checkErr sends one request and checks the error value (and that a
// structured error carries a message).
func checkErr(t *testing.T, c *rawClient, structured bool, what string, flags, typ uint16, off uint64, length uint32, payload []byte, want uint32) {
	t.Helper()
	cookie := cookieSeq.Add(1)
	if err := c.send(flags, typ, cookie, off, length, payload); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	cs := c.reply(cookie)
	e, msg := cs[len(cs)-1].err()
	if e != want {
		t.Errorf("%s: errno %d, want %d (%v)", what, e, want, cs)
	}
	if structured {
		for _, ch := range cs {
			if ch.simple && typ == cmdRead {
				t.Errorf("%s: simple reply to a READ with structured replies negotiated", what)
			}
		}
		if want != 0 {
			last := cs[len(cs)-1]
			if last.simple || last.typ != replyTypeError {
				t.Errorf("%s: error not sent as an error chunk: %v", what, last)
			} else if msg == "" || 6+int(be.Uint16(last.payload[4:])) != len(last.payload) {
				t.Errorf("%s: error chunk without a (well-framed) message: %v", what, last)
			}
		}
	}
}

func TestRequestErrors(t *testing.T) {
	modes(t, func(t *testing.T, structured bool) {
		dev, _ := sparseFile(t, testSize)
		_, addr := serve(t, dev, nil)
		c, _ := open(t, addr, structured, false)
		const end = testSize
		for _, tc := range []struct {
			what    string
			flags   uint16
			typ     uint16
			off     uint64
			length  uint32
			payload []byte
			want    uint32
		}{
			{"READ beyond end", 0, cmdRead, end - 10, 11, nil, errInval},
			{"READ at end+1", 0, cmdRead, end + 1, 0, nil, errInval},
			{"READ offset overflow", 0, cmdRead, math.MaxUint64 - 1, 4096, nil, errInval},
			{"WRITE beyond end", 0, cmdWrite, end - 1, 2, []byte{1, 2}, errNoSpc},
			{"WRITE far beyond end", 0, cmdWrite, 1 << 40, 1, []byte{1}, errNoSpc},
			{"WRITE_ZEROES beyond end", 0, cmdWriteZeroes, end - 4096, 8192, nil, errNoSpc},
			{"TRIM beyond end", 0, cmdTrim, end, 1, nil, errInval},
			{"CACHE beyond end", 0, cmdCache, end, 1, nil, errInval},
			{"READ over 32 MiB", 0, cmdRead, 0, MaxPayload + 1, nil, errInval},
			{"READ of 4 GiB", 0, cmdRead, 0, math.MaxUint32, nil, errInval},
			{"unknown command 8", 0, 8, 0, 0, nil, errInval},
			{"unknown command 0xffff", 0, 0xffff, 0, 4096, nil, errInval},
			{"unknown flag on READ", 1 << 5, cmdRead, 0, 512, nil, errInval},
			{"NO_HOLE on READ", cflagNoHole, cmdRead, 0, 512, nil, errInval},
			{"REQ_ONE on WRITE", cflagReqOne, cmdWrite, 0, 1, []byte{1}, errInval},
			{"FAST_ZERO on TRIM", cflagFastZero, cmdTrim, 0, 512, nil, errInval},
			{"NO_HOLE on FLUSH", cflagNoHole, cmdFlush, 0, 0, nil, errInval},
			{"DF on CACHE", cflagDF, cmdCache, 0, 512, nil, errInval},
			{"high flag on WRITE_ZEROES", 1 << 15, cmdWriteZeroes, 0, 512, nil, errInval},
			{"BLOCK_STATUS without a context", 0, cmdBlockStatus, 0, 4096, nil, errInval},
			{"FUA on READ (valid for all commands)", cflagFUA, cmdRead, 0, 512, nil, 0},
			{"FUA on FLUSH", cflagFUA, cmdFlush, 0, 0, nil, 0},
			{"CACHE", 0, cmdCache, 0, 4096, nil, 0},
		} {
			checkErr(t, c, structured, tc.what, tc.flags, tc.typ, tc.off, tc.length, tc.payload, tc.want)
		}
		wantDF := uint32(errInval) // DF needs SEND_DF, i.e. structured replies
		if structured {
			wantDF = 0
		}
		checkErr(t, c, structured, "DF on READ", cflagDF, cmdRead, 0, 512, nil, wantDF)
		// EOVERFLOW is kept for an oversized read that asked for one chunk.
		wantDFOver := uint32(errInval)
		if structured {
			wantDFOver = errOverflow
		}
		checkErr(t, c, structured, "DF on READ over 32 MiB", cflagDF, cmdRead, 0, MaxPayload+1, nil, wantDFOver)
		// The connection is still usable after all of that.
		c.mustWrite(0, []byte("still here"))
		if got := c.mustRead(0, 10); string(got) != "still here" {
			t.Fatalf("read %q", got)
		}
	})
}

// A WRITE over 32 MiB is refused, its payload consumed, and the
// connection stays in sync.
func TestOversizedWrite(t *testing.T) {
	modes(t, func(t *testing.T, structured bool) {
		dev, path := sparseFile(t, testSize)
		s, addr := serve(t, dev, nil)
		c, _ := open(t, addr, structured, false)
		payload := bytes.Repeat([]byte{0xcc}, MaxPayload+1)
		checkErr(t, c, structured, "WRITE over 32 MiB", 0, cmdWrite, 0, uint32(len(payload)), payload, errInval)
		c.mustWrite(512, []byte("after"))
		if got := c.mustRead(0, 1024); got[0] != 0 || string(got[512:517]) != "after" {
			t.Fatal("data after the refused write")
		}
		if b, _ := os.ReadFile(path); bytes.IndexByte(b, 0xcc) >= 0 {
			t.Fatal("the refused payload reached the device")
		}
		if s.Connections() != 1 {
			t.Fatalf("%d connections", s.Connections())
		}
	})
}

func TestReadOnlyExport(t *testing.T) {
	modes(t, func(t *testing.T, structured bool) {
		file, path := sparseFile(t, testSize)
		var writes atomic.Int32
		dev := &hookDevice{Device: file,
			write: func(p []byte, off int64, fua bool, next func([]byte, int64, bool) error) error {
				writes.Add(1)
				return next(p, off, fua)
			},
			writeZeroes: func(off, n int64, f block.ZeroFlags, next func(int64, int64, block.ZeroFlags) error) error {
				writes.Add(1)
				return next(off, n, f)
			},
			trim: func(off, n int64, fua bool, next func(int64, int64, bool) error) error {
				writes.Add(1)
				return next(off, n, fua)
			}}
		if err := os.WriteFile(path, bytes.Repeat([]byte{7}, testSize), 0o600); err != nil {
			t.Fatal(err)
		}
		_, addr := serve(t, nil, func(s *Server) {
			s.Exports = mapExports{"disk": {Name: "disk", Device: dev, ReadOnly: true}}
		})
		c, ei := open(t, addr, structured, false)
		if ei.flags&tflagReadOnly == 0 || ei.flags&(tflagSendTrim|tflagSendZeroes|tflagSendFastZero) != 0 {
			t.Errorf("read-only export flags %#x", ei.flags)
		}
		checkErr(t, c, structured, "WRITE", 0, cmdWrite, 0, 4, []byte("evil"), errPerm)
		checkErr(t, c, structured, "WRITE FUA", cflagFUA, cmdWrite, 0, 4, []byte("evil"), errPerm)
		checkErr(t, c, structured, "WRITE_ZEROES", 0, cmdWriteZeroes, 0, 4096, nil, errPerm)
		checkErr(t, c, structured, "TRIM", 0, cmdTrim, 0, 4096, nil, errPerm)
		checkErr(t, c, structured, "FLUSH", 0, cmdFlush, 0, 0, nil, 0)
		if got := c.mustRead(0, 4096); !bytes.Equal(got, bytes.Repeat([]byte{7}, 4096)) {
			t.Fatal("data changed")
		}
		if b, _ := os.ReadFile(path); !bytes.Equal(b[:4096], bytes.Repeat([]byte{7}, 4096)) {
			t.Fatal("file changed")
		}
		if n := writes.Load(); n != 0 {
			t.Fatalf("%d write operations reached the device", n)
		}
	})
}

func TestWriteZeroesAndTrim(t *testing.T) {
	file, _ := sparseFile(t, testSize)
	var lastZero atomic.Value
	dev := &hookDevice{Device: file, writeZeroes: func(off, n int64, f block.ZeroFlags, next func(int64, int64, block.ZeroFlags) error) error {
		lastZero.Store(f)
		if off == 0x40000 && f.Fast {
			return block.ErrNotSupported // "cannot do this fast"
		}
		return next(off, n, f)
	}}
	_, addr := serve(t, dev, nil)
	c, ei := open(t, addr, true, false)
	if ei.flags&tflagSendFastZero == 0 {
		t.Fatalf("no SEND_FAST_ZERO: %#x", ei.flags)
	}
	fill := bytes.Repeat([]byte{0xff}, 65536)
	for _, flags := range []uint16{0, cflagNoHole, cflagFastZero, cflagFastZero | cflagNoHole | cflagFUA} {
		c.mustWrite(0, fill)
		if e := c.cmd(flags, cmdWriteZeroes, 4096, 8192); e != 0 {
			t.Fatalf("WRITE_ZEROES flags %#x: errno %d", flags, e)
		}
		got := c.mustRead(0, 65536)
		if !bytes.Equal(got[4096:12288], make([]byte, 8192)) || got[4095] != 0xff || got[12288] != 0xff {
			t.Fatalf("WRITE_ZEROES flags %#x: wrong data", flags)
		}
		f := lastZero.Load().(block.ZeroFlags)
		if f.NoHole != (flags&cflagNoHole != 0) || f.Fast != (flags&cflagFastZero != 0) || f.FUA != (flags&cflagFUA != 0) {
			t.Errorf("flags %#x reached the device as %+v", flags, f)
		}
	}
	// A fast zero the device cannot do fast fails with ENOTSUP, changing
	// nothing.
	c.mustWrite(0x40000, fill)
	checkErr(t, c, true, "slow FAST_ZERO", cflagFastZero, cmdWriteZeroes, 0x40000, 4096, nil, errNotSup)
	if got := c.mustRead(0x40000, 4096); !bytes.Equal(got, fill[:4096]) {
		t.Fatal("failed FAST_ZERO changed data")
	}
	// Without FAST_ZERO it must not fail with ENOTSUP.
	if e := c.cmd(0, cmdWriteZeroes, 0x40000, 4096); e != 0 {
		t.Fatalf("WRITE_ZEROES: errno %d", e)
	}
	// TRIM succeeds; afterwards nothing is promised about the contents.
	if e := c.cmd(cflagFUA, cmdTrim, 0, 65536); e != 0 {
		t.Fatalf("TRIM: errno %d", e)
	}

	// A device that cannot zero fast: no SEND_FAST_ZERO, and the flag is
	// refused with EINVAL.
	noFast := &hookDevice{Device: file, caps: func(c block.Capabilities) block.Capabilities { c.FastZero = false; return c }}
	_, addr2 := serve(t, noFast, nil)
	c2, ei2 := open(t, addr2, true, false)
	if ei2.flags&tflagSendFastZero != 0 || ei2.flags&tflagSendZeroes == 0 {
		t.Fatalf("flags %#x", ei2.flags)
	}
	checkErr(t, c2, true, "FAST_ZERO not negotiated", cflagFastZero, cmdWriteZeroes, 0, 4096, nil, errInval)
	// A device with neither trim nor zeroing.
	bare := &hookDevice{Device: file, caps: func(c block.Capabilities) block.Capabilities {
		c.Trim, c.WriteZeroes, c.FastZero = false, false, false
		return c
	}}
	_, addr3 := serve(t, bare, nil)
	c3, ei3 := open(t, addr3, false, false)
	if ei3.flags&(tflagSendTrim|tflagSendZeroes|tflagSendFastZero) != 0 {
		t.Fatalf("flags %#x", ei3.flags)
	}
	checkErr(t, c3, false, "TRIM unsupported", 0, cmdTrim, 0, 4096, nil, errInval)
	checkErr(t, c3, false, "WRITE_ZEROES unsupported", 0, cmdWriteZeroes, 0, 4096, nil, errInval)
}

// FUA was not advertised (the device cannot do it): a FUA request is
// invalid ("whether a flag is valid may depend on negotiation"), and in any
// case the device must not be asked for a FUA write it did not declare.
func TestFUANotNegotiated(t *testing.T) {
	file, _ := sparseFile(t, testSize)
	var fuaWrites atomic.Int32
	dev := &hookDevice{Device: file,
		caps: func(c block.Capabilities) block.Capabilities { c.FUA = false; return c },
		write: func(p []byte, off int64, fua bool, next func([]byte, int64, bool) error) error {
			if fua {
				fuaWrites.Add(1)
				return block.ErrNotSupported // the Device contract for undeclared operations
			}
			return next(p, off, fua)
		}}
	_, addr := serve(t, dev, nil)
	c, ei := open(t, addr, true, false)
	if ei.flags&tflagSendFUA != 0 {
		t.Fatalf("SEND_FUA advertised for a device without FUA: %#x", ei.flags)
	}
	checkErr(t, c, true, "FUA WRITE without SEND_FUA", cflagFUA, cmdWrite, 0, 4, []byte("data"), errInval)
	if n := fuaWrites.Load(); n != 0 {
		t.Errorf("the device was asked for %d FUA writes although it declared no FUA support", n)
	}
}

// A read of length 0 with structured replies: the behaviour is
// unspecified, but the reply must still be a valid structured reply, and an
// NBD_REPLY_TYPE_OFFSET_DATA chunk "MUST be at least 9" bytes long (it
// describes at least one byte).
func TestZeroLengthRead(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	_, addr := serve(t, dev, nil)
	c, _ := open(t, addr, true, false)
	c.send(0, cmdRead, 42, 0, 0, nil)
	for _, ch := range c.reply(42) {
		switch {
		case ch.simple:
			t.Errorf("simple reply to a READ with structured replies: %v", ch)
		case ch.typ == replyTypeOffsetData && len(ch.payload) < 9:
			t.Errorf("OFFSET_DATA chunk of length %d (spec: at least 9); send NBD_REPLY_TYPE_NONE instead", len(ch.payload))
		case ch.typ == replyTypeNone && (len(ch.payload) != 0 || ch.flags&replyFlagDone == 0):
			t.Errorf("NBD_REPLY_TYPE_NONE chunk with %d bytes, flags %#x (spec: length 0, DONE)", len(ch.payload), ch.flags)
		}
	}
	c.mustRead(0, 16) // still in sync
	// Simple replies: a zero-length READ is just a header.
	c2, _ := open(t, addr, false, false)
	if d := c2.mustRead(0, 0); len(d) != 0 {
		t.Fatal("data for a zero-length read")
	}
	c2.mustRead(0, 16)
}

func TestBlockStatus(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	s, addr := serve(t, dev, nil, &Export{Name: "other", Device: dev})

	// The context was set for another export than the one chosen: EINVAL.
	c1 := connect(t, addr, clientFixed|clientNoZeroes)
	c1.final(optStructuredReply, nil, repAck)
	c1.opt(optSetMetaContext, encMeta("other", MetaContextAllocation))
	c1.goExport("disk")
	checkErr(t, c1, true, "BLOCK_STATUS with the context of another export", 0, cmdBlockStatus, 0, 4096, nil, errInval)
	// And none selected: EINVAL.
	c2 := connect(t, addr, clientFixed|clientNoZeroes)
	c2.final(optStructuredReply, nil, repAck)
	c2.opt(optSetMetaContext, encMeta("disk", "base:"))
	c2.goExport("disk")
	checkErr(t, c2, true, "BLOCK_STATUS with no context selected", 0, cmdBlockStatus, 0, 4096, nil, errInval)

	c, _ := open(t, addr, true, true)
	status := func(flags uint16, off uint64, length uint32) [][2]uint32 {
		t.Helper()
		cookie := cookieSeq.Add(1)
		c.send(flags, cmdBlockStatus, cookie, off, length, nil)
		cs := c.reply(cookie)
		if len(cs) != 1 || cs[0].typ != replyTypeBlockStatus {
			t.Fatalf("BLOCK_STATUS %d+%d: %v", off, length, cs)
		}
		p := cs[0].payload
		if len(p) < 12 || (len(p)-4)%8 != 0 {
			t.Fatalf("BLOCK_STATUS chunk length %d (spec: 4 + a positive multiple of 8)", len(p))
		}
		if id := be.Uint32(p); id != metaContextID {
			t.Fatalf("context id %d", id)
		}
		var exts [][2]uint32
		var sum uint64
		for i := 4; i < len(p); i += 8 {
			l, st := be.Uint32(p[i:]), be.Uint32(p[i+4:])
			if l == 0 {
				t.Fatalf("zero-length extent")
			}
			if i+8 < len(p) {
				sum += uint64(l) // the first N-1 extents must sum to < length
			}
			exts = append(exts, [2]uint32{l, st})
		}
		if sum >= uint64(length) {
			t.Fatalf("first extents cover %d of a %d-byte request", sum, length)
		}
		if flags&cflagReqOne != 0 && (len(exts) != 1 || exts[0][0] > length) {
			t.Fatalf("REQ_ONE reply %v for length %d", exts, length)
		}
		return exts
	}
	hz := uint32(stateHole | stateZero)
	if got := status(0, 0, testSize); len(got) != 1 || got[0] != [2]uint32{testSize, hz} {
		t.Errorf("sparse export: %v, want one hole+zero extent", got)
	}
	c.mustWrite(65536, pattern(4096, 1))
	got := status(0, 0, testSize)
	want := [][2]uint32{{65536, hz}, {4096, 0}, {testSize - 65536 - 4096, hz}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after a write at 64 KiB: %v, want %v", got, want)
	}
	if got := status(0, 65536, 8192); len(got) < 1 || got[0] != [2]uint32{4096, 0} {
		t.Errorf("status from the data: %v", got)
	}
	if got := status(cflagReqOne, 0, testSize); len(got) != 1 || got[0] != [2]uint32{65536, hz} {
		t.Errorf("REQ_ONE: %v", got)
	}
	if got := status(cflagReqOne, 0, 100); got[0] != [2]uint32{100, hz} {
		t.Errorf("REQ_ONE on a short range: %v", got)
	}
	if got := status(cflagReqOne|cflagFUA, 65536+100, 10); got[0] != [2]uint32{10, 0} {
		t.Errorf("REQ_ONE inside data: %v", got)
	}
	checkErr(t, c, true, "BLOCK_STATUS beyond the end", 0, cmdBlockStatus, testSize-1, 2, nil, errInval)
	checkErr(t, c, true, "BLOCK_STATUS of length 0", 0, cmdBlockStatus, 0, 0, nil, errInval)
	checkErr(t, c, true, "BLOCK_STATUS with DF", cflagDF, cmdBlockStatus, 0, 512, nil, errInval)
	drain(t, s, c, c1, c2)
}

// A device that fails the extent lookup: the server reports the whole
// range with status 0 ("unknown"), which the spec allows.
func TestBlockStatusDeviceError(t *testing.T) {
	file, _ := sparseFile(t, testSize)
	dev := &hookDevice{Device: file, extents: func(off, n int64, next func(int64, int64) ([]block.Extent, error)) ([]block.Extent, error) {
		return nil, errors.New("no idea")
	}}
	_, addr := serve(t, dev, nil)
	c, _ := open(t, addr, true, true)
	c.send(0, cmdBlockStatus, 9, 4096, 8192, nil)
	cs := c.reply(9)
	if len(cs) != 1 || cs[0].typ != replyTypeBlockStatus || len(cs[0].payload) != 12 ||
		be.Uint32(cs[0].payload[4:]) != 8192 || be.Uint32(cs[0].payload[8:]) != 0 {
		t.Fatalf("reply %v", cs)
	}
}

// A device I/O error becomes EIO and the connection survives.
func TestDeviceIOError(t *testing.T) {
	modes(t, func(t *testing.T, structured bool) {
		file, _ := sparseFile(t, testSize)
		boom := errors.New("medium error")
		dev := &hookDevice{Device: file,
			read: func(p []byte, off int64, next func([]byte, int64) error) error {
				if off == 8192 {
					return boom
				}
				return next(p, off)
			},
			write: func(p []byte, off int64, fua bool, next func([]byte, int64, bool) error) error {
				if off == 8192 {
					return fmt.Errorf("wrapped: %w", boom)
				}
				return next(p, off, fua)
			},
			flush: func(next func() error) error { return boom },
		}
		s, addr := serve(t, dev, nil)
		c, _ := open(t, addr, structured, false)
		checkErr(t, c, structured, "failing READ", 0, cmdRead, 8192, 4096, nil, errIO)
		checkErr(t, c, structured, "failing WRITE", 0, cmdWrite, 8192, 3, []byte("abc"), errIO)
		checkErr(t, c, structured, "failing FLUSH", 0, cmdFlush, 0, 0, nil, errIO)
		c.mustWrite(0, []byte("ok"))
		if got := c.mustRead(0, 2); string(got) != "ok" {
			t.Fatalf("read %q", got)
		}
		if s.Connections() != 1 {
			t.Fatalf("%d connections", s.Connections())
		}
	})
}

// Device errors with a protocol meaning map to their NBD error values.
func TestErrnoMapping(t *testing.T) {
	fastZero := request{typ: cmdWriteZeroes, flags: cflagFastZero}
	for _, tc := range []struct {
		req  request
		err  error
		want uint32
	}{
		{request{typ: cmdWrite}, block.ErrReadOnly, errPerm},
		{fastZero, block.ErrNotSupported, errNotSup},
		{request{typ: cmdWriteZeroes}, block.ErrNotSupported, errInval},
		{request{typ: cmdTrim}, block.ErrNotSupported, errInval},
		{request{typ: cmdWrite}, fmt.Errorf("w: %w", block.ErrNotSupported), errInval},
		{request{typ: cmdRead}, block.ErrOutOfRange, errInval},
		{request{typ: cmdRead}, fmt.Errorf("x: %w", errors.New("?")), errIO},
		{request{typ: cmdFlush}, block.ErrClosed, errShutdown},
		{request{typ: cmdWrite}, os.NewSyscallError("pwrite", syscall.ENOSPC), errNoSpc},
		{request{typ: cmdWrite}, os.NewSyscallError("pwrite", syscall.EDQUOT), errNoSpc},
		{request{typ: cmdWrite}, os.NewSyscallError("pwrite", syscall.EFBIG), errNoSpc},
		{request{typ: cmdWrite}, fmt.Errorf("mirror: %w", &os.PathError{Op: "write", Path: "f", Err: syscall.EROFS}), errPerm},
		{request{typ: cmdFlush}, os.NewSyscallError("fsync", syscall.EROFS), errPerm},
	} {
		if got := errnoOf(tc.req, tc.err); got != tc.want {
			t.Errorf("errnoOf(%s flags %#x, %v) = %d, want %d", commandName(tc.req.typ), tc.req.flags, tc.err, got, tc.want)
		}
	}
}

// The spec keeps NBD_ENOTSUP for a WRITE_ZEROES with FAST_ZERO: a device
// that finds at run time that it cannot trim or zero makes the client see
// EINVAL otherwise.
func TestNotSupportedOnlyForFastZero(t *testing.T) {
	file, _ := sparseFile(t, testSize)
	dev := &hookDevice{Device: file,
		writeZeroes: func(off, n int64, f block.ZeroFlags, next func(int64, int64, block.ZeroFlags) error) error {
			return block.ErrNotSupported
		},
		trim: func(off, n int64, fua bool, next func(int64, int64, bool) error) error {
			return fmt.Errorf("fallocate: %w", block.ErrNotSupported)
		},
	}
	_, addr := serve(t, dev, nil)
	c, _ := open(t, addr, true, false)
	checkErr(t, c, true, "TRIM the device cannot do", 0, cmdTrim, 0, 4096, nil, errInval)
	checkErr(t, c, true, "WRITE_ZEROES the device cannot do", 0, cmdWriteZeroes, 0, 4096, nil, errInval)
	checkErr(t, c, true, "WRITE_ZEROES with NO_HOLE the device cannot do", cflagNoHole, cmdWriteZeroes, 0, 4096, nil, errInval)
	checkErr(t, c, true, "FAST_ZERO the device cannot do fast", cflagFastZero, cmdWriteZeroes, 0, 4096, nil, errNotSup)
}

// A FLUSH reply is sent only after the device's Flush returned, and
// writes answered before the FLUSH were handed to the device before it.
func TestFlushOrdering(t *testing.T) {
	file, _ := sparseFile(t, testSize)
	var mu sync.Mutex
	var events []string
	var flushes atomic.Int32
	var flushReturned atomic.Bool
	dev := &hookDevice{Device: file,
		write: func(p []byte, off int64, fua bool, next func([]byte, int64, bool) error) error {
			err := next(p, off, fua)
			mu.Lock()
			events = append(events, fmt.Sprintf("write %d fua=%v", off, fua))
			mu.Unlock()
			return err
		},
		flush: func(next func() error) error {
			flushes.Add(1)
			time.Sleep(100 * time.Millisecond)
			err := next()
			mu.Lock()
			events = append(events, "flush")
			mu.Unlock()
			flushReturned.Store(true)
			return err
		}}
	_, addr := serve(t, dev, nil)
	c, _ := open(t, addr, true, false)
	for i := range 8 {
		c.mustWrite(uint64(i*4096), pattern(4096, byte(i)))
	}
	c.send(0, cmdFlush, 555, 0, 0, nil)
	cs := c.reply(555)
	if !flushReturned.Load() {
		t.Fatal("FLUSH answered before the device's Flush returned")
	}
	if e, _ := cs[0].err(); e != 0 {
		t.Fatalf("FLUSH: %v", cs)
	}
	mu.Lock()
	if len(events) != 9 || events[8] != "flush" {
		t.Errorf("device saw %v, want 8 writes then the flush", events)
	}
	mu.Unlock()
	if n := flushes.Load(); n != 1 {
		t.Errorf("%d Flush calls", n)
	}
	// FUA reaches the device.
	if e := c.writeAt(cflagFUA, 0, []byte("x")); e != 0 {
		t.Fatal(e)
	}
	mu.Lock()
	if last := events[len(events)-1]; last != "write 0 fua=true" {
		t.Errorf("FUA write reached the device as %q", last)
	}
	mu.Unlock()
}

// DISC: in-flight requests are finished and answered, then the server
// closes the connection.
func TestDiscWaitsForInFlight(t *testing.T) {
	file, path := sparseFile(t, testSize)
	var done atomic.Int32
	dev := &hookDevice{Device: file, write: func(p []byte, off int64, fua bool, next func([]byte, int64, bool) error) error {
		time.Sleep(200 * time.Millisecond)
		defer done.Add(1)
		return next(p, off, fua)
	}}
	s, addr := serve(t, dev, nil)
	c, _ := open(t, addr, false, false)
	for i := range 4 {
		c.send(0, cmdWrite, uint64(i), uint64(i*4096), 4, []byte("slow"))
	}
	c.disc()
	got := map[uint64]bool{}
	for range 4 {
		ch, err := c.readReply()
		if err != nil {
			t.Fatalf("reply after DISC: %v (in-flight requests dropped)", err)
		}
		if ch.errno != 0 {
			t.Fatalf("reply %v", ch)
		}
		got[ch.cookie] = true
	}
	if len(got) != 4 || done.Load() != 4 {
		t.Fatalf("replies %v, %d writes done", got, done.Load())
	}
	c.expectClosed("after DISC")
	if !waitFor(5*time.Second, func() bool { return s.Connections() == 0 }) {
		t.Fatal("connection not closed")
	}
	b, _ := os.ReadFile(path)
	if string(b[3*4096:3*4096+4]) != "slow" {
		t.Fatal("write lost")
	}
}

// One connection's garbage ends that connection only.
func TestMisbehavingConnectionIsolated(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	s, addr := serve(t, dev, nil)
	good, _ := open(t, addr, true, true)
	good.mustWrite(0, []byte("good"))

	for _, garbage := range [][]byte{
		bytes.Repeat([]byte{0xde, 0xad}, 14),              // bad request magic
		append(encRequest(0, cmdRead, 1, 0, 4)[:4], 0x01), // then EOF mid-header
		func() []byte { // old request magic
			b := encRequest(0, cmdRead, 1, 0, 4)
			be.PutUint32(b, 0x12560953)
			return b
		}(),
	} {
		bad, _ := open(t, addr, false, false)
		bad.write(garbage)
		bad.closeWrite()
		bad.expectClosed("garbage request")
		// Meanwhile the other connection is served.
		if got := good.mustRead(0, 4); string(got) != "good" {
			t.Fatalf("read %q", got)
		}
		good.mustWrite(4, []byte("!"))
	}
	if !waitFor(5*time.Second, func() bool { return s.Connections() == 1 }) {
		t.Fatalf("%d connections, want 1", s.Connections())
	}
}

// Closing an export's Revoked channel closes its connections promptly, and
// Release is called exactly once.
func TestRevocation(t *testing.T) {
	file, _ := sparseFile(t, testSize)
	revoked := make(chan struct{})
	var opens, releases atomic.Int32
	exps := countingExports{Export: &Export{Name: "disk", Device: file}, opens: &opens, releases: &releases, revoked: revoked}
	s, addr := serve(t, file, func(s *Server) { s.Exports = exps })
	c, _ := open(t, addr, true, false)
	c.mustWrite(0, []byte("before"))
	other := connect(t, addr, clientFixed) // still haggling: not affected

	start := time.Now()
	close(revoked)
	c.expectClosed("after revocation")
	if d := time.Since(start); d > time.Second {
		t.Errorf("revocation took %v", d)
	}
	if !waitFor(time.Second, func() bool { return releases.Load() == 1 }) {
		t.Fatalf("Release called %d times", releases.Load())
	}
	if !waitFor(time.Second, func() bool { return s.Connections() == 1 }) {
		t.Fatalf("%d connections", s.Connections())
	}
	other.final(optList, nil, repAck)
	// A GO on the revoked export is closed at once too.
	other.goExport("disk")
	other.expectClosed("GO on a revoked export")
	if !waitFor(5*time.Second, func() bool { return s.Connections() == 0 }) {
		t.Fatalf("%d connections", s.Connections())
	}
	if o, r := opens.Load(), releases.Load(); o != 2 || r != 2 {
		t.Errorf("%d opens, %d releases", o, r)
	}
}

// Revocation while a request is stuck in the device: the connection is
// closed at once; Release waits for the request.
func TestRevocationWithRequestInFlight(t *testing.T) {
	file, _ := sparseFile(t, testSize)
	revoked := make(chan struct{})
	unblock := make(chan struct{})
	var inDevice atomic.Bool
	dev := &hookDevice{Device: file, read: func(p []byte, off int64, next func([]byte, int64) error) error {
		inDevice.Store(true)
		<-unblock
		return next(p, off)
	}}
	var opens, releases atomic.Int32
	exps := countingExports{Export: &Export{Name: "disk", Device: dev}, opens: &opens, releases: &releases, revoked: revoked}
	s, addr := serve(t, dev, func(s *Server) { s.Exports = exps })
	c, _ := open(t, addr, false, false)
	c.send(0, cmdRead, 1, 0, 4096, nil)
	if !waitFor(5*time.Second, inDevice.Load) {
		t.Fatal("read never reached the device")
	}
	start := time.Now()
	close(revoked)
	c.expectClosed("revoked with a request in flight")
	if d := time.Since(start); d > time.Second {
		t.Errorf("revocation took %v", d)
	}
	time.Sleep(50 * time.Millisecond)
	if r := releases.Load(); r != 0 {
		t.Errorf("Release called while a request is still using the device")
	}
	close(unblock)
	if !waitFor(5*time.Second, func() bool { return releases.Load() == 1 && s.Connections() == 0 }) {
		t.Fatalf("releases %d, connections %d", releases.Load(), s.Connections())
	}
}

// someNoWait answers TryReadAt for even 4 KiB blocks only, so reads take
// both paths: run by the reader goroutine, or handed to a goroutine.
type someNoWait struct {
	*block.File
	answered atomic.Int32
}

func (d *someNoWait) TryReadAt(p []byte, off int64) bool {
	if off/4096%2 == 1 || !d.File.TryReadAt(p, off) {
		return false
	}
	d.answered.Add(1)
	return true
}

// Reads the device answers at once are run by the reader and their replies
// flushed before it waits for the client: pipelined reads over both paths
// all come back right, and a read's reply is not held back while the
// reader waits for the rest of a write's payload.
func TestReadNow(t *testing.T) {
	modes(t, func(t *testing.T, structured bool) {
		file, _ := sparseFile(t, testSize)
		dev := &someNoWait{File: file}
		_, addr := serve(t, dev, nil)
		c, _ := open(t, addr, structured, false)
		const n = 64
		for i := range n {
			c.mustWrite(uint64(i*4096), pattern(4096, byte(i)))
		}
		var batch []byte
		for i := range n {
			batch = append(batch, encRequest(0, cmdRead, uint64(i), uint64(i*4096), 4096)...)
		}
		if err := c.write(batch); err != nil {
			t.Fatal(err)
		}
		if !structured {
			c.mu.Lock()
			for i := range n {
				c.reads[uint64(i)] = 4096
			}
			c.mu.Unlock()
		}
		for range n {
			ch, err := c.readReply()
			if err != nil {
				t.Fatal(err)
			}
			if e, msg := ch.err(); e != 0 || !bytes.Equal(ch.data(), pattern(4096, byte(ch.cookie))) {
				t.Fatalf("read %d: errno %d %s, or wrong data", ch.cookie, e, msg)
			}
		}
		if got := dev.answered.Load(); got < n/2 {
			t.Fatalf("%d reads answered at once, want %d", got, n/2)
		}

		// A read, then a write whose payload is held back until the
		// read's reply has arrived.
		const cookie = 7777
		c.send(0, cmdRead, cookie, 0, 4096, nil)
		p := pattern(4096, 99)
		if err := c.write(append(encRequest(0, cmdWrite, cookie+1, 8192, 4096), p[:100]...)); err != nil {
			t.Fatal(err)
		}
		if cs := c.reply(cookie); !bytes.Equal(cs[len(cs)-1].data(), pattern(4096, 0)) {
			t.Fatal("read answered with wrong data")
		}
		if err := c.write(p[100:]); err != nil {
			t.Fatal(err)
		}
		if cs := c.reply(cookie + 1); cs[0].errno != 0 {
			t.Fatalf("write: %v", cs)
		}
		if !bytes.Equal(c.mustRead(8192, 4096), p) {
			t.Fatal("write not read back")
		}
	})
}

// TestBlockStatusLongExtent: an extent longer than 2 GiB is described in
// full (the length field has 32 bits, the request is shorter than 4 GiB),
// not cut short with the rest of the map shifted onto the wrong offsets.
func TestBlockStatusLongExtent(t *testing.T) {
	file, _ := sparseFile(t, 4<<30)
	dev := &hookDevice{Device: file, extents: func(off, n int64, _ func(int64, int64) ([]block.Extent, error)) ([]block.Extent, error) {
		return []block.Extent{{Length: 3<<30 - off}, {Length: 1 << 30, Hole: true, Zero: true}}, nil
	}}
	_, addr := serve(t, dev, nil)
	c := connect(t, addr, clientFixed|clientNoZeroes)
	c.final(optStructuredReply, nil, repAck)
	c.structured = true
	c.opt(optSetMetaContext, encMeta("disk", MetaContextAllocation))
	c.goExport("disk")
	if err := c.send(0, cmdBlockStatus, 1, 0, 0xFFFFF000, nil); err != nil {
		t.Fatal(err)
	}
	p := c.reply(1)[0].payload[4:]
	var got [][2]uint64
	for ; len(p) >= 8; p = p[8:] {
		got = append(got, [2]uint64{uint64(be.Uint32(p)), uint64(be.Uint32(p[4:]))})
	}
	want := [][2]uint64{{3 << 30, 0}, {0xFFFFF000 - 3<<30, stateHole | stateZero}}
	if !slices.Equal(got, want) {
		t.Fatalf("extents %v, want %v", got, want)
	}
}
