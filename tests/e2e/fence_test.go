package e2e

// Fencing: a node cut off by a partition — alive, its hypervisor still
// connected and writing — stops writing the volume before any other node
// can take the volume's write lease over, so no write from the stale node
// lands after the takeover.

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestClusterFencingPartition(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io")
	c, lab := StartNetCluster(t, 3)
	vol := c.Admin(0).CreateVolume("--size", "64MiB", "--name", "fenced")
	a := c.Admin(1).Attach("fenced", "hv-n2", "rw") // n2 writes the volume
	if want := c.Nodes[1].nbdBase() + a.Export; a.NBDURI != want {
		t.Fatalf("nbd_uri %s, want n2's %s", a.NBDURI, want)
	}

	// The hypervisor lives on n2's side of the partition: one connection,
	// 64 KiB writes of 0xaa cycling over the first 32 MiB, each flushed.
	const region = 32 << 20
	w := startQemuSessionIn(t, lab.ns(2), "-f", "raw", a.NBDURI)
	type ack struct {
		i        int
		sent, at time.Time // before the write was sent; when its flush was answered
		ok       bool
	}
	var acks []ack
	write := func(i int) {
		off := int64(i%(region>>16)) << 16
		sent := time.Now()
		out := w.Do(fmt.Sprintf("write -P 0xaa %d 64k", off))
		ok := strings.Contains(out, "wrote 65536/65536")
		if ok {
			ok = !strings.Contains(w.Do("flush"), "failed")
		}
		acks = append(acks, ack{i, sent, time.Now(), ok})
	}
	i := 0
	for ; i < 20; i++ {
		write(i)
		if !acks[i].ok {
			t.Fatalf("write %d before the partition failed", i)
		}
	}

	lab.cut(2)
	cut := time.Now()
	// The stale holder keeps writing while the others notice; meanwhile
	// watch for the takeover.
	var moved time.Time
	var now Attachment
	for moved.IsZero() {
		write(i)
		i++
		r := c.Admin(0).Run("attachment", "show", a.ID)
		if r.Code == 0 && strings.Contains(r.Stdout, a.Export) && !strings.Contains(r.Stdout, c.Nodes[1].nbdBase()) {
			c.Admin(0).OK(&now, "attachment", "show", a.ID)
			moved = time.Now()
		}
		if time.Since(cut) > 30*time.Second {
			t.Fatalf("no takeover 30s after the holder was cut off")
		}
	}
	// When the takeover happened, not when this loop saw it: the new
	// holder's log line, written once its lease key was committed (one
	// host, one clock for every namespace).
	taken := leaseTakenAt(t, c, 1, vol.ID)
	t.Logf("takeover %v after the cut (seen after %v); nbd_uri %s",
		taken.Sub(cut).Round(time.Millisecond), moved.Sub(cut).Round(time.Millisecond), now.NBDURI)
	// The new holder writes 0xbb over the whole region.
	qemuIOGood(t, "the new holder's write", now.NBDURI, fmt.Sprintf("write -P 0xbb 0 %d", region), "flush")
	// The stale side goes on trying for a while.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); i++ {
		write(i)
	}
	w.in.Close()

	var lastOK time.Time
	fails := 0
	for _, k := range acks {
		if k.ok {
			lastOK = k.at
			// Sent after the takeover yet acknowledged: it landed after
			// it. (A write sent before and answered after is judged by
			// when the takeover was seen, the bound the test can prove.)
			if k.sent.After(taken) || k.at.After(moved) {
				t.Errorf("write %d was acknowledged by the cut-off node: sent %v, answered %v after the takeover",
					k.i, k.sent.Sub(taken), k.at.Sub(taken))
			}
		} else if k.at.After(cut) {
			fails++
		}
	}
	t.Logf("the cut-off node acknowledged its last write %v after the cut, %v before the takeover was seen; %d writes refused after",
		lastOK.Sub(cut).Round(time.Millisecond), moved.Sub(lastOK).Round(time.Millisecond), fails)
	if fails == 0 {
		t.Errorf("the cut-off node never refused a write")
	}

	// Healed: the stale node learns it lost the lease and writes nothing
	// of what it had buffered; the region holds the new holder's bytes.
	lab.heal(2)
	c.WaitRoles(60*time.Second, nil)
	time.Sleep(2 * time.Second)
	c.Admin(0).OK(&now, "attachment", "show", a.ID)
	if r := qemuIO(t, now.NBDURI, fmt.Sprintf("read -P 0xbb 0 %d", region)); qemuIOFailed(r) || strings.Contains(r.Stdout, "Pattern verification failed") {
		t.Fatalf("after the partition healed the region does not hold the new holder's write (a stale write landed?): %s\n%s", r, r.Stdout)
	}
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
