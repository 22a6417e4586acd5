package nbd

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
)

// ---- an in-memory connection with half-close ----

// halfConn is the server's end of two synchronous pipes: it reads what the
// client writes on one and writes to the client on the other, so the
// client can close its sending side (the server then reads EOF) and still
// drain every reply. Deadlines work as on net.Pipe.
type halfConn struct {
	in, out net.Conn
}

func (c *halfConn) Read(b []byte) (int, error)         { return c.in.Read(b) }
func (c *halfConn) Write(b []byte) (int, error)        { return c.out.Write(b) }
func (c *halfConn) LocalAddr() net.Addr                { return c.in.LocalAddr() }
func (c *halfConn) RemoteAddr() net.Addr               { return c.in.RemoteAddr() }
func (c *halfConn) SetReadDeadline(t time.Time) error  { return c.in.SetReadDeadline(t) }
func (c *halfConn) SetWriteDeadline(t time.Time) error { return c.out.SetWriteDeadline(t) }
func (c *halfConn) SetDeadline(t time.Time) error {
	c.in.SetReadDeadline(t)
	return c.out.SetWriteDeadline(t)
}
func (c *halfConn) Close() error {
	c.in.Close()
	return c.out.Close()
}

// pipeListener hands the server in-memory connections.
type pipeListener struct {
	ch        chan net.Conn
	closeOnce sync.Once
	done      chan struct{}
}

