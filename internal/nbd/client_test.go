package nbd

// A minimal raw NBD client for protocol tests. It speaks the wire format
// directly (doc/proto.md of the NBD project) so that tests can send exactly
// the bytes they want: arbitrary client flags, malformed options, requests
// with any cookie, flags or type, many requests before reading any reply.
// The encoders are plain functions so that fuzz seeds can use them too.

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
)

// ioTimeout bounds every blocking read or write of the test client, so a
// server that stops answering fails the test instead of hanging it.
const ioTimeout = 10 * time.Second

// ---- encoders ----

func encOption(code uint32, data []byte) []byte {
	b := make([]byte, 16, 16+len(data))
	be.PutUint64(b[0:], magicOpt)
	be.PutUint32(b[8:], code)
	be.PutUint32(b[12:], uint32(len(data)))
	return append(b, data...)
}

// encInfoGo encodes NBD_OPT_INFO / NBD_OPT_GO data.
func encInfoGo(name string, infos ...uint16) []byte {
	b := be.AppendUint32(nil, uint32(len(name)))
	b = append(b, name...)
	b = be.AppendUint16(b, uint16(len(infos)))
	for _, i := range infos {
		b = be.AppendUint16(b, i)
	}
	return b
}

// encMeta encodes NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT data.
func encMeta(export string, queries ...string) []byte {
	b := be.AppendUint32(nil, uint32(len(export)))
	b = append(b, export...)
	b = be.AppendUint32(b, uint32(len(queries)))
	for _, q := range queries {
		b = be.AppendUint32(b, uint32(len(q)))
		b = append(b, q...)
	}
	return b
}

func encRequest(flags, typ uint16, cookie, off uint64, length uint32) []byte {
	b := make([]byte, requestSize)
	be.PutUint32(b[0:], magicRequest)
	be.PutUint16(b[4:], flags)
	be.PutUint16(b[6:], typ)
	be.PutUint64(b[8:], cookie)
	be.PutUint64(b[16:], off)
	be.PutUint32(b[24:], length)
	return b
}

func encClientFlags(f uint32) []byte { return be.AppendUint32(nil, f) }

// ---- replies ----

type optReply struct {
	opt, typ uint32
	data     []byte
}

func (r optReply) isErr() bool { return r.typ&repErr != 0 }

func (r optReply) String() string {
	return fmt.Sprintf("opt %d reply %s (%d bytes: %q)", r.opt, repName(r.typ), len(r.data), r.data)
}

func repName(t uint32) string {
	switch t {
	case repAck:
		return "ACK"
	case repServer:
		return "SERVER"
	case repInfo:
		return "INFO"
	case repMetaContext:
		return "META_CONTEXT"
	case repErrUnsup:
		return "ERR_UNSUP"
	case repErrPolicy:
		return "ERR_POLICY"
	case repErrInvalid:
		return "ERR_INVALID"
	case repErrPlatform:
		return "ERR_PLATFORM"
	case repErrTLSReqd:
		return "ERR_TLS_REQD"
	case repErrUnknown:
		return "ERR_UNKNOWN"
	case repErrShutdown:
		return "ERR_SHUTDOWN"
	case repErrTooBig:
		return "ERR_TOO_BIG"
	}
	return fmt.Sprintf("%#x", t)
}

// chunk is one transmission reply message: a simple reply or one
// structured reply chunk.
type chunk struct {
	simple  bool
	cookie  uint64
	errno   uint32 // simple replies
	flags   uint16 // structured replies
	typ     uint16
	payload []byte // structured payload, or a simple READ reply's data
}

// err returns the NBD error a reply carries (0 for success) and, for a
// structured error chunk, its message.
func (c chunk) err() (uint32, string) {
	if c.simple {
		return c.errno, ""
	}
	if c.typ&(1<<15) == 0 || len(c.payload) < 6 {
		return 0, ""
	}
	n := int(be.Uint16(c.payload[4:]))
	msg := ""
	if 6+n <= len(c.payload) {
		msg = string(c.payload[6 : 6+n])
	}
	return be.Uint32(c.payload), msg
}

