package nbd

import (
	"io"
	"testing"
)

// What admitting a request costs the reader: its place in the
// connection's budget (and the server's), taken and given back, with room
// to spare (the hot path).

func benchConn(s *Server) *conn {
	s.defaults()
	return &conn{srv: s, budget: newBudget(s.MaxInFlight, s.MaxInFlightBytes), total: s.total, done: make(chan struct{})}
}

// total: MaxInFlightBytesTotal (-1: no server-wide budget, as before it
// was added).
var benchTotals = []struct {
	name  string
	total int64
}{{"server-budget=off", -1}, {"server-budget=on", 0}}

func BenchmarkAdmit(b *testing.B) {
	for _, bt := range benchTotals {
		b.Run(bt.name, func(b *testing.B) {
			c := benchConn(&Server{MaxInFlightBytesTotal: bt.total})
			for b.Loop() {
				c.acquire(4096)
				c.release(4096)
			}
		})
	}
}

// Every goroutine a connection of its own, sharing the server.
func BenchmarkAdmitParallel(b *testing.B) {
	for _, bt := range benchTotals {
		b.Run(bt.name, func(b *testing.B) {
			s := &Server{MaxInFlightBytesTotal: bt.total}
			s.defaults()
			b.RunParallel(func(pb *testing.PB) {
				c := benchConn(s)
				for pb.Next() {
					c.acquire(4096)
					c.release(4096)
				}
			})
		})
	}
}

// A whole request over loopback: batches of 64 pipelined 4 KiB reads
// answered from the page cache.
func BenchmarkPipelinedReads4K(b *testing.B) {
	for _, bt := range benchTotals {
		b.Run(bt.name, func(b *testing.B) {
			dev, _ := sparseFile(b, 1<<20)
			_, addr := serve(b, dev, func(s *Server) { s.MaxInFlightBytesTotal = bt.total })
			c, _ := open(b, addr, false, false)
			const batch = 64
			req := make([]byte, 0, batch*requestSize)
			for i := range batch {
				req = append(req, encRequest(0, cmdRead, uint64(i), uint64(i)*4096%(1<<20), 4096)...)
			}
			reply := make([]byte, batch*(16+4096))
			b.SetBytes(4096)
			n := 0
			for b.Loop() {
				if n%batch == 0 {
					if err := c.write(req); err != nil {
						b.Fatal(err)
					}
					if _, err := io.ReadFull(c.r, reply); err != nil {
						b.Fatal(err)
					}
				}
				n++
			}
		})
	}
}
