package nbd

import (
	"testing"
	"time"
)

// TestRepliesNotHeldByBudget: a reply the reader queued goes out even when
// the reader then waits for room in the budget behind slow requests.
func TestRepliesNotHeldByBudget(t *testing.T) {
	file, _ := sparseFile(t, testSize)
	const slow = 1500 * time.Millisecond
	dev := &hookDevice{Device: file, flush: func(next func() error) error {
		time.Sleep(slow)
		return next()
	}}
	_, addr := serve(t, dev, func(s *Server) { s.MaxInFlight = 2 })
	c, _ := open(t, addr, false, false)
	// One TCP write: a small write (the reader runs it and queues its
	// reply), two slow flushes that fill the budget, and a trim that
	// waits for room.
	var b []byte
	b = append(b, encRequest(0, cmdWrite, 1, 0, 4096)...)
	b = append(b, make([]byte, 4096)...)
	b = append(b, encRequest(0, cmdFlush, 2, 0, 0)...)
	b = append(b, encRequest(0, cmdFlush, 3, 0, 0)...)
	b = append(b, encRequest(0, cmdTrim, 4, 0, 4096)...)
	start := time.Now()
	if err := c.write(b); err != nil {
		t.Fatal(err)
	}
	if ch := c.reply(1); ch[0].errno != 0 {
		t.Fatalf("write: errno %d", ch[0].errno)
	}
	if d := time.Since(start); d > slow/2 {
		t.Fatalf("the write's reply took %v: held behind the flushes", d)
	}
	seen := map[uint64]bool{}
	for range 3 { // the flushes and the trim, in any order
		ch, err := c.readReply()
		if err != nil {
			t.Fatal(err)
		}
		seen[ch.cookie] = true
	}
	if !seen[2] || !seen[3] || !seen[4] {
		t.Fatalf("replies for %v, want cookies 2, 3 and 4", seen)
	}
}