func (c chunk) String() string {
	if c.simple {
		return fmt.Sprintf("simple{cookie %#x errno %d, %d data bytes}", c.cookie, c.errno, len(c.payload))
	}
	e, msg := c.err()
	return fmt.Sprintf("structured{cookie %#x flags %#x type %d, %d bytes, errno %d %q}", c.cookie, c.flags, c.typ, len(c.payload), e, msg)
}

// data returns the bytes a successful READ reply carries.
func (c chunk) data() []byte {
	if c.simple {
		return c.payload
	}
	if c.typ == replyTypeOffsetData && len(c.payload) >= 8 {
		return c.payload[8:]
	}
	return nil
}

// exportInfo is what INFO/GO (or EXPORT_NAME) said about an export.
type exportInfo struct {
	size                  uint64
	flags                 uint16
	name, desc            string
	haveName, haveDesc    bool
	haveBlockSize         bool
	minBlock, prefBlock   uint32
	maxPayload            uint32
	infos                 []uint16 // info types in the order received
	rawExportInfoPayloads int      // number of NBD_INFO_EXPORT replies
}

// ---- the client ----

type rawClient struct {
	t       testing.TB
	nc      net.Conn
	r       *bufio.Reader
	wmu     sync.Mutex
	hsFlags uint16

	mu    sync.Mutex
	reads map[uint64]uint32 // pending simple-reply READs: cookie -> length
	// structured is true once STRUCTURED_REPLY was acknowledged (and not
	// reset by STARTTLS); it only matters for READ replies.
	structured bool
	// tap holds every byte received since STARTTLS (nil before).
	tap *tapConn
}

// tapConn records what is read through it.
type tapConn struct {
	net.Conn
	mu  sync.Mutex
	got []byte
}

func (t *tapConn) Read(p []byte) (int, error) {
	n, err := t.Conn.Read(p)
	t.mu.Lock()
	t.got = append(t.got, p[:n]...)
	t.mu.Unlock()
	return n, err
}

// lastRecordType walks the TLS records received and returns the content
// type of the last one, and whether the stream ends on a record boundary.
func (t *tapConn) lastRecordType() (typ byte, whole bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.got
	for len(b) >= 5 {
		n := 5 + int(be.Uint16(b[3:]))
		if len(b) < n {
			return typ, false
		}
		typ, b = b[0], b[n:]
	}
	return typ, len(b) == 0
}

// dialRaw connects and reads the server's greeting; it sends nothing.
func dialRaw(t testing.TB, addr string) *rawClient {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &rawClient{t: t, nc: nc, r: bufio.NewReader(nc), reads: map[uint64]uint32{}}
	hello, err := c.readN(18)
	if err != nil {
		t.Fatalf("greeting: %v", err)
	}
	if be.Uint64(hello[0:]) != magicNBD || be.Uint64(hello[8:]) != magicOpt {
		t.Fatalf("bad greeting % x", hello)
	}
	c.hsFlags = be.Uint16(hello[16:])
	return c
}

// connect dials and sends client flags.
func connect(t testing.TB, addr string, clientFlags uint32) *rawClient {
	t.Helper()
	c := dialRaw(t, addr)
	if err := c.write(encClientFlags(clientFlags)); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *rawClient) write(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.nc.SetWriteDeadline(time.Now().Add(ioTimeout))
	_, err := c.nc.Write(b)
	return err
}

func (c *rawClient) readN(n int) ([]byte, error) {
	c.nc.SetReadDeadline(time.Now().Add(ioTimeout))
	b := make([]byte, n)
	_, err := io.ReadFull(c.r, b)
	return b, err
}

func (c *rawClient) close() { c.nc.Close() }

// closeWrite half-closes the client's side of the TCP connection.
func (c *rawClient) closeWrite() {
	if tc, ok := c.nc.(*net.TCPConn); ok {
		tc.CloseWrite()
	} else if tc, ok := c.nc.(*tls.Conn); ok {
		tc.CloseWrite()
	}
}

