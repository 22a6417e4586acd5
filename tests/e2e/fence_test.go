package e2e

// Fencing: a node cut off by a partition — alive, its hypervisor still
// connected and writing — stops writing the volume before any other node
// can take the volume's write lease over, so no write from the stale node
// lands after the takeover — nor after the partition heals, while its
// hypervisor still holds the stale connection.

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// fenceRegion is the part of the volume the tests write.
const fenceRegion = 32 << 20

// staleWriter is a hypervisor on the holder's side of the partition: one
// NBD connection, 64 KiB writes of 0xaa cycling over fenceRegion, each
// flushed, each outcome timed.
type staleWriter struct {
	t    *testing.T
	w    *qemuSession
	acks []fenceAck
}

type fenceAck struct {
	i        int
	sent, at time.Time // before the write was sent; when its flush was answered
	ok       bool
}

func newStaleWriter(t *testing.T, netns, uri string) *staleWriter {
	return &staleWriter{t: t, w: startQemuSessionIn(t, netns, "-f", "raw", uri)}
}

// write makes one write and reports whether it was acknowledged.
func (s *staleWriter) write() bool {
	i := len(s.acks)
	off := int64(i%(fenceRegion>>16)) << 16
	sent := time.Now()
	out := s.w.Do(fmt.Sprintf("write -P 0xaa %d 64k", off))
	ok := strings.Contains(out, "wrote 65536/65536")
	if ok {
		ok = !strings.Contains(s.w.Do("flush"), "failed")
	}
	s.acks = append(s.acks, fenceAck{i, sent, time.Now(), ok})
	return ok
}

// warmUp makes 20 writes, which must all be acknowledged.
func (s *staleWriter) warmUp() {
	for range 20 {
		if !s.write() {
			s.t.Fatalf("write %d before the partition failed", len(s.acks)-1)
		}
	}
}

// check fails the test for every write the cut-off node acknowledged
// after the takeover — sent after it happened (taken, from the new
// holder's log), or answered after the test saw it (seen) — and if none
// was refused after the cut; it logs the timing.
func (s *staleWriter) check(cut, taken, seen time.Time) {
	s.w.in.Close()
	var lastOK time.Time
	fails := 0
	for _, k := range s.acks {
		if k.ok {
			lastOK = k.at
			if k.sent.After(taken) || k.at.After(seen) {
				s.t.Errorf("write %d was acknowledged by the cut-off node: sent %v, answered %v after the takeover",
					k.i, k.sent.Sub(taken), k.at.Sub(taken))
			}
		} else if k.at.After(cut) {
			fails++
		}
	}
	s.t.Logf("the cut-off node acknowledged its last write %v after the cut, %v before the takeover; %d writes refused after",
		lastOK.Sub(cut).Round(time.Millisecond), taken.Sub(lastOK).Round(time.Millisecond), fails)
	if fails == 0 {
		s.t.Errorf("the cut-off node never refused a write")
	}
}

// healAndVerify reconnects the cut-off node i while its hypervisor keeps
// the stale connection and goes on writing through it, until the cluster
// has settled and 2 s beyond; then it checks the stale writer (check) and
// that the region holds the new holder's 0xbb: nothing the stale node had
// buffered, nor wrote after the heal, landed.
//
// Writing through the heal matters: once the node reaches etcd again it
// gets a fresh etcd lease, and it must learn that the volume's write lease
// went with the old one (its stack stays fenced for good, its connections
// close) before anything of the old stack can write again. With the
// session closed before the heal, as it was, a node that took a fresh
// lease and let its old stack write again passed this test.
func healAndVerify(t *testing.T, c *Cluster, lab *netLab, i int, attachment string, w *staleWriter, cut, taken, seen time.Time) {
	t.Helper()
	lab.heal(i)
	healed, before := time.Now(), len(w.acks)
	// The healed voter is back when TCP retransmits on etcd's peer
	// connections: up to about the partition's length after the heal with
	// the kernel's default tcp_rto_max_ms (docs/cluster.md).
	settleWithin := 60*time.Second + healed.Sub(cut)
	var settled, polled time.Time
	for settled.IsZero() || time.Since(settled) < 2*time.Second {
		w.write()
		time.Sleep(10 * time.Millisecond) // keep the failing writes from hogging a core
		if settled.IsZero() && time.Since(polled) > 300*time.Millisecond {
			polled = time.Now()
			if c.settled() {
				settled = time.Now()
			}
		}
		if time.Since(healed) > settleWithin {
			t.Fatalf("node list did not settle within %v of the heal (the partition lasted %v)",
				settleWithin.Round(time.Second), healed.Sub(cut).Round(time.Millisecond))
		}
	}
	t.Logf("the stale hypervisor tried %d writes in the %v after the heal", len(w.acks)-before, time.Since(healed).Round(time.Millisecond))
	w.check(cut, taken, seen)
	var now Attachment
	c.Admin(0).OK(&now, "attachment", "show", attachment)
	if r := qemuIO(t, now.NBDURI, fmt.Sprintf("read -P 0xbb 0 %d", fenceRegion)); qemuIOFailed(r) || strings.Contains(r.Stdout, "Pattern verification failed") {
		t.Fatalf("after the partition healed the region does not hold the new holder's write (a stale write landed?): %s\n%s", r, r.Stdout)
	}
}

// settled is one round of WaitRoles (every running node healthy, no
// learner left) that does not fail the test: for a loop that does
// something else meanwhile.
func (c *Cluster) settled() bool {
	for i, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		var ns []NodeInfo
		r := c.Admin(i).Run("node", "list")
		if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &ns) != nil {
			continue
		}
		return c.rolesOK(ns, nil)
	}
	return false
}

