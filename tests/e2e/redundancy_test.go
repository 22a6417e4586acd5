package e2e

// Failure tests of the redundant layers (issue 4, "Failures survived"):
// `mirror` (RAID-1) and `parity` (RAID-5) volumes lose a leg's backing
// file while a real server serves them to real NBD clients (qemu-io,
// nbdcopy), are repaired with `basalt volume repair`, survive a kill -9
// in the middle of a rebuild, and (parity) a kill -9 in the middle of
// stripe updates (the write hole). Data is always checked through NBD
// against what was written; leg files are compared directly only where
// the claim is about them (a rebuilt leg equals the good one).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// Helpers (prefixed red… to stay out of the other e2e files' way)

// redLayer is the first node of type typ in the tree, depth first.
func redLayer(s *StackNode, typ string) *StackNode {
	if s == nil {
		return nil
	}
	if s.Type == typ {
		return s
	}
	for i := range s.Children {
		if n := redLayer(&s.Children[i], typ); n != nil {
			return n
		}
	}
	return nil
}

// redShow runs `volume show` and returns the volume and its typ layer.
func redShow(t *testing.T, c *Client, ref, typ string) (Volume, StackNode) {
	t.Helper()
	v := c.Volume(ref)
	n := redLayer(v.Stack, typ)
	if n == nil {
		t.Fatalf("volume %s has no %s layer in its stack: %+v", ref, typ, v.Stack)
	}
	return v, *n
}

// redLegStates lists the states of a redundant layer's legs.
func redLegStates(n StackNode) []string {
	var out []string
	for _, c := range n.Children {
		out = append(out, c.State)
	}
	return out
}

// redLegPaths lists the backing file of each leg of a redundant layer (a
// leg may be a file or a throttle over a file).
func redLegPaths(t *testing.T, n StackNode) []string {
	t.Helper()
	var out []string
	for i, c := range n.Children {
		f := c.Files()
		if len(f) != 1 {
			t.Fatalf("%s leg %d has %d backing files (%v), want 1: %+v", n.Type, i, len(f), f, c)
		}
		out = append(out, f[0])
	}
	return out
}

// redWantStates fails unless the layer's state and its legs' states are as
// given.
func redWantStates(t *testing.T, what string, n StackNode, state string, legs ...string) {
	t.Helper()
	if got := redLegStates(n); n.State != state || strings.Join(got, ",") != strings.Join(legs, ",") {
		t.Fatalf("%s: %s is %s with legs %v, want %s with legs %v", what, n.Type, n.State, got, state, legs)
	}
}

// redRepair runs `volume repair REF --wait` and requires a repair job that
// ended without error; it returns the volume as printed at the end.
func redRepair(t *testing.T, c *Client, ref string) Volume {
	t.Helper()
	var v Volume
	r := c.OK(&v, "volume", "repair", ref, "--wait")
	if v.Progress != nil || v.LastJob == nil || v.LastJob.Job != "repair" || v.LastJob.Error != "" {
		t.Fatalf("volume repair --wait: progress %+v, last_job %+v, want a finished repair without error: %s", v.Progress, v.LastJob, r)
	}
	return v
}

// resyncReport is a repair job's report.
type resyncReport struct {
	ResyncedBytes *int64 `json:"resynced_bytes"`
}

// redResynced decodes last_job.report.resynced_bytes of a finished repair.
func redResynced(t *testing.T, v Volume) int64 {
	t.Helper()
	var r resyncReport
	if v.LastJob == nil || json.Unmarshal(v.LastJob.Report, &r) != nil || r.ResyncedBytes == nil {
		t.Fatalf("repair job without a resynced_bytes report: %+v", v.LastJob)
	}
	return *r.ResyncedBytes
}

// redSameFiles fails unless two files have identical contents.
func redSameFiles(t *testing.T, what, a, b string) {
	t.Helper()
	da, db := mustRead(t, a), mustRead(t, b)
	if len(da) != len(db) {
		t.Fatalf("%s: %s has %d bytes, %s %d", what, a, len(da), b, len(db))
	}
	if d := redDiffBlocks(da, db, 4096); len(d) > 0 {
		t.Fatalf("%s: %s and %s differ in %d blocks of 4 KiB, first at offset %d", what, a, b, len(d), d[0])
	}
}

// redDiffBlocks lists the offsets of the bs-byte blocks where a and b differ.
func redDiffBlocks(a, b []byte, bs int) []int64 {
	var out []int64
	for off := 0; off < len(a) && off < len(b); off += bs {
		end := min(off+bs, len(a), len(b))
		if !bytes.Equal(a[off:end], b[off:end]) {
			out = append(out, int64(off))
		}
	}
	return out
}

// redFileOpen reports whether process pid has path open.
func redFileOpen(t *testing.T, pid int, path string) bool {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("list fds of %d: %v", pid, err)
	}
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.TrimSuffix(l, " (deleted)") == path {
			return true
		}
	}
	return false
}