// ---- option haggling ----

func (c *rawClient) sendOption(code uint32, data []byte) error {
	return c.write(encOption(code, data))
}

func (c *rawClient) readOptReply() (optReply, error) {
	h, err := c.readN(20)
	if err != nil {
		return optReply{}, err
	}
	if m := be.Uint64(h[0:]); m != magicOptReply {
		return optReply{}, fmt.Errorf("bad option reply magic %#x", m)
	}
	r := optReply{opt: be.Uint32(h[8:]), typ: be.Uint32(h[12:])}
	n := be.Uint32(h[16:])
	if n > 1<<20 {
		return r, fmt.Errorf("option reply length %d", n)
	}
	if r.data, err = c.readN(int(n)); err != nil {
		return r, err
	}
	return r, nil
}

// opt sends an option and reads its replies up to the final one (ACK or an
// error); it checks that every reply names the option.
func (c *rawClient) opt(code uint32, data []byte) []optReply {
	c.t.Helper()
	rs, err := c.tryOpt(code, data)
	if err != nil {
		c.t.Fatalf("option %d: %v (replies so far %v)", code, err, rs)
	}
	return rs
}

func (c *rawClient) tryOpt(code uint32, data []byte) ([]optReply, error) {
	if err := c.sendOption(code, data); err != nil {
		return nil, err
	}
	var rs []optReply
	for {
		r, err := c.readOptReply()
		if err != nil {
			return rs, err
		}
		if r.opt != code {
			return rs, fmt.Errorf("reply names option %d, sent %d", r.opt, code)
		}
		rs = append(rs, r)
		if r.typ == repAck || r.isErr() {
			if code == optStructuredReply && r.typ == repAck {
				c.structured = true
			}
			return rs, nil
		}
		if len(rs) > 1000 {
			return rs, errors.New("too many replies")
		}
	}
}

// final sends an option and returns its final reply, failing the test
// unless it has type want.
func (c *rawClient) final(code uint32, data []byte, want uint32) optReply {
	c.t.Helper()
	rs := c.opt(code, data)
	last := rs[len(rs)-1]
	if last.typ != want {
		c.t.Fatalf("option %d: final reply %s, want %s (all: %v)", code, repName(last.typ), repName(want), rs)
	}
	return last
}

// parseInfoReplies interprets the NBD_REP_INFO replies of INFO/GO.
func parseInfoReplies(t testing.TB, rs []optReply) exportInfo {
	t.Helper()
	var ei exportInfo
	for _, r := range rs {
		if r.typ != repInfo {
			continue
		}
		if len(r.data) < 2 {
			t.Fatalf("NBD_REP_INFO of %d bytes", len(r.data))
		}
		typ := be.Uint16(r.data)
		ei.infos = append(ei.infos, typ)
		switch typ {
		case infoExport:
			if len(r.data) != 12 {
				t.Fatalf("NBD_INFO_EXPORT length %d, spec says 12", len(r.data))
			}
			ei.size, ei.flags = be.Uint64(r.data[2:]), be.Uint16(r.data[10:])
			ei.rawExportInfoPayloads++
		case infoName:
			ei.name, ei.haveName = string(r.data[2:]), true
		case infoDescription:
			ei.desc, ei.haveDesc = string(r.data[2:]), true
		case infoBlockSize:
			if len(r.data) != 14 {
				t.Fatalf("NBD_INFO_BLOCK_SIZE length %d, spec says 14", len(r.data))
			}
			ei.haveBlockSize = true
			ei.minBlock, ei.prefBlock, ei.maxPayload = be.Uint32(r.data[2:]), be.Uint32(r.data[6:]), be.Uint32(r.data[10:])
		}
	}
	return ei
}

// goExport enters transmission with NBD_OPT_GO, failing unless it succeeds.
func (c *rawClient) goExport(name string, infos ...uint16) exportInfo {
	c.t.Helper()
	rs := c.opt(optGo, encInfoGo(name, infos...))
	if last := rs[len(rs)-1]; last.typ != repAck {
		c.t.Fatalf("GO %q: %v", name, rs)
	}
	return parseInfoReplies(c.t, rs)
}