func TestClusterFencingPartition(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io")
	c, lab := StartNetCluster(t, 3)
	vol := c.Admin(0).CreateVolume("--size", "64MiB", "--name", "fenced")
	a := c.Admin(1).Attach("fenced", "hv-n2", "rw") // n2 writes the volume
	if want := c.Nodes[1].nbdBase() + a.Export; a.NBDURI != want {
		t.Fatalf("nbd_uri %s, want n2's %s", a.NBDURI, want)
	}
	w := newStaleWriter(t, lab.ns(2), a.NBDURI)
	w.warmUp()

	lab.cut(2)
	cut := time.Now()
	// The stale holder keeps writing while the others notice; meanwhile
	// watch for the takeover.
	var moved time.Time
	var now Attachment
	for moved.IsZero() {
		w.write()
		r := c.Admin(0).Run("attachment", "show", a.ID)
		if r.Code == 0 && strings.Contains(r.Stdout, a.Export) && !strings.Contains(r.Stdout, c.Nodes[1].nbdBase()) {
			c.Admin(0).OK(&now, "attachment", "show", a.ID)
			moved = time.Now()
		}
		if time.Since(cut) > 30*time.Second {
			t.Fatalf("no takeover 30s after the holder was cut off")
		}
	}
	// When the takeover happened, not only when this loop saw it: the
	// new holder's log line, written once its lease key was committed
	// (one host, one clock for every namespace).
	taken := leaseTakenAt(t, c, 1, vol.ID)
	t.Logf("takeover %v after the cut (seen after %v); nbd_uri %s",
		taken.Sub(cut).Round(time.Millisecond), moved.Sub(cut).Round(time.Millisecond), now.NBDURI)
	// The new holder writes 0xbb over the whole region. A hypervisor
	// connects again after a refused handshake; the new holder must serve
	// within 10 s of the takeover (the node logs why it refused one).
	for {
		r := qemuIO(t, now.NBDURI, fmt.Sprintf("write -P 0xbb 0 %d", fenceRegion), "flush")
		if !qemuIOFailed(r) {
			break
		}
		if time.Since(taken) > 10*time.Second {
			t.Fatalf("the new holder's write: still refused %v after the takeover: %s", time.Since(taken).Round(time.Millisecond), r)
		}
		t.Logf("the new holder refused a connection %v after the takeover; connecting again: %s", time.Since(taken).Round(time.Millisecond), r)
		time.Sleep(250 * time.Millisecond)
	}
	// The stale side goes on trying for a while.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		w.write()
	}
	healAndVerify(t, c, lab, 2, a.ID, w, cut, taken, moved)
}

// TestClusterFencingDetachElsewhere: the cut-off holder's rw attachment
// is detached through another node and the volume attached rw again
// there. The cut-off node never hears of the detach and goes on writing
// while its lease is valid; the new attachment's writes are refused until
// its lease is over, so no stale write lands after them.
func TestClusterFencingDetachElsewhere(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io")
	c, lab := StartNetCluster(t, 3)
	vol := c.Admin(0).CreateVolume("--size", "64MiB", "--name", "fenced")
	a := c.Admin(1).Attach("fenced", "hv-n2", "rw") // n2 writes the volume
	w := newStaleWriter(t, lab.ns(2), a.NBDURI)
	w.warmUp()

	lab.cut(2)
	cut := time.Now()
	c.Admin(0).Detach(a.ID)
	b := c.Admin(0).Attach("fenced", "hv-n1", "rw")
	// The new hypervisor writes 0xbb over the region until a node takes
	// its write; the stale one keeps writing meanwhile.
	var moved time.Time
	for moved.IsZero() {
		w.write()
		var now Attachment
		c.Admin(0).OK(&now, "attachment", "show", b.ID)
		if r := qemuIO(t, now.NBDURI, fmt.Sprintf("write -P 0xbb 0 %d", fenceRegion), "flush"); !qemuIOFailed(r) {
			moved = time.Now()
		}
		if time.Since(cut) > 30*time.Second {
			t.Fatalf("the new attachment could not write 30s after the old holder was cut off")
		}
	}
	taken := leaseTakenAt(t, c, 1, vol.ID)
	t.Logf("the new holder took the lease %v after the cut; its write was answered after %v",
		taken.Sub(cut).Round(time.Millisecond), moved.Sub(cut).Round(time.Millisecond))
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		w.write()
	}
	healAndVerify(t, c, lab, 2, b.ID, w, cut, taken, moved)
}

// leaseLine is a node's log line for taking a write lease: its time and volume.
var leaseLine = regexp.MustCompile(`^time=(\S+) .*msg="write lease acquired".* volume=(\S+)`)

// leaseTakenAt is when a node other than c.Nodes[except] logged taking
// vol's write lease; the test fails if none did.
func leaseTakenAt(t *testing.T, c *Cluster, except int, vol string) time.Time {
	t.Helper()
	for i, n := range c.Nodes {
		if i == except {
			continue
		}
		for _, line := range strings.Split(n.Log(), "\n") {
			m := leaseLine.FindStringSubmatch(line)
			if m == nil || m[2] != vol {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, m[1])
			if err != nil {
				t.Fatalf("log time %q: %v", m[1], err)
			}
			return at
		}
	}
	t.Fatalf("no node but %s logged taking the write lease of %s", c.Nodes[except].opts.Name, vol)
	return time.Time{}
}