func newPipeListener() *pipeListener {
	return &pipeListener{ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// dial returns the client's sending and receiving ends of a new connection.
func (l *pipeListener) dial() (send, recv net.Conn, err error) {
	inServer, inClient := net.Pipe()
	outServer, outClient := net.Pipe()
	select {
	case l.ch <- &halfConn{in: inServer, out: outServer}:
		return inClient, outClient, nil
	case <-l.done:
		return nil, nil, net.ErrClosed
	}
}

// ---- session seeds ----

// session builds a client byte stream.
type session struct{ b []byte }

func (s *session) flags(f uint32) *session { s.b = append(s.b, encClientFlags(f)...); return s }
func (s *session) opt(code uint32, data []byte) *session {
	s.b = append(s.b, encOption(code, data)...)
	return s
}
func (s *session) req(flags, typ uint16, cookie, off uint64, length uint32, payload []byte) *session {
	s.b = append(s.b, encRequest(flags, typ, cookie, off, length)...)
	s.b = append(s.b, payload...)
	return s
}
func (s *session) raw(b []byte) *session { s.b = append(s.b, b...); return s }

func sessionSeeds() [][]byte {
	p := pattern(512, 1)
	return [][]byte{
		// GO + WRITE + READ + FLUSH + DISC, simple replies.
		new(session).flags(clientFixed|clientNoZeroes).opt(optGo, encInfoGo("disk", infoBlockSize)).
			req(0, cmdWrite, 1, 0, 512, p).req(0, cmdRead, 2, 0, 512, nil).req(cflagFUA, cmdWrite, 3, 4096, 512, p).
			req(0, cmdFlush, 4, 0, 0, nil).req(0, cmdDisc, 5, 0, 0, nil).b,
		// Structured replies, metadata context, every command.
		new(session).flags(clientFixed).opt(optStructuredReply, nil).
			opt(optListMetaContext, encMeta("disk")).opt(optSetMetaContext, encMeta("disk", MetaContextAllocation)).
			opt(optInfo, encInfoGo("disk", infoName, infoDescription)).opt(optGo, encInfoGo("disk")).
			req(0, cmdWrite, 1, 8192, 512, p).req(cflagReqOne, cmdBlockStatus, 2, 0, 65536, nil).
			req(0, cmdBlockStatus, 3, 0, 65536, nil).req(cflagDF, cmdRead, 4, 8192, 512, nil).
			req(cflagFastZero|cflagNoHole, cmdWriteZeroes, 5, 0, 4096, nil).req(cflagFUA, cmdTrim, 6, 0, 4096, nil).
			req(0, cmdCache, 7, 0, 4096, nil).req(0, cmdRead, 8, 1<<40, 1, nil).req(0, 99, 9, 0, 0, nil).
			req(0, cmdDisc, 10, 0, 0, nil).b,
		// EXPORT_NAME of the default export, with padding.
		new(session).flags(clientFixed).opt(optExportName, nil).req(0, cmdRead, 1, 0, 4096, nil).req(0, cmdDisc, 0, 0, 0, nil).b,
		// Option haggling only.
		new(session).flags(clientFixed).opt(optList, nil).opt(optStartTLS, nil).opt(99, []byte("x")).
			opt(optInfo, encInfoGo("nope")).opt(optGo, []byte{1, 2, 3}).opt(optSetMetaContext, encMeta("disk")).
			opt(optAbort, nil).b,
		// Read-only export; refused writes.
		new(session).flags(clientFixed|clientNoZeroes).opt(optGo, encInfoGo("ro")).
			req(0, cmdWrite, 1, 0, 512, p).req(0, cmdTrim, 2, 0, 512, nil).req(0, cmdRead, 3, 0, 512, nil).b,
		// An oversized WRITE cut short, and garbage after GO.
		new(session).flags(clientFixed|clientNoZeroes).opt(optGo, encInfoGo("disk")).
			req(0, cmdWrite, 1, 0, MaxPayload+1, nil).raw(make([]byte, 1000)).b,
		new(session).flags(clientFixed|clientNoZeroes).opt(optGo, encInfoGo("disk")).raw(bytes.Repeat([]byte{0xff}, 40)).b,
		// A device error (EIO) mid-session.
		new(session).flags(clientFixed).opt(optStructuredReply, nil).opt(optGo, encInfoGo("eio")).
			req(0, cmdRead, 1, 0, 512, nil).req(0, cmdWrite, 2, 0, 512, p).req(0, cmdFlush, 3, 0, 0, nil).b,
		// Bad client flags; bad option magic.
		new(session).flags(1<<7).opt(optList, nil).b,
		new(session).flags(clientFixed).raw(bytes.Repeat([]byte("IHAVEOPX"), 3)).b,
		{},
	}
}

// ---- FuzzHandshake ----

type fuzzServer struct {
	s  *Server
	ln *pipeListener
}

func newFuzzServer(tb testing.TB, configure ...func(*Server)) *fuzzServer {
	dir := tb.TempDir()
	openDev := func(name string, ro bool) *block.File {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			tb.Fatal(err)
		}
		if err := os.Truncate(p, 256<<10); err != nil {
			tb.Fatal(err)
		}
		d, err := block.OpenFile(p, ro)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { d.Close() })
		return d
	}
	disk := openDev("disk", false)
	eio := &hookDevice{Device: disk,
		read:  func([]byte, int64, func([]byte, int64) error) error { return errors.New("eio") },
		write: func([]byte, int64, bool, func([]byte, int64, bool) error) error { return errors.New("eio") },
		flush: func(func() error) error { return errors.New("eio") },
	}
	exps := mapExports{
		"":     {Name: "", Device: disk},
		"disk": {Name: "disk", Description: "fuzz disk", Device: disk},
		"ro":   {Name: "ro", Device: openDev("ro", true), ReadOnly: true},
		"eio":  {Name: "eio", Device: eio},
	}
	fs := &fuzzServer{
		s:  &Server{Exports: exps, HandshakeTimeout: 5 * time.Second, MaxInFlight: 16, MaxInFlightBytes: 1 << 20},
		ln: newPipeListener(),
	}
	for _, c := range configure {
		c(fs.s)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fs.s.Serve(fs.ln)
	}()
	tb.Cleanup(func() {
		fs.s.Close()
		fs.ln.Close()
		<-done
	})
	return fs
}