// exportName enters transmission with NBD_OPT_EXPORT_NAME; zeroes says
// whether the 124 reserved zero bytes are expected.
func (c *rawClient) exportName(name string, zeroes bool) exportInfo {
	c.t.Helper()
	if err := c.sendOption(optExportName, []byte(name)); err != nil {
		c.t.Fatal(err)
	}
	b, err := c.readN(10)
	if err != nil {
		c.t.Fatalf("EXPORT_NAME reply: %v", err)
	}
	if zeroes {
		z, err := c.readN(124)
		if err != nil {
			c.t.Fatalf("EXPORT_NAME zero padding: %v", err)
		}
		if !bytes.Equal(z, make([]byte, 124)) {
			c.t.Fatalf("EXPORT_NAME padding is not zero: % x", z)
		}
	}
	return exportInfo{size: be.Uint64(b), flags: be.Uint16(b[8:])}
}

// startTLS sends NBD_OPT_STARTTLS and, on ACK, upgrades the connection.
func (c *rawClient) startTLS(cfg *tls.Config) error {
	c.t.Helper()
	rs, err := c.tryOpt(optStartTLS, nil)
	if err != nil {
		return err
	}
	if r := rs[len(rs)-1]; r.typ != repAck {
		return fmt.Errorf("STARTTLS: %v", r)
	}
	if c.r.Buffered() != 0 {
		return fmt.Errorf("%d bytes after the STARTTLS ACK", c.r.Buffered())
	}
	c.tap = &tapConn{Conn: c.nc}
	tc := tls.Client(c.tap, cfg)
	tc.SetDeadline(time.Now().Add(ioTimeout))
	if err := tc.Handshake(); err != nil {
		return err
	}
	tc.SetDeadline(time.Time{})
	c.nc, c.r = tc, bufio.NewReader(tc)
	c.structured = false // no negotiation state survives STARTTLS
	return nil
}

// expectClosed asserts that the server closes the connection (soon) without
// sending anything more.
func (c *rawClient) expectClosed(what string) {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(ioTimeout))
	b, err := io.ReadAll(c.r)
	if len(b) > 0 {
		c.t.Errorf("%s: %d unexpected bytes before close: % x", what, len(b), b[:min(len(b), 64)])
	}
	if err != nil && !isClosedErr(err) {
		c.t.Errorf("%s: connection not closed: %v", what, err)
	}
}

// expectTLSShutdown asserts that the server ends a TLS 1.2 session with
// an alert (close_notify, the only alert it sends after the handshake)
// and then closes the connection, sending nothing more. crypto/tls alone
// cannot tell: it reports a socket closed between records as a clean
// io.EOF too.
func (c *rawClient) expectTLSShutdown(what string) {
	c.t.Helper()
	tc, ok := c.nc.(*tls.Conn)
	if !ok || tc.ConnectionState().Version != tls.VersionTLS12 {
		c.t.Fatalf("%s: not a TLS 1.2 connection", what)
	}
	c.nc.SetReadDeadline(time.Now().Add(ioTimeout))
	b, err := io.ReadAll(c.r)
	if len(b) > 0 {
		c.t.Errorf("%s: %d unexpected bytes before close: % x", what, len(b), b[:min(len(b), 64)])
	}
	if err != nil {
		c.t.Errorf("%s: TLS session not shut down cleanly: %v", what, err)
	}
	const recordAlert = 21
	if typ, whole := c.tap.lastRecordType(); typ != recordAlert || !whole {
		c.t.Errorf("%s: the connection closed after a record of type %d (whole records: %v), not after a close_notify alert", what, typ, whole)
	}
}

func isClosedErr(err error) bool {
	return err == nil || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrUnexpectedEOF)
}

// ---- transmission ----

