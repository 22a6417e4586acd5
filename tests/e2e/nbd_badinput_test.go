package e2e

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"
)

// TestNBDBadInput: requests a real client refuses to make well (qemu-io
// reading past the end) fail cleanly, and malformed requests from a raw
// client — beyond the end, oversized, unknown commands and flags — get the
// spec's errors without dropping that connection or any other; clients that
// vanish mid-request leak nothing.
func TestNBDBadInput(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io", "nbdinfo")
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	const size = 16 * MiB
	admin.CreateVolume("--size", sz(size), "--name", "bad")
	a := admin.Attach("bad", "hv1", "rw")
	if r := qemuIO(t, a.NBDURI, "write -P 0xa5 0 16M", "flush"); qemuIOFailed(r) {
		t.Fatalf("fill: %s", r)
	}

	// A second, concurrent connection that must keep working throughout.
	q := startQemuSession(t, "-f", "raw", a.NBDURI)
	healthy := func(when string) {
		t.Helper()
		if out := q.Do("read -P 0xa5 15M 1M"); strings.Contains(out, "failed") || !strings.Contains(out, "read 1048576/1048576") {
			t.Errorf("%s: the concurrent qemu-io connection failed: %s", when, out)
		}
	}
	healthy("before")

	// qemu-io: reads and writes at or across the end fail cleanly.
	for _, cmd := range []string{
		fmt.Sprintf("read 0x%x 512", size),          // offset = size
		fmt.Sprintf("read 0x%x 512", size-256),      // across the end
		fmt.Sprintf("write 0x%x 512", size),         // write at the end
		fmt.Sprintf("write -z 0x%x 4096", size),     // zero at the end
		fmt.Sprintf("discard 0x%x 4096", size+4096), // trim past the end
	} {
		r := qemuIO(t, a.NBDURI, cmd)
		if !qemuIOFailed(r) {
			t.Errorf("qemu-io %q past the end succeeded: %s", cmd, r)
		} else if strings.Contains(r.Stdout+r.Stderr, "Segmentation") || r.Code > 1 {
			t.Errorf("qemu-io %q past the end did not fail cleanly: %s", cmd, r)
		}
	}
	healthy("after qemu-io past the end")

	// Raw requests on one connection.
	c, err := dialNBD(n.NBD, a.Export)
	if err != nil {
		t.Fatalf("raw client: %v", err)
	}
	defer c.Close()
	if c.Size != uint64(size) {
		t.Errorf("raw client: export size %d, want %d", c.Size, size)
	}
	if c.Flags&nbdTFlagMultiConn == 0 {
		t.Errorf("transmission flags %#x lack CAN_MULTI_CONN", c.Flags)
	}
	page := make([]byte, 4096)
	oversized := make([]byte, 33*MiB)
	cases := []struct {
		name    string
		typ     uint16
		flags   uint16
		off     uint64
		length  uint32
		payload []byte
		want    []uint32 // acceptable errors
	}{
		{"READ at offset = size", nbdCmdRead, 0, uint64(size), 512, nil, []uint32{nbdEINVAL}},
		{"READ across the end", nbdCmdRead, 0, uint64(size) - 256, 512, nil, []uint32{nbdEINVAL}},
		{"READ at an offset that overflows", nbdCmdRead, 0, 1<<64 - 256, 512, nil, []uint32{nbdEINVAL}},
		{"READ of 64 MiB (beyond the maximum payload)", nbdCmdRead, 0, 0, 64 << 20, nil, []uint32{nbdEINVAL, nbdEOVERFLOW}},
		{"WRITE at the end", nbdCmdWrite, 0, uint64(size), 4096, page, []uint32{nbdENOSPC, nbdEINVAL}},
		{"WRITE across the end", nbdCmdWrite, nbdFlagFUA, uint64(size) - 2048, 4096, page, []uint32{nbdENOSPC, nbdEINVAL}},
		{"WRITE of 33 MiB (beyond the maximum payload)", nbdCmdWrite, 0, 0, uint32(len(oversized)), oversized, []uint32{nbdEINVAL, nbdEOVERFLOW, nbdENOSPC}},
		{"TRIM past the end", nbdCmdTrim, 0, uint64(size), 4096, nil, []uint32{nbdEINVAL, nbdENOSPC}},
		{"WRITE_ZEROES past the end", nbdCmdWriteZeroes, 0, uint64(size) - 4096, 8192, nil, []uint32{nbdENOSPC, nbdEINVAL}},
		{"unknown command 42", 42, 0, 0, 512, nil, []uint32{nbdEINVAL}},
		{"READ with an unknown flag", nbdCmdRead, 1 << 12, 0, 512, nil, []uint32{nbdEINVAL}},
		{"FLUSH with a flag it does not take", nbdCmdFlush, 1 << 2, 0, 0, nil, []uint32{nbdEINVAL}},
		{"BLOCK_STATUS without a metadata context", 7, 0, 0, 4096, nil, []uint32{nbdEINVAL}},
	}
	for _, tc := range cases {
		errno, _, err := c.Do(tc.typ, tc.flags, tc.off, tc.length, tc.payload)
		if err != nil {
			t.Fatalf("%s: the connection broke: %v", tc.name, err)
		}
		ok := false
		for _, w := range tc.want {
			ok = ok || errno == w
		}
		if !ok {
			t.Errorf("%s: error %d, want one of %v", tc.name, errno, tc.want)
		}
		// The same connection still serves.
		if errno, data, err := c.Do(nbdCmdRead, 0, uint64(size)-4096, 4096, nil); err != nil || errno != 0 || data[4095] != 0xa5 {
			t.Fatalf("after %s: a valid READ on the same connection: errno %d, err %v", tc.name, errno, err)
		}
	}
	// Nothing was written by the refused writes.
	if r := qemuIO(t, a.NBDURI, "read -P 0xa5 0 16M"); qemuIOFailed(r) || strings.Contains(r.Stdout, "Pattern verification failed") {
		t.Errorf("refused requests changed data: %s", r)
	}
	healthy("after raw bad requests")

	// Many requests in flight on one connection: every cookie is answered
	// once, with the right data, whatever the order.
	pattern := func(off int64) byte { return byte(off/4096*7 + 3) }
	var fill bytes.Buffer
	for off := int64(0); off < 4*MiB; off += 4096 {
		fill.Write(bytes.Repeat([]byte{pattern(off)}, 4096))
	}
	if errno, _, err := c.Do(nbdCmdWrite, 0, 0, uint32(fill.Len()), fill.Bytes()); err != nil || errno != 0 {
		t.Fatalf("write 4 MiB: errno %d err %v", errno, err)
	}
	type req struct {
		off    int64
		length int
	}
	reqs := map[uint64]req{}
	for i := 0; i < 200; i++ {
		r := req{off: rand.Int64N(4*MiB/4096-64) * 4096, length: 4096 * (1 + rand.IntN(64))}
		cookie, err := c.Send(nbdCmdRead, 0, uint64(r.off), uint32(r.length), nil)
		if err != nil {
			t.Fatalf("pipelined send: %v", err)
		}
		reqs[cookie] = r
	}
	outOfOrder := false
	var last uint64
	for range 200 {
		cookie, errno, data, err := c.Recv(func(ck uint64) int { return reqs[ck].length })
		if err != nil {
			t.Fatalf("pipelined replies: %v", err)
		}
		r, ok := reqs[cookie]
		if !ok {
			t.Fatalf("reply for unknown or repeated cookie %d", cookie)
		}
		delete(reqs, cookie)
		if cookie < last {
			outOfOrder = true
		}
		last = cookie
		if errno != 0 {
			t.Errorf("pipelined read %d+%d: error %d", r.off, r.length, errno)
			continue
		}
		for p := 0; p < r.length; p += 4096 {
			if data[p] != pattern(r.off+int64(p)) || data[p+4095] != pattern(r.off+int64(p)) {
				t.Fatalf("pipelined read %d+%d: wrong data at +%d", r.off, r.length, p)
			}
		}
	}
	t.Logf("200 pipelined reads answered; out of order: %v", outOfOrder)

	// Memory per connection is bounded: a client queueing 800 READs of
	// 16 MiB (12.5 GiB of replies) without reading any reply does not make
	// the server allocate them all.
	rssBefore := rssBytes(t, n.PID())
	greedy, err := dialNBD(n.NBD, a.Export)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 800; i++ {
		if _, err := greedy.Send(nbdCmdRead, 0, 0, 16<<20, nil); err != nil {
			t.Fatalf("queue reads: %v", err)
		}
	}
	time.Sleep(time.Second)
	if grown := rssBytes(t, n.PID()) - rssBefore; grown > 400*MiB {
		t.Errorf("the server grew by %d MiB for one connection's unread replies: memory per connection is not bounded", grown/MiB)
	} else {
		t.Logf("server RSS grew by %d MiB with 800 x 16 MiB reads queued", grown/MiB)
	}
	greedy.c.Close()
	healthy("after a greedy client")

	// Clients that vanish mid-request or mid-handshake leak nothing: the
	// server's open file descriptors come back to where they were.
	c.Close()
	time.Sleep(200 * time.Millisecond)
	pid := n.PID()
	base := openFDs(t, pid)
	for i := 0; i < 60; i++ {
		switch i % 4 {
		case 0: // a WRITE whose payload never arrives
			rc, err := dialNBD(n.NBD, a.Export)
			if err != nil {
				t.Fatal(err)
			}
			var h [28]byte
			binary.BigEndian.PutUint32(h[0:], 0x25609513)
			binary.BigEndian.PutUint16(h[6:], nbdCmdWrite)
			binary.BigEndian.PutUint32(h[24:], 1<<20)
			rc.c.Write(h[:])
			rc.c.Write(make([]byte, 1000))
			rc.c.Close()
		case 1: // many READs, no reply read, then gone
			rc, err := dialNBD(n.NBD, a.Export)
			if err != nil {
				t.Fatal(err)
			}
			for j := 0; j < 100; j++ {
				rc.Send(nbdCmdRead, 0, 0, 1<<20, nil)
			}
			rc.c.Close()
		case 2: // gone after the greeting
			nc, err := net.Dial("tcp", addr(n.NBD))
			if err != nil {
				t.Fatal(err)
			}
			nc.Read(make([]byte, 18))
			nc.Close()
		case 3: // an absurd option length
			nc, err := net.Dial("tcp", addr(n.NBD))
			if err != nil {
				t.Fatal(err)
			}
			nc.Read(make([]byte, 18))
			opt := []byte{0, 0, 0, 3}
			opt = append(opt, "IHAVEOPT"...)
			opt = binary.BigEndian.AppendUint32(opt, 7)
			opt = binary.BigEndian.AppendUint32(opt, 0xfffffff0)
			nc.Write(opt)
			nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			nc.Read(make([]byte, 64)) // the server hangs up
			nc.Close()
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		now := openFDs(t, pid)
		if now <= base {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the server holds %d file descriptors 10s after 60 aborted connections, %d before: a leak", now, base)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	healthy("after aborted connections")
	nbdinfo(t, a.NBDURI)
}
