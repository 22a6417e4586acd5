package nbd

import (
	"testing"
	"time"
)

// TestStats: an export's Stats count each request once its reply is
// written — per command, with its bytes, its failures and its latency —
// over every connection to the export, in both reply modes.
func TestStats(t *testing.T) {
	exp, _ := fileExport(t, "disk", 1<<20, false)
	st := &Stats{}
	exp.Stats = st
	addr := startServer(t, &Server{Exports: mapExports{"disk": exp}})
	for _, structured := range []bool{false, true} {
		c, _ := open(t, addr, structured, false)
		if e, _, _ := c.do(0, cmdWrite, 0, 4096, make([]byte, 4096)); e != 0 {
			t.Fatalf("write: %d", e)
		}
		c.mustRead(0, 8192)
		c.mustRead(4096, 512)
		if e, _, _ := c.do(0, cmdFlush, 0, 0, nil); e != 0 {
			t.Fatalf("flush: %d", e)
		}
		if e, _, _ := c.do(0, cmdRead, 1<<20, 4096, nil); e == 0 { // past the end
			t.Fatal("read past the end succeeded")
		}
		if e, _, _ := c.do(0, 99, 0, 0, nil); e == 0 {
			t.Fatal("unknown command succeeded")
		}
		c.close()
	}
	// A request is counted just after its reply is written: the client
	// may have it a moment before.
	total := func() (n uint64) {
		st.Each(func(_ string, o *OpStats) { n += o.Requests.Load() })
		return n
	}
	for deadline := time.Now().Add(5 * time.Second); total() < 12 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	want := map[string][3]uint64{ // requests, errors, bytes
		"read": {6, 2, 2 * (8192 + 512 + 4096)}, "write": {2, 0, 2 * 4096}, "flush": {2, 0, 0}, "other": {2, 2, 0},
	}
	st.Each(func(op string, o *OpStats) {
		w := want[op]
		if got := [3]uint64{o.Requests.Load(), o.Errors.Load(), o.Bytes.Load()}; got != w {
			t.Errorf("%s: requests, errors, bytes %v, want %v", op, got, w)
		}
	})
	var sum time.Duration
	var n uint64
	st.Each(func(op string, o *OpStats) {
		sum += time.Duration(o.Latency.SumNS())
		n += o.Latency.Count()
	})
	if n != 12 || sum <= 0 || sum > time.Minute {
		t.Errorf("latency: %d observations summing to %v", n, sum)
	}
}

// BenchmarkAnswered is what counting adds to a reply.
func BenchmarkAnswered(b *testing.B) {
	st := &Stats{}
	r := &reply{simple: true, req: request{typ: cmdRead, length: 4096, start: since()}}
	for i := 0; i < b.N; i++ {
		st.answered(r)
	}
}