// send writes a request header (and payload) without waiting for a reply.
func (c *rawClient) send(flags, typ uint16, cookie, off uint64, length uint32, payload []byte) error {
	if typ == cmdRead && !c.structured {
		c.mu.Lock()
		c.reads[cookie] = length
		c.mu.Unlock()
	}
	b := encRequest(flags, typ, cookie, off, length)
	if len(payload) > 0 && len(payload) < 1<<20 {
		return c.write(append(b, payload...))
	}
	if err := c.write(b); err != nil {
		return err
	}
	if len(payload) > 0 {
		return c.write(payload)
	}
	return nil
}

// readReply reads one reply message (simple, or one structured chunk).
func (c *rawClient) readReply() (chunk, error) {
	h, err := c.readN(4)
	if err != nil {
		return chunk{}, err
	}
	switch m := be.Uint32(h); m {
	case magicSimple:
		rest, err := c.readN(12)
		if err != nil {
			return chunk{}, err
		}
		ch := chunk{simple: true, errno: be.Uint32(rest), cookie: be.Uint64(rest[4:])}
		c.mu.Lock()
		n, isRead := c.reads[ch.cookie]
		delete(c.reads, ch.cookie)
		c.mu.Unlock()
		if isRead && ch.errno == 0 {
			if ch.payload, err = c.readN(int(n)); err != nil {
				return ch, err
			}
		}
		return ch, nil
	case magicStructured:
		rest, err := c.readN(16)
		if err != nil {
			return chunk{}, err
		}
		ch := chunk{flags: be.Uint16(rest), typ: be.Uint16(rest[2:]), cookie: be.Uint64(rest[4:])}
		n := be.Uint32(rest[12:])
		if n > MaxPayload+1<<20 {
			return ch, fmt.Errorf("structured chunk of %d bytes", n)
		}
		if ch.payload, err = c.readN(int(n)); err != nil {
			return ch, err
		}
		return ch, nil
	default:
		return chunk{}, fmt.Errorf("bad reply magic %#x", m)
	}
}

// reply reads the complete reply to one request: a simple reply, or
// structured chunks up to the one flagged DONE. It fails the test if the
// reply is for another cookie.
func (c *rawClient) reply(cookie uint64) []chunk {
	c.t.Helper()
	var cs []chunk
	for {
		ch, err := c.readReply()
		if err != nil {
			c.t.Fatalf("reply to %#x: %v", cookie, err)
		}
		if ch.cookie != cookie {
			c.t.Fatalf("reply for cookie %#x, want %#x: %v", ch.cookie, cookie, ch)
		}
		cs = append(cs, ch)
		if ch.simple || ch.flags&replyFlagDone != 0 {
			return cs
		}
	}
}

var cookieSeq atomic.Uint64

// do sends one request and returns its error value, its message (structured
// errors only) and, for a READ, the data.
func (c *rawClient) do(flags, typ uint16, off uint64, length uint32, payload []byte) (errno uint32, msg string, data []byte) {
	c.t.Helper()
	cookie := cookieSeq.Add(1) * 0x9e3779b97f4a7c15 // arbitrary, distinct
	if err := c.send(flags, typ, cookie, off, length, payload); err != nil {
		c.t.Fatalf("send %s: %v", commandName(typ), err)
	}
	for _, ch := range c.reply(cookie) {
		if e, m := ch.err(); e != 0 {
			errno, msg = e, m
		}
		data = append(data, ch.data()...)
	}
	return errno, msg, data
}

func (c *rawClient) read(off uint64, n uint32) ([]byte, uint32) {
	c.t.Helper()
	e, _, d := c.do(0, cmdRead, off, n, nil)
	return d, e
}

func (c *rawClient) mustRead(off uint64, n uint32) []byte {
	c.t.Helper()
	d, e := c.read(off, n)
	if e != 0 {
		c.t.Fatalf("READ %d+%d: errno %d", off, n, e)
	}
	if len(d) != int(n) {
		c.t.Fatalf("READ %d+%d: %d bytes", off, n, len(d))
	}
	return d
}

