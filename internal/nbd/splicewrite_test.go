package nbd

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
)

// splicingW is a file that takes writes from pipes. With part, it takes
// only that share of each range (the server writes the rest with
// WriteAt); with refuse, none; with failWrite, WriteAt fails.
type splicingW struct {
	*block.File
	part              float64
	refuse, failWrite bool
	taken, calls      atomic.Int64
}

func (d *splicingW) SpliceFrom(pipe int, off int64, n int) int {
	d.calls.Add(1)
	if d.refuse {
		return 0
	}
	if d.part > 0 {
		n = int(float64(n) * d.part)
	}
	k := d.File.SpliceFrom(pipe, off, n)
	d.taken.Add(int64(k))
	return k
}

var errWriteFails = errors.New("writes fail")

func (d *splicingW) WriteAt(p []byte, off int64, fua bool) error {
	if d.failWrite {
		return errWriteFails
	}
	return d.File.WriteAt(p, off, fua)
}

// Writes with at least 256 KiB of payload still to come are spliced from
// the socket into the device — whole, in part (the rest read back from
// the pipe and written), payloads bigger than the pipe in pieces, FUA
// ones not — many in flight at once; the file then holds exactly what
// was written. A write that fails gets EIO and the connection goes on; a
// device that never takes anything is no longer asked after
// maxSpliceRefusals writes; a client gone mid-payload leaves no pipe open
// but the idle ones.
func TestSplicedWrites(t *testing.T) {
	const slot, slots = 4 << 20, 16
	lengths := []int{256 << 10, 256<<10 + 1, 1 << 20, 1<<20 + 4096, 3<<20 + 5, 700 << 10}
	r := rand.New(rand.NewPCG(7, 8))
	for _, tc := range []struct {
		name              string
		part              float64
		refuse, failWrite bool
	}{
		{"whole", 0, false, false},
		{"part", 0.6, false, false},
		{"refused", 0, true, false},
		{"write-fails", 0.5, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file, _ := sparseFile(t, slot*slots)
			dev := &splicingW{File: file, part: tc.part, refuse: tc.refuse, failWrite: tc.failWrite}
			_, addr := serve(t, dev, nil)
			c, _ := open(t, addr, true, false)
			model := make([]byte, slot*slots)
			for i := range slots {
				n := lengths[i%len(lengths)]
				off := uint64(i*slot + r.IntN(slot-n+1))
				if i%3 == 0 {
					off |= 7
					off = min(off, uint64((i+1)*slot-n))
				}
				p := make([]byte, n)
				for j := range p {
					p[j] = byte(r.Uint32())
				}
				copy(model[off:], p)
				var flags uint16
				if i == 5 {
					flags = cflagFUA
				}
				if err := c.send(flags, cmdWrite, uint64(i), off, uint32(n), p); err != nil {
					t.Fatal(err)
				}
			}
			for range slots {
				ch, err := c.readReply()
				if err != nil {
					t.Fatal(err)
				}
				errno, _ := ch.err()
				if want := map[bool]uint32{false: 0, true: errIO}[tc.failWrite]; errno != want {
					t.Fatalf("write %d: errno %d, want %d", ch.cookie, errno, want)
				}
			}
			if tc.failWrite {
				// The connection goes on.
				if c.cmd(0, cmdFlush, 0, 0) != 0 {
					t.Fatal("flush after failed writes failed")
				}
				c.disc()
				return
			}
			got := make([]byte, len(model))
			if err := file.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, model) {
				for i := range got {
					if got[i] != model[i] {
						t.Fatalf("the file differs from what was written, first at byte %d", i)
					}
				}
			}
			switch {
			case tc.refuse:
				// Each of these writes is refused at least once until the
				// connection stops asking; how many times the writes in
				// flight above were refused depends on timing.
				for range maxSpliceRefusals {
					c.mustWrite(0, make([]byte, 512<<10))
				}
				asked := dev.calls.Load()
				for range 4 {
					c.mustWrite(0, make([]byte, 512<<10))
				}
				if calls := dev.calls.Load(); calls != asked {
					t.Fatalf("a device that took nothing %d times in a row was asked again (%d more times)", asked, calls-asked)
				}
			case dev.taken.Load() == 0:
				t.Fatal("nothing was spliced")
			}
			c.disc()
		})
	}

	// A write whose client goes away mid-payload was never acknowledged:
	// what of it reaches the device is whole sectors (of the device's
	// offsets, whatever the request's alignment), never a torn one.
	t.Run("gone-mid-payload", func(t *testing.T) {
		file, _ := sparseFile(t, 8<<20)
		dev := &splicingW{File: file}
		_, addr := serve(t, dev, nil)
		for i, sent := range []int{300 << 10, 300<<10 + 100, 500000, 333333, 700<<10 + 7} {
			off := uint64(i) << 20
			if i%2 == 1 {
				off += 1000 // an unaligned request
			}
			c, _ := open(t, addr, true, false)
			if err := c.write(encRequest(0, cmdWrite, 1, off, 1<<20)); err != nil {
				t.Fatal(err)
			}
			if err := c.write(bytes.Repeat([]byte{0xab}, sent)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond) // the server is splicing
			c.nc.Close()
		}
		if !waitFor(5*time.Second, func() bool {
			pipes.mu.Lock()
			defer pipes.mu.Unlock()
			return pipes.live == len(pipes.idle)
		}) {
			t.Fatal("the connections' pipes are still in use")
		}
		data := make([]byte, 8<<20)
		if err := file.ReadAt(data, 0); err != nil {
			t.Fatal(err)
		}
		const sector = 512
		for s := 0; s < len(data); s += sector {
			sec := data[s : s+sector]
			if n := bytes.Count(sec, []byte{0xab}); n != 0 && bytes.Count(sec, []byte{0}) != 0 {
				// Only the first sector of an unaligned request may
				// hold both: its bytes before the request's start.
				if !(s%(1<<20) == 512 && bytes.Equal(sec[:1000-512], make([]byte, 1000-512)) && n == len(sec)-(1000-512)) {
					t.Errorf("sector at %d holds %d new bytes and %d old ones: torn", s, n, sector-n)
				}
			}
		}
	})
	if !waitFor(5*time.Second, func() bool {
		pipes.mu.Lock()
		defer pipes.mu.Unlock()
		return pipes.live == len(pipes.idle)
	}) {
		t.Fatalf("%d pipes open, %d of them idle", pipes.live, len(pipes.idle))
	}
}
