package nbd

import "testing"

// TestRepliesBeforeDisc: a READ and a DISC sent in one write: the READ's
// reply, buffered by the reader (which flushes only before it waits for
// the client, and did not wait before the DISC), still reaches the client
// before the connection closes.
func TestRepliesBeforeDisc(t *testing.T) {
	dev, _ := sparseFile(t, testSize)
	_, addr := serve(t, dev, nil)
	c := connect(t, addr, clientFixed|clientNoZeroes)
	c.goExport("disk")
	b := append(encRequest(0, cmdRead, 7, 0, 512), encRequest(0, cmdDisc, 8, 0, 0)...)
	if err := c.write(b); err != nil {
		t.Fatal(err)
	}
	r, err := c.readReply()
	if err != nil {
		t.Fatalf("no reply to the READ sent with DISC: %v", err)
	}
	if r.cookie != 7 || r.errno != 0 {
		t.Fatalf("reply %+v, want handle 7 without error", r)
	}
}