func (c *rawClient) writeAt(flags uint16, off uint64, p []byte) uint32 {
	c.t.Helper()
	e, _, _ := c.do(flags, cmdWrite, off, uint32(len(p)), p)
	return e
}

func (c *rawClient) mustWrite(off uint64, p []byte) {
	c.t.Helper()
	if e := c.writeAt(0, off, p); e != 0 {
		c.t.Fatalf("WRITE %d+%d: errno %d", off, len(p), e)
	}
}

// cmd sends a request without payload and returns its error value.
func (c *rawClient) cmd(flags, typ uint16, off uint64, length uint32) uint32 {
	c.t.Helper()
	e, _, _ := c.do(flags, typ, off, length, nil)
	return e
}

// disc sends NBD_CMD_DISC.
func (c *rawClient) disc() {
	c.t.Helper()
	if err := c.write(encRequest(0, cmdDisc, 0, 0, 0)); err != nil {
		c.t.Fatal(err)
	}
}

// ---- test fixtures ----

// hookDevice wraps a Device; every hook is optional and gets the wrapped
// operation as next.
type hookDevice struct {
	block.Device
	caps        func(block.Capabilities) block.Capabilities
	read        func(p []byte, off int64, next func([]byte, int64) error) error
	write       func(p []byte, off int64, fua bool, next func([]byte, int64, bool) error) error
	writeZeroes func(off, n int64, f block.ZeroFlags, next func(int64, int64, block.ZeroFlags) error) error
	trim        func(off, n int64, fua bool, next func(int64, int64, bool) error) error
	flush       func(next func() error) error
	extents     func(off, n int64, next func(int64, int64) ([]block.Extent, error)) ([]block.Extent, error)
}

func (d *hookDevice) Capabilities() block.Capabilities {
	c := d.Device.Capabilities()
	if d.caps != nil {
		c = d.caps(c)
	}
	return c
}

func (d *hookDevice) ReadAt(p []byte, off int64) error {
	if d.read != nil {
		return d.read(p, off, d.Device.ReadAt)
	}
	return d.Device.ReadAt(p, off)
}

func (d *hookDevice) WriteAt(p []byte, off int64, fua bool) error {
	if d.write != nil {
		return d.write(p, off, fua, d.Device.WriteAt)
	}
	return d.Device.WriteAt(p, off, fua)
}

func (d *hookDevice) WriteZeroes(off, n int64, f block.ZeroFlags) error {
	if d.writeZeroes != nil {
		return d.writeZeroes(off, n, f, d.Device.WriteZeroes)
	}
	return d.Device.WriteZeroes(off, n, f)
}

func (d *hookDevice) Trim(off, n int64, fua bool) error {
	if d.trim != nil {
		return d.trim(off, n, fua, d.Device.Trim)
	}
	return d.Device.Trim(off, n, fua)
}

func (d *hookDevice) Flush() error {
	if d.flush != nil {
		return d.flush(d.Device.Flush)
	}
	return d.Device.Flush()
}

func (d *hookDevice) Extents(off, n int64) ([]block.Extent, error) {
	if d.extents != nil {
		return d.extents(off, n, d.Device.Extents)
	}
	return d.Device.Extents(off, n)
}

// sparseFile makes a sparse file of size bytes and opens it as a device.
func sparseFile(t testing.TB, size int64) (*block.File, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	d, err := block.OpenFile(p, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, p
}

// serve starts a server with one export "disk" over dev (plus any extra
// exports) and returns its address.
func serve(t testing.TB, dev block.Device, configure func(*Server), extra ...*Export) (*Server, string) {
	t.Helper()
	exps := mapExports{"disk": {Name: "disk", Description: "test disk", Device: dev}}
	for _, e := range extra {
		exps[e.Name] = e
	}
	s := &Server{Exports: exps}
	if configure != nil {
		configure(s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Serve(ln)
	}()
	t.Cleanup(func() {
		s.Close()
		ln.Close()
		<-done
	})
	return s, ln.Addr().String()
}

// waitFor polls cond until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>9)
	}
	return b
}