// run plays input as the client's whole side of a session, drains the
// server's output, and checks that the server ends the connection.
func (fs *fuzzServer) run(t *testing.T, input []byte) []byte {
	send, recv, err := fs.ln.dial()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		io.Copy(&out, io.LimitReader(recv, 64<<20))
		recv.Close()
	}()
	// Feed the input in a few pieces, as a network would.
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for rest := input; len(rest) > 0; {
			n := min(len(rest), 1+len(rest)/3)
			if _, err := send.Write(rest[:n]); err != nil {
				break // the server closed the connection
			}
			rest = rest[n:]
		}
	}()
	select {
	case <-sent:
	case <-time.After(10 * time.Second):
		t.Fatalf("server stopped reading the client's input for 10 s without closing the connection\n%s", stacks())
	}
	send.Close() // EOF for the server
	deadline := time.After(10 * time.Second)
	select {
	case <-drained:
	case <-deadline:
		t.Fatalf("server still writing 10 s after the client's EOF\n%s", stacks())
	}
	if !waitFor(10*time.Second, func() bool { return fs.s.Connections() == 0 }) {
		t.Fatalf("connection not finished 10 s after the client's EOF\n%s", stacks())
	}
	return out.Bytes()
}

func stacks() []byte {
	buf := make([]byte, 1<<20)
	return buf[:runtime.Stack(buf, true)]
}

func FuzzHandshake(f *testing.F) {
	for _, s := range sessionSeeds() {
		f.Add(s)
	}
	fs := newFuzzServer(f)
	f.Fuzz(func(t *testing.T, input []byte) {
		out := fs.run(t, input)
		// Whatever the input, the server greets first.
		if len(out) < 18 || be.Uint64(out) != magicNBD || be.Uint64(out[8:]) != magicOpt {
			t.Fatalf("no greeting: % x", out[:min(len(out), 18)])
		}
	})
}

// The seeds are real sessions: check that they do what they say, so the
// corpus starts from deep states.
func TestFuzzSeedsReachTransmission(t *testing.T) {
	fs := newFuzzServer(t)
	seeds := sessionSeeds()
	out := fs.run(t, seeds[0])
	// Greeting, GO's replies (INFO export, INFO block size, ACK), then a
	// simple reply to the WRITE and the READ with its 512 bytes.
	want := 18 + (20 + 12) + (20 + 14) + 20 + 16 + (16 + 512) + 16 + 16
	if len(out) != want {
		t.Fatalf("seed 0: %d bytes of output, want %d", len(out), want)
	}
	out = fs.run(t, seeds[1])
	if !bytes.Contains(out, []byte(MetaContextAllocation)) || !bytes.Contains(out, be.AppendUint32(nil, magicStructured)) {
		t.Fatal("seed 1 did not reach structured transmission")
	}
}

// ---- parser fuzz targets ----

func FuzzParseInfoGo(f *testing.F) {
	f.Add(encInfoGo("disk", infoBlockSize))
	f.Add(encInfoGo(""))
	f.Add(encInfoGo("disk", 0, 1, 2, 3, 0x7777))
	f.Add([]byte{0, 0, 0, 9, 0, 0})
	f.Add(append(encInfoGo("x"), 0))
	f.Fuzz(func(t *testing.T, d []byte) {
		name, infos, ok := parseInfoGo(d)
		if ok {
			if len(name) > maxString || len(name)+6 > len(d) || 2*len(infos)+6+len(name) != len(d) {
				t.Fatalf("parsed %d-byte name and %d infos from %d bytes", len(name), len(infos), len(d))
			}
			if got := encInfoGo(name, infos...); !bytes.Equal(got, d) {
				t.Fatalf("re-encoding gives % x, input % x", got, d)
			}
		}
		// The other direction: any name (within the string limit) and
		// list of requests encodes to something that parses back.
		if len(d) <= maxString {
			var want []uint16
			for i := 0; i+1 < len(d) && len(want) < 100; i += 2 {
				want = append(want, be.Uint16(d[i:]))
			}
			n2, i2, ok2 := parseInfoGo(encInfoGo(string(d), want...))
			if !ok2 || n2 != string(d) || len(i2) != len(want) {
				t.Fatalf("round trip of %q %v: %q %v %v", d, want, n2, i2, ok2)
			}
			for i := range want {
				if i2[i] != want[i] {
					t.Fatalf("info %d: %d, want %d", i, i2[i], want[i])
				}
			}
		}
	})
}

