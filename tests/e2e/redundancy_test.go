package e2e

// Failure tests of the redundant layers (issue 4, "Failures survived"):
// `mirror` (RAID-1) and `parity` (RAID-5) volumes lose a leg's backing
// file while a real server serves them to real NBD clients (qemu-io,
// nbdcopy), are repaired with `basalt volume repair`, survive a kill -9
// in the middle of a rebuild, and (parity) a kill -9 in the middle of
// stripe updates (the write hole). Data is always checked through NBD
// against what was written; leg files are read directly only where the
// claim is about them (a rebuilt mirror leg equals the good one, a stale
// one differs exactly where it missed writes, parity legs XOR to zero).

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// Helpers (prefixed red… to stay out of the other e2e files' way)

// redShow runs `volume show` and returns the volume and its typ layer.
func redShow(t *testing.T, c *Client, ref, typ string) (Volume, StackNode) {
	t.Helper()
	v := c.Volume(ref)
	n := v.Stack.Find(typ)
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

// redResyncReport is a repair job's report.
type redResyncReport struct {
	ResyncedBytes *int64 `json:"resynced_bytes"`
}

// redResynced decodes last_job.report.resynced_bytes of a finished repair.
func redResynced(t *testing.T, v Volume) int64 {
	t.Helper()
	var r redResyncReport
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

// redXORZero fails unless the files (the legs of a parity layer, XOR
// parity) XOR to zero at every offset: each stripe's parity chunk is the
// XOR of its data chunks, wherever the rotation puts it. Equivalently:
// whichever single leg is lost, XOR-reconstructing it from the other three
// gives back exactly its content. (Errorf: the test goes on, so a leg-loss
// read after it can show what a mismatch costs.)
func redXORZero(t *testing.T, what string, paths []string) {
	t.Helper()
	acc := mustRead(t, paths[0])
	for _, p := range paths[1:] {
		b := mustRead(t, p)
		if len(b) != len(acc) {
			t.Fatalf("%s: %s has %d bytes, %s %d", what, p, len(b), paths[0], len(acc))
		}
		for i := range acc {
			acc[i] ^= b[i]
		}
	}
	if d := redDiffBlocks(acc, make([]byte, len(acc)), 4096); len(d) > 0 {
		t.Errorf("%s: parity does not match the data in %d blocks of 4 KiB, first at leg offset %d", what, len(d), d[0])
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
		{2 * MiB, randomBytes(t, int(MiB))},         // over data written before
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

// TestMirrorLegReturnResyncsOnlyChanges: a leg file of a mirrored volume
// is missing when the server starts (moved aside): the volume comes up
// degraded and takes writes (3 × 64 KiB in three 1 MiB regions). Once the
// file is back it differs from the good leg in exactly the blocks written
// meanwhile, and the mirror keeps it failed (reads never come from it)
// until a repair: once the volume is in use, the node sees the leg's file
// back and starts the repair job itself (internal/volume/legreturn.go),
// which copies exactly the three 1 MiB regions (resynced_bytes) and leaves
// both leg files identical.
func TestMirrorLegReturnResyncsOnlyChanges(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io", "nbdcopy")
	start := time.Now()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	const size, reg = 32 * MiB, 1 * MiB // reg: the mirror's default region
	vol := admin.CreateVolume("--size", sz(size), "--type", "mirrored", "--name", "m")
	in := filepath.Join(t.TempDir(), "in.img")
	writeRandomFile(t, in, size)
	admin.withAttachment(vol.ID, "rw", func(uri string) {
		toolOK(t, time.Minute, "nbdcopy", "--flush", in, uri)
	})
	base := []region{{0, mustRead(t, in)}}
	os.Remove(in)
	_, m := redShow(t, admin, vol.ID, "mirror")
	redWantStates(t, "mirror after the first writes", m, "ok", "ok", "ok")
	legs := redLegPaths(t, m)

	n.StopOK()
	away := legs[1] + ".away"
	if err := os.Rename(legs[1], away); err != nil {
		t.Fatal(err)
	}
	n.Restart()
	changes := []region{
		{3*reg + 8192, randomBytes(t, 65536)},
		{17*reg + 512*KiB, randomBytes(t, 65536)},
		{30*reg + reg - 65536, randomBytes(t, 65536)},
	}
	admin.WriteRegions(vol.ID, changes)
	_, m = redShow(t, admin, vol.ID, "mirror")
	redWantStates(t, "mirror with leg 1's file missing", m, "degraded", "ok", "failed")
	if p := m.Children[1].Path; p != legs[1] {
		t.Errorf("the missing leg's path is %q, want %q", p, legs[1])
	}
	n.StopOK()
	if err := os.Rename(away, legs[1]); err != nil {
		t.Fatal(err)
	}

	// The returned leg holds the old data exactly where the writes went.
	good, old := mustRead(t, legs[0]), mustRead(t, legs[1])
	var want []int64
	for _, c := range changes {
		for off := c.off; off < c.off+int64(len(c.data)); off += 4096 {
			want = append(want, off)
		}
	}
	if got := redDiffBlocks(good, old, 4096); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("before repair the returned leg differs from the good one in blocks %v, want exactly the %d written while it was away %v", got, len(want), want)
	}
	n.Restart()
	_, m = redShow(t, admin, vol.ID, "mirror")
	redWantStates(t, "mirror with leg 1 back, before repair", m, "degraded", "ok", "failed")
	expect := image(size, base, changes)
	checkImage(t, "volume with a stale leg back, before repair", admin.VolumeCopy(vol.ID), expect)

	// In use again, the volume repairs itself: the node sees the failed
	// leg's file back and starts the repair job `volume repair` would.
	a := admin.Attach(vol.ID, ioHost, "rw")
	q := startQemuSession(t, "-f", "raw", a.NBDURI)
	var v Volume
	for deadline := time.Now().Add(60 * time.Second); ; {
		admin.OK(&v, "volume", "show", vol.ID)
		if v.LastJob != nil && v.Progress == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no repair 60 s after the leg came back: %+v", v)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if v.LastJob.Job != "repair" || v.LastJob.Error != "" {
		t.Fatalf("the job started when the leg came back: %+v", v.LastJob)
	}
	if got := redResynced(t, v); got != 3*reg {
		t.Errorf("repair resynced %d bytes, want %d (the three regions written while the leg was away)", got, 3*reg)
	}
	q.in.Close()
	q.p.Wait(5 * time.Second)
	admin.Detach(a.ID)
	_, m = redShow(t, admin, vol.ID, "mirror")
	redWantStates(t, "mirror after repair", m, "ok", "ok", "ok")
	redSameFiles(t, "leg files after repair", legs[0], legs[1])
	checkImage(t, "volume after repair", admin.VolumeCopy(vol.ID), expect)
	// Nothing left to do: a second repair copies nothing.
	if got := redResynced(t, redRepair(t, admin, vol.ID)); got != 0 {
		t.Errorf("a repair of a healthy mirror resynced %d bytes", got)
	}
	t.Logf("took %v", time.Since(start).Round(time.Millisecond))
}

// redSlowMirrorStack is a mirror of 64 KiB regions (a rebuild checkpoints
// every 64 regions, 4 MiB) whose leg 1 is throttled to 8 MiB/s: rebuilding
// leg 1 of a 32 MiB volume takes about 4 s on any machine, while writes
// with leg 1 missing go to the unthrottled leg 0 at full speed.
const redSlowMirrorStack = `{"type":"cow","children":[{"type":"mirror","params":{"region":65536},"children":[
	{"type":"file","params":{"path":"leg0.img"}},
	{"type":"throttle","params":{"bps":8388608},"children":[{"type":"file","params":{"path":"leg1.img"}}]}]}]}`

// redWaitProgress polls `volume show` until the typ layer is rebuilding
// with at least lo percent done, and returns that percentage. It fails if
// the rebuild ends first or is past hi percent when first seen past lo.
func redWaitProgress(t *testing.T, c *Client, ref, typ string, lo, hi float64) float64 {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, l := redShow(t, c, ref, typ)
		if l.State == "rebuilding" && l.Progress != nil && *l.Progress >= lo {
			if *l.Progress > hi {
				t.Fatalf("%s rebuild at %.1f%% when first seen past %.0f%%: too fast to interrupt in the middle", typ, *l.Progress, lo)
			}
			return *l.Progress
		}
		if l.State != "rebuilding" && l.State != "degraded" {
			t.Fatalf("%s is %s while waiting for its rebuild to reach %.0f%%", typ, l.State, lo)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s rebuild did not reach %.0f%% in 20s: %s %v", typ, lo, l.State, l.Progress)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMirrorRepairResumesAfterRestart: a mirror leg (throttled, so the
// rebuild takes seconds) is lost and 32 MiB written without it; `volume
// repair` starts rebuilding a replacement, and the server is killed
// (SIGKILL) with the rebuild between 30 % and 70 %. After the restart the
// recorded job runs again and the rebuild resumes from its last checkpoint:
// the job's resynced_bytes is less than the volume by at least the
// checkpointed part seen before the kill (a rebuild starting over would
// copy all 32 MiB). It ends without error, the mirror is ok, the legs are
// byte-identical and the volume reads back as written.
func TestMirrorRepairResumesAfterRestart(t *testing.T) {
	t.Parallel()
	requireTools(t, "nbdcopy")
	start := time.Now()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	admin.OK(nil, "type", "create", "slowmirror", "--stack", stackFile(t, redSlowMirrorStack))
	const size, reg, checkpoint = 32 * MiB, 64 * KiB, 64
	vol := admin.CreateVolume("--size", sz(size), "--type", "slowmirror", "--name", "m")
	_, m := redShow(t, admin, vol.ID, "mirror")
	legs := redLegPaths(t, m)
	if err := os.Remove(legs[1]); err != nil { // the stack is closed: it opens without it
		t.Fatal(err)
	}
	in := filepath.Join(t.TempDir(), "in.img")
	writeRandomFile(t, in, size)
	admin.withAttachment(vol.ID, "rw", func(uri string) {
		toolOK(t, time.Minute, "nbdcopy", "--flush", in, uri)
	})
	want := mustRead(t, in)
	os.Remove(in)
	_, m = redShow(t, admin, vol.ID, "mirror")
	redWantStates(t, "mirror written without leg 1", m, "degraded", "ok", "failed")

	var started Volume
	admin.OK(&started, "volume", "repair", vol.ID)
	if started.Progress == nil || started.Progress.Job != "repair" {
		t.Fatalf("volume repair printed progress %+v, want a running repair", started.Progress)
	}
	pct := redWaitProgress(t, admin, vol.ID, "mirror", 30, 70)
	n.Kill()
	killed := time.Now()
	copiedRegions := int64(pct / 100 * float64(size/reg)) // at least, when killed
	durable := (copiedRegions - 1) / checkpoint * checkpoint * reg
	t.Logf("killed the server with the rebuild at %.1f%% (≥ %d regions copied, ≥ %d bytes checkpointed)", pct, copiedRegions, durable)

	n.Restart()
	if _, m := redShow(t, admin, vol.ID, "mirror"); m.State != "rebuilding" && m.State != "ok" {
		t.Fatalf("after the restart the mirror is %s, want rebuilding (or already ok)", m.State)
	}
	v := admin.WaitJob(vol.ID, 30*time.Second)
	t.Logf("the resumed repair ended %v after the kill", time.Since(killed).Round(time.Millisecond))
	if v.LastJob == nil || v.LastJob.Job != "repair" || v.LastJob.Error != "" {
		t.Fatalf("the repair job after kill -9 and restart ended %+v", v.LastJob)
	}
	resynced := redResynced(t, v)
	t.Logf("resynced_bytes after the restart: %d of %d", resynced, size)
	if resynced <= 0 || resynced > size-durable {
		t.Errorf("after the restart the rebuild copied %d bytes; resuming from its checkpoint it copies at most %d (the %d bytes checkpointed before the kill are not copied again)", resynced, size-durable, durable)
	}
	_, m = redShow(t, admin, vol.ID, "mirror")
	redWantStates(t, "mirror after the resumed repair", m, "ok", "ok", "ok")
	redSameFiles(t, "leg files after the resumed repair", legs[0], legs[1])
	checkImage(t, "the rebuilt leg file", legs[1], want)
	checkImage(t, "volume after the resumed repair", admin.VolumeCopy(vol.ID), want)
	t.Logf("took %v", time.Since(start).Round(time.Millisecond))
}

// ---------------------------------------------------------------------------
// parity

// TestParityLegLost: a parity (3+1) volume filled with 48 MiB of random
// data loses leg 1's file under a live qemu-io client (RAID-5 rotates
// parity, so every leg holds data chunks of 3 stripes in 4 and parity of
// the 4th). The next flush notices; the volume is degraded and the whole
// export still reads exactly as written, writes go on (partial stripe,
// full stripes, across stripes) and read back; after a restart, with no
// file to fall back on, every byte is reconstructed correctly. `volume
// repair --wait` rebuilds a replacement (resynced_bytes = the whole
// volume), the layer is ok, also after a restart, the four leg files XOR
// to zero (parity matches the data everywhere); then a different leg
// (3) is lost and everything still reads back — which needs leg 1's
// rebuilt chunks to be right.
func TestParityLegLost(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io", "nbdcopy")
	start := time.Now()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	const size = 48 * MiB
	vol := admin.CreateVolume("--size", sz(size), "--type", "parity", "--name", "p")
	a := admin.Attach(vol.ID, "hv1", "rw")
	in := filepath.Join(t.TempDir(), "in.img")
	writeRandomFile(t, in, size)
	toolOK(t, time.Minute, "nbdcopy", "--flush", in, a.NBDURI)
	base := []region{{0, mustRead(t, in)}}
	os.Remove(in)

	s := startQemuSession(t, "-f", "raw", a.NBDURI)
	_, p := redShow(t, admin, vol.ID, "parity")
	redWantStates(t, "parity before the loss", p, "ok", "ok", "ok", "ok", "ok")
	legs := redLegPaths(t, p)
	if err := os.Remove(legs[1]); err != nil {
		t.Fatal(err)
	}
	redQemu(t, s, "flush") // notices the loss; must succeed
	_, p = redShow(t, admin, vol.ID, "parity")
	redWantStates(t, "parity after leg 1's file was deleted", p, "degraded", "ok", "failed", "ok", "ok")
	checkImage(t, "volume with leg 1 lost", copyOut(t, a.NBDURI), image(size, base))

	// Writes go on, degraded: inside one chunk, whole stripes (192 KiB),
	// across stripe boundaries, the last bytes.
	more := []region{
		{5*MiB + 4096, randomBytes(t, 8192)},
		{12 * MiB, randomBytes(t, int(3*MiB))},
		{30*MiB - 100*KiB, randomBytes(t, int(300*KiB))},
		{size - 4096, randomBytes(t, 4096)},
	}
	redWriteSession(t, s, more)
	want := image(size, base, more)
	checkImage(t, "volume written with leg 1 lost", copyOut(t, a.NBDURI), want)
	s.in.Close()
	s.p.Wait(5 * time.Second)

	// A restart: leg 1 has no file at all now, so its chunks can only come
	// from the other three.
	n.StopOK()
	n.Restart()
	checkImage(t, "volume with leg 1 lost, after a restart", copyOut(t, a.NBDURI), want)
	_, p = redShow(t, admin, vol.ID, "parity")
	redWantStates(t, "parity with leg 1 lost, after a restart", p, "degraded", "ok", "failed", "ok", "ok")

	v := redRepair(t, admin, vol.ID)
	if got := redResynced(t, v); got != size {
		t.Errorf("rebuilding a replacement leg resynced %d bytes, want all %d", got, size)
	}
	_, p = redShow(t, admin, vol.ID, "parity")
	redWantStates(t, "parity after repair", p, "ok", "ok", "ok", "ok", "ok")
	if !exists(legs[1]) || fileSize(t, legs[1]) != fileSize(t, legs[0]) {
		t.Fatalf("after repair leg 1 is not back at full size in %s", legs[1])
	}
	checkImage(t, "volume after repair", copyOut(t, a.NBDURI), want)
	n.StopOK()
	n.Restart()
	checkImage(t, "volume after repair and a restart", copyOut(t, a.NBDURI), want)
	redWaitClosed(t, n, legs[3])
	redXORZero(t, "leg files after repair", legs)

	// Now lose leg 3 (with the stack closed): leg 1's rebuilt chunks are
	// needed for every stripe.
	if err := os.Remove(legs[3]); err != nil {
		t.Fatal(err)
	}
	checkImage(t, "rebuilt volume with leg 3 lost", copyOut(t, a.NBDURI), want)
	_, p = redShow(t, admin, vol.ID, "parity")
	redWantStates(t, "parity with leg 3 lost after leg 1 was rebuilt", p, "degraded", "ok", "ok", "ok", "failed")
	t.Logf("took %v", time.Since(start).Round(time.Millisecond))
}

// redSlowParityStack is parity 3+1 with 4 KiB chunks (a rebuild commits
// batches of 256 stripes, 1/16 of a 48 MiB volume) whose leg 3 is
// throttled to 4 MiB/s: rebuilding leg 3 (16 MiB) takes about 4 s, so the
// rebuild spends 1.6 s between 30 % and 70 % (redWaitProgress), as the
// mirror's does: a `volume show` on a loaded machine can take a good part
// of a second, and at 8 MiB/s (0.8 s) one slow poll could skip the window.
const redSlowParityStack = `{"type":"cow","children":[{"type":"parity","params":{"chunk":4096},"children":[
	{"type":"file","params":{"path":"leg0.img"}},
	{"type":"file","params":{"path":"leg1.img"}},
	{"type":"file","params":{"path":"leg2.img"}},
	{"type":"throttle","params":{"bps":4194304},"children":[{"type":"file","params":{"path":"leg3.img"}}]}]}]}`

// TestParityRebuildResumes: leg 3 of a parity volume (throttled, so its
// rebuild takes seconds) is lost; `volume repair` rebuilds a replacement
// and the server is killed (SIGKILL) with the rebuild between 30 % and
// 70 %. After the restart the recorded job runs again and the rebuild
// resumes: the parity layer's progress never shows less than it had
// reached before the kill, and the job reconstructs at most the part not
// rebuilt before the kill (resynced_bytes). It ends without error, the
// layer is ok, the volume reads back as written, and the rebuilt leg 3 is
// exactly the XOR of the other three leg files (checked on the files: a
// degraded read through the throttled leg would take seconds).
func TestParityRebuildResumes(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io", "nbdcopy")
	start := time.Now()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	admin.OK(nil, "type", "create", "slowparity", "--stack", stackFile(t, redSlowParityStack))
	const size = 48 * MiB
	vol := admin.CreateVolume("--size", sz(size), "--type", "slowparity", "--name", "p")
	data := []region{
		{0, randomBytes(t, int(2*MiB))},
		{20*MiB + 4096, randomBytes(t, int(2*MiB))},
		{size - 2*MiB, randomBytes(t, int(2*MiB))},
	}
	admin.WriteRegions(vol.ID, data)
	want := image(size, data)
	_, p := redShow(t, admin, vol.ID, "parity")
	legs := redLegPaths(t, p)
	if err := os.Remove(legs[3]); err != nil { // the stack is closed: it opens without it
		t.Fatal(err)
	}

	var started Volume
	admin.OK(&started, "volume", "repair", vol.ID)
	if started.Progress == nil || started.Progress.Job != "repair" {
		t.Fatalf("volume repair printed progress %+v, want a running repair", started.Progress)
	}
	pct := redWaitProgress(t, admin, vol.ID, "parity", 30, 70)
	n.Kill()
	t.Logf("killed the server with the rebuild at %.2f%%", pct)

	n.Restart()
	var seen []float64
	v := admin.Volume(vol.ID)
	for deadline := time.Now().Add(30 * time.Second); v.Progress != nil; v = admin.Volume(vol.ID) {
		if time.Now().After(deadline) {
			t.Fatalf("the repair is still running 30s after the restart: %+v", v.Progress)
		}
		// Only the live stack reports progress: `volume show` before the
		// job has opened it describes a read-only open, which rebuilds
		// nothing and reports 0.
		if l := v.Stack.Find("parity"); l != nil && l.State == "rebuilding" && l.Progress != nil && *l.Progress > 0 {
			seen = append(seen, *l.Progress)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("parity progress seen after the restart: %v", seen)
	if len(seen) == 0 {
		t.Fatalf("no rebuild progress seen after the restart (last job %+v)", v.LastJob)
	}
	if seen[0] < pct {
		t.Errorf("after the restart the rebuild was at %.2f%%, below the %.2f%% reached before the kill: it started over", seen[0], pct)
	}
	if v.LastJob == nil || v.LastJob.Job != "repair" || v.LastJob.Error != "" {
		t.Fatalf("the repair job after kill -9 and restart ended %+v", v.LastJob)
	}
	resynced := redResynced(t, v)
	t.Logf("resynced_bytes after the restart: %d of %d", resynced, size)
	if limit := int64(math.Ceil(float64(size) * (1 - pct/100))); resynced <= 0 || resynced > limit {
		t.Errorf("after the restart the rebuild reconstructed %d bytes; resuming it reconstructs at most the %d not rebuilt before the kill", resynced, limit)
	}
	_, p = redShow(t, admin, vol.ID, "parity")
	redWantStates(t, "parity after the resumed repair", p, "ok", "ok", "ok", "ok", "ok")
	checkImage(t, "volume after the resumed repair", admin.VolumeCopy(vol.ID), want)
	redWaitClosed(t, n, legs[3])
	redXORZero(t, "leg files after the resumed rebuild", legs)
	t.Logf("took %v", time.Since(start).Round(time.Millisecond))
}

// ---------------------------------------------------------------------------
// parity: the write hole

// redStampBlock fills b (4 KiB) with the stamp of the block at volume offset
// off in generation gen: off and gen, then bytes from a generator seeded
// with both, so no mix of two blocks (a stripe reconstructed from stale
// parity XORs several) passes for a valid stamp.
func redStampBlock(b []byte, off, gen uint64) {
	binary.LittleEndian.PutUint64(b[0:], off)
	binary.LittleEndian.PutUint64(b[8:], gen)
	x := off*0x9E3779B97F4A7C15 ^ gen*0xD1B54A32D192ED03
	for i := 16; i+8 <= len(b); i += 8 {
		x += 0x9E3779B97F4A7C15 // splitmix64
		z := x
		z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
		z = (z ^ z>>27) * 0x94D049BB133111EB
		binary.LittleEndian.PutUint64(b[i:], z^z>>31)
	}
}

// redWriteStamped writes a whole volume image of generation gen to path.
func redWriteStamped(t *testing.T, path string, size int64, gen uint64) {
	t.Helper()
	b := make([]byte, size)
	for off := int64(0); off < size; off += 4096 {
		redStampBlock(b[off:off+4096], uint64(off), gen)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// redCheckStamped verifies that every 4 KiB block of the volume image at path
// is a valid stamp of its own offset in one of the generations gens, or a
// mix of them word by word (redTorn), and returns how many blocks hold
// each generation (torn ones under 0).
func redCheckStamped(t *testing.T, what, path string, gens ...uint64) map[uint64]int {
	t.Helper()
	b := mustRead(t, path)
	count := map[uint64]int{}
	want := make([]byte, 4096)
	bad := 0
	for off := 0; off+4096 <= len(b); off += 4096 {
		blk := b[off : off+4096]
		gen := binary.LittleEndian.Uint64(blk[8:])
		ok := binary.LittleEndian.Uint64(blk) == uint64(off) && slices.Contains(gens, gen)
		if ok {
			redStampBlock(want, uint64(off), gen)
			ok = bytes.Equal(blk, want)
		}
		if !ok && redTorn(blk, uint64(off), gens) {
			// A write the kill interrupted may have landed in part (a
			// spliced write moves the socket's pieces as they come): each
			// 8-byte word of the block is then that of one of the
			// generations. Garbage — a stripe rebuilt from stale parity
			// XORs several blocks — is not.
			count[0]++
			continue
		}
		if !ok {
			if bad++; bad <= 5 {
				t.Errorf("%s: the block at offset %d is neither generation %v of itself (it says offset %d, generation %d)",
					what, off, gens, binary.LittleEndian.Uint64(blk), gen)
			}
			continue
		}
		count[gen]++
	}
	if bad > 0 {
		t.Fatalf("%s: %d blocks of %d hold garbage", what, bad, len(b)/4096)
	}
	return count
}

// redTorn reports whether every 8-byte word of blk is the word at the same
// place of the stamp of the block at off in one of gens (two or more: a
// torn write), none of them whole.
func redTorn(blk []byte, off uint64, gens []uint64) bool {
	if len(gens) < 2 {
		return false
	}
	stamps := make([][]byte, len(gens))
	for i, g := range gens {
		stamps[i] = make([]byte, len(blk))
		redStampBlock(stamps[i], off, g)
	}
	for w := 0; w+8 <= len(blk); w += 8 {
		if !slices.ContainsFunc(stamps, func(st []byte) bool { return bytes.Equal(blk[w:w+8], st[w:w+8]) }) {
			return false
		}
	}
	return true
}

// redParity4kStack is the built-in parity type (3+1) with 4 KiB chunks
// instead of 64 KiB: 16 times as many stripes are being updated at any
// moment, so a kill is far more likely to land inside one. (With parity
// recomputation at open disabled, TestParityWriteHole failed in 9 runs of
// 9 with this stack, in 5 of 6 with 64 KiB chunks.)
const redParity4kStack = `{"type":"cow","children":[{"type":"parity","params":{"chunk":4096},"children":[
	{"type":"file","params":{"path":"leg0.img"}},{"type":"file","params":{"path":"leg1.img"}},
	{"type":"file","params":{"path":"leg2.img"}},{"type":"file","params":{"path":"leg3.img"}}]}]}`

// TestParityWriteHole: the RAID-5 write hole. nbdcopy writes a whole
// generation g of stamped blocks (every 4 KiB carries its offset and
// generation) onto a parity volume (redParity4kStack) and flushes; then it
// starts writing generation g+1 and the server is killed (SIGKILL) in the
// middle, with stripe updates in flight. After the restart every block reads as
// generation g (flushed before the kill) or g+1, never anything else, with
// both present (the kill did interrupt the writer). Then one leg's file is
// deleted: the export reads back byte for byte as before the loss — the
// missing chunks are reconstructed from parity, so parity left behind by
// the interrupted updates must have been made consistent at the restart
// (the leg files also XOR to zero right after it). Three rounds, each
// losing a different leg and repairing it.
func TestParityWriteHole(t *testing.T) {
	t.Parallel()
	requireTools(t, "nbdcopy")
	start := time.Now()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	const size = 24 * MiB
	admin.OK(nil, "type", "create", "parity4k", "--stack", stackFile(t, redParity4kStack))
	vol := admin.CreateVolume("--size", sz(size), "--type", "parity4k", "--name", "hole")
	a := admin.Attach(vol.ID, "hv1", "rw")
	_, p := redShow(t, admin, vol.ID, "parity")
	legs := redLegPaths(t, p)
	dir := t.TempDir()
	genFile := func(gen uint64) string {
		f := filepath.Join(dir, fmt.Sprintf("gen%d.img", gen))
		redWriteStamped(t, f, size, gen)
		return f
	}

	for round := range 3 {
		g := uint64(2*round + 1)
		old, next := genFile(g), genFile(g+1)
		// Kill while generation g+1 is being written, 15, 30 or 45 % into
		// the time writing generation g took; again if the kill did not
		// leave a mix of both generations (sooner if g+1 was complete,
		// later if none of it had landed).
		var before string
		frac := float64(15+15*round) / 100
		for attempt := 0; ; attempt++ {
			if attempt == 4 {
				t.Fatalf("round %d: %d kills did not interrupt nbdcopy in the middle of a generation", round, attempt)
			}
			t0 := time.Now()
			toolOK(t, time.Minute, "nbdcopy", "--flush", old, a.NBDURI)
			took := time.Since(t0)
			w := startBG(t, "nbdcopy", next, a.NBDURI)
			wait := time.Duration(float64(took) * frac)
			time.Sleep(wait)
			n.Kill()
			w.Wait(10 * time.Second)
			n.Restart()
			// The first open after the crash recovers the stripes that
			// were being updated; reads of a healthy array come from
			// data chunks, never from parity.
			before = copyOut(t, a.NBDURI)
			counts := redCheckStamped(t, fmt.Sprintf("round %d after kill -9", round), before, g, g+1)
			t.Logf("round %d: killed %v into writing generation %d (generation %d took %v): blocks of generation %d: %d, of %d: %d, torn: %d",
				round, wait.Round(time.Millisecond), g+1, g, took.Round(time.Millisecond), g, counts[g], g+1, counts[g+1], counts[0])
			if counts[g] > 0 && counts[g+1] > 0 {
				break
			}
			if counts[g+1] == 0 {
				frac *= 2
			} else {
				frac /= 2
			}
		}
		lost := legs[round]
		redWaitClosed(t, n, lost)
		redXORZero(t, fmt.Sprintf("round %d: leg files after the restart", round), legs)
		if err := os.Remove(lost); err != nil {
			t.Fatal(err)
		}
		after := copyOut(t, a.NBDURI)
		if fileSum(t, after) != fileSum(t, before) {
			redCheckStamped(t, fmt.Sprintf("round %d with leg %d lost", round, round), after, g, g+1)
			t.Fatalf("round %d: with leg %d lost the volume reads differently than before the loss", round, round)
		}
		_, p = redShow(t, admin, vol.ID, "parity")
		if p.State != "degraded" || p.Children[round].State != "failed" {
			t.Fatalf("round %d: parity %s with legs %v after leg %d was lost", round, p.State, redLegStates(p), round)
		}
		redRepair(t, admin, vol.ID)
		_, p = redShow(t, admin, vol.ID, "parity")
		redWantStates(t, fmt.Sprintf("round %d: parity after repair", round), p, "ok", "ok", "ok", "ok", "ok")
		os.Remove(old)
		os.Remove(next)
		os.Remove(before)
		os.Remove(after)
	}
	t.Logf("took %v", time.Since(start).Round(time.Millisecond))
}