// redWaitClosed waits until the server no longer has path open: the
// volume's live stack was closed (its last NBD connection is gone).
func redWaitClosed(t *testing.T, n *Node, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for redFileOpen(t, n.PID(), path) {
		if time.Now().After(deadline) {
			t.Fatalf("the server still has %s open 10s after the last NBD client left", path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// redQemu runs a qemu-io session command and fails on an error.
func redQemu(t *testing.T, s *qemuSession, cmd string) string {
	t.Helper()
	out := s.Do(cmd)
	if strings.Contains(out, "failed") || strings.Contains(out, "error") || strings.Contains(out, "Pattern verification") {
		t.Fatalf("qemu-io %q: %s", cmd, out)
	}
	return out
}

// redWriteSession writes each region through a live qemu-io session
// (`write -s FILE`) and flushes.
func redWriteSession(t *testing.T, s *qemuSession, rs []region) {
	t.Helper()
	dir := t.TempDir()
	for i, r := range rs {
		p := filepath.Join(dir, fmt.Sprintf("r%d", i))
		if err := os.WriteFile(p, r.data, 0o600); err != nil {
			t.Fatal(err)
		}
		redQemu(t, s, fmt.Sprintf("write -q -s %s %d %d", p, r.off, len(r.data)))
	}
	redQemu(t, s, "flush")
}

// ---------------------------------------------------------------------------
// mirror

// TestMirrorLegDeleted: a leg file of a mirrored volume is deleted while
// a qemu-io client has the volume open. Writes and flushes go on without
// an error, everything reads back as written, the mirror is degraded with
// that leg failed. `volume repair --wait` creates a replacement leg and
// resynchronises it: the mirror is ok, both leg files exist and are
// byte-identical (and hold exactly the volume's image), the data reads
// back through NBD, also after a server restart.
func TestMirrorLegDeleted(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io", "nbdcopy")
	start := time.Now()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	const size = 32 * MiB
	vol := admin.CreateVolume("--size", sz(size), "--type", "mirrored", "--name", "m")
	a := admin.Attach(vol.ID, "hv1", "rw")
	s := startQemuSession(t, "-f", "raw", a.NBDURI)

	before := []region{
		{0, randomBytes(t, int(4*MiB))},
		{9*MiB + 512, randomBytes(t, int(3*MiB))},
		{size - 2*MiB, randomBytes(t, int(2*MiB))},
	}
	redWriteSession(t, s, before)
	_, m := redShow(t, admin, vol.ID, "mirror")
	redWantStates(t, "mirror before the loss", m, "ok", "ok", "ok")
	legs := redLegPaths(t, m)

	// Lose leg 0 (the one resyncs read from first) under the live stack.
	if err := os.Remove(legs[0]); err != nil {
		t.Fatal(err)
	}
	after := []region{
		{2 * MiB, randomBytes(t, int(MiB))},        // over data written before
		{20*MiB + 4096, randomBytes(t, int(2*MiB))}, // fresh space
	}
	redWriteSession(t, s, after) // the flush notices the loss and must still succeed
	redQemu(t, s, fmt.Sprintf("write -q -P 0x5a %d 65536", 24*MiB))
	redQemu(t, s, fmt.Sprintf("read -q -P 0x5a %d 65536", 24*MiB))
	redQemu(t, s, "flush")
	after = append(after, region{24 * MiB, bytes.Repeat([]byte{0x5a}, 65536)})
	want := image(size, before, after)
	checkImage(t, "volume with a leg deleted", copyOut(t, a.NBDURI), want)
	_, m = redShow(t, admin, vol.ID, "mirror")
	redWantStates(t, "mirror after leg 0's file was deleted", m, "degraded", "failed", "ok")
	if exists(legs[0]) {
		t.Fatalf("%s came back before any repair", legs[0])
	}

	v := redRepair(t, admin, vol.ID)
	_, m = redShow(t, admin, vol.ID, "mirror")
	redWantStates(t, "mirror after repair", m, "ok", "ok", "ok")
	if got := redLegPaths(t, m); got[0] != legs[0] || got[1] != legs[1] {
		t.Fatalf("legs after repair are %v, want %v", got, legs)
	}
	if got := redResynced(t, v); got != size {
		t.Errorf("repair onto a replacement leg resynced %d bytes, want all %d", got, size)
	}
	redSameFiles(t, "leg files after repair", legs[0], legs[1])
	checkImage(t, "the replacement leg file", legs[0], want)
	checkImage(t, "volume after repair", copyOut(t, a.NBDURI), want)

	s.in.Close()
	s.p.Wait(5 * time.Second)
	n.StopOK()
	n.Restart()
	checkImage(t, "volume after repair and a restart", copyOut(t, a.NBDURI), want)
	_, m = redShow(t, admin, vol.ID, "mirror")
	redWantStates(t, "mirror after repair and a restart", m, "ok", "ok", "ok")
	t.Logf("took %v", time.Since(start).Round(time.Millisecond))
}