func FuzzParseMetaContext(f *testing.F) {
	f.Add(encMeta("disk", MetaContextAllocation))
	f.Add(encMeta("disk"))
	f.Add(encMeta("", "base:", "x-a:b", ""))
	f.Add(append(encMeta("disk")[:8], 0xff, 0xff, 0xff, 0xff))
	f.Add(append(encMeta("disk", "q"), 0))
	f.Fuzz(func(t *testing.T, d []byte) {
		export, queries, ok := parseMetaContext(d)
		if ok {
			total := 8 + len(export)
			for _, q := range queries {
				if len(q) > maxString {
					t.Fatalf("query of %d bytes accepted", len(q))
				}
				total += 4 + len(q)
			}
			if len(export) > maxString || total != len(d) {
				t.Fatalf("parsed %d bytes' worth from %d", total, len(d))
			}
			if got := encMeta(export, queries...); !bytes.Equal(got, d) {
				t.Fatalf("re-encoding gives % x, input % x", got, d)
			}
		}
		// The other direction: split the input into an export name and
		// queries at 0x00 bytes; the encoding parses back to them.
		if len(d) <= maxString {
			parts := bytes.Split(d, []byte{0})
			exp := string(parts[0])
			var qs []string
			for _, p := range parts[1:] {
				qs = append(qs, string(p))
			}
			e2, q2, ok2 := parseMetaContext(encMeta(exp, qs...))
			if !ok2 || e2 != exp || len(q2) != len(qs) {
				t.Fatalf("round trip of %q %q: %q %q %v", exp, qs, e2, q2, ok2)
			}
			for i := range qs {
				if q2[i] != qs[i] {
					t.Fatalf("query %d: %q, want %q", i, q2[i], qs[i])
				}
			}
		}
	})
}

func FuzzParseRequest(f *testing.F) {
	f.Add(encRequest(0, cmdRead, 1, 0, 4096), uint16(0), uint16(0), uint64(0), uint64(0), uint32(0))
	f.Add(encRequest(cflagFUA, cmdWrite, 0xffffffffffffffff, 1<<40, MaxPayload), uint16(cflagDF), uint16(cmdBlockStatus), uint64(7), uint64(8), uint32(9))
	f.Add([]byte("\x25\x60\x95\x13short"), uint16(0xffff), uint16(0xffff), uint64(1), uint64(2), uint32(3))
	f.Add(append(encRequest(0, cmdDisc, 0, 0, 0), "trailing"...), uint16(1), uint16(2), uint64(3), uint64(4), uint32(5))
	f.Fuzz(func(t *testing.T, d []byte, flags, typ uint16, cookie, off uint64, length uint32) {
		r, ok := parseRequest(d)
		wantOK := len(d) >= requestSize && be.Uint32(d) == magicRequest
		if ok != wantOK {
			t.Fatalf("parseRequest ok=%v for % x", ok, d)
		}
		if ok {
			if got := encRequest(r.flags, r.typ, r.cookie, r.offset, r.length); !bytes.Equal(got, d[:requestSize]) {
				t.Fatalf("re-encoding gives % x, input % x", got, d[:requestSize])
			}
		}
		want := request{flags: flags, typ: typ, cookie: cookie, offset: off, length: length}
		got, ok := parseRequest(encRequest(flags, typ, cookie, off, length))
		if !ok || got != want {
			t.Fatalf("round trip of %+v: %+v %v", want, got, ok)
		}
		_ = commandName(typ)
	})
}
