package cow

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	_ "github.com/basalt-storage/basalt/internal/block/checksum"
	_ "github.com/basalt-storage/basalt/internal/block/mirror"
)

const (
	mirrorSpec = `{"type":"cow","children":[{"type":"mirror","params":{"region":65536},"children":[{"type":"file","params":{"path":"leg0.img"}},{"type":"file","params":{"path":"leg1.img"}}]}]}`
	sumSpec    = `{"type":"cow","children":[{"type":"checksum","children":[{"type":"mirror","params":{"region":65536},"children":[{"type":"file","params":{"path":"leg0.img"}},{"type":"file","params":{"path":"leg1.img"}}]}]}]}`
)

// snapshotted builds a volume of spec, writes data at 0, snapshots it and
// closes it, and returns its (reopenable) env, the data and the snapshot's
// image.
func snapshotted(t *testing.T, spec string, data []byte) (block.Env, string) {
	t.Helper()
	env := testEnv(t, 4<<20)
	l := build(t, env, spec)
	if err := l.WriteAt(data, 0, false); err != nil {
		t.Fatal(err)
	}
	img, err := l.Snapshot("s1")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	env.Create = false
	return env, img
}

// repair runs every Repairer a maintenance walk reaches, as the volume
// service's repair job does, and returns how many it found.
func repair(t *testing.T, l block.Layer) int {
	t.Helper()
	n := 0
	err := block.WalkMaintain(context.Background(), l, func(x block.Layer) bool {
		if r, ok := x.(block.Repairer); ok {
			n++
			if err := r.Repair(context.Background(), nil); err != nil {
				t.Errorf("repair: %v", err)
			}
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// imageNode is the cow child describing image id.
func imageNode(t *testing.T, d block.Node, id string) block.Node {
	t.Helper()
	for _, c := range d.Children {
		if c.Image == id {
			return c
		}
	}
	t.Fatalf("no child for image %s in %+v", id, d)
	return block.Node{}
}

// A snapshot's image lost a mirror leg: the volume says so (state, image,
// the missing file's path), and a repair walk rebuilds that leg, though
// the image is read-only in the live chain.
func TestBaseLegLostShownAndRepaired(t *testing.T) {
	data := bytes.Repeat([]byte{0xab}, 1<<20)
	env, img := snapshotted(t, mirrorSpec, data)
	leg0 := filepath.Join(env.Images, img, "leg0.img")
	if err := os.Remove(leg0); err != nil {
		t.Fatal(err)
	}
	l := build(t, env, mirrorSpec)
	defer l.Close()
	d := l.Describe()
	if d.State != block.StateDegraded || len(d.Children) != 2 || d.Children[0].Image != l.Top() {
		t.Fatalf("cow over a snapshot with a lost leg: %+v, want degraded, the top then the base", d)
	}
	base := imageNode(t, d, img)
	if base.State != block.StateDegraded || base.Children[0].State != block.StateFailed || base.Children[0].Path != leg0 {
		t.Fatalf("base image's mirror %+v, want degraded with leg 0 failed at %s", base, leg0)
	}
	if n := repair(t, l); n != 2 { // the top's mirror and the base's
		t.Fatalf("repair walk reached %d repairers, want 2", n)
	}
	if d := l.Describe(); d.State != block.StateOK || imageNode(t, d, img).State != block.StateOK {
		t.Fatalf("after repair: %+v, want ok", d)
	}
	got, err := os.ReadFile(leg0)
	if err != nil || !bytes.Equal(got[:len(data)], data) {
		t.Fatalf("base leg 0 after repair: %v, rebuilt %v", err, err == nil && bytes.Equal(got[:len(data)], data))
	}
	// The base is read-only again: maintenance must not leave it writable
	// in the chain.
	l.chainMu.RLock()
	caps := l.byDepth[1].dev.Capabilities()
	l.chainMu.RUnlock()
	if !caps.ReadOnly {
		t.Fatal("the base image's stack is writable after maintenance")
	}
	p := make([]byte, len(data))
	if err := l.ReadAt(p, 0); err != nil || !bytes.Equal(p, data) {
		t.Fatalf("read after repair: %v", err)
	}
}

// A block only a snapshot's image holds is corrupt in one mirror leg: a
// scrub walk finds it below cow and rewrites it from the good copy.
func TestBaseScrubRepairs(t *testing.T) {
	data := bytes.Repeat([]byte("PATTERN!"), (1<<20)/8)
	env, img := snapshotted(t, sumSpec, data)
	leg0 := filepath.Join(env.Images, img, "leg0.img")
	b, err := os.ReadFile(leg0)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, []byte("PATTERN!"))
	if i < 0 {
		t.Fatal("pattern not in the leg")
	}
	f, err := os.OpenFile(leg0, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("XXXX"), int64(i+100)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	l := build(t, env, sumSpec)
	defer l.Close()
	var total block.ScrubReport
	err = block.WalkMaintain(context.Background(), l, func(x block.Layer) bool {
		if s, ok := x.(block.Scrubber); ok {
			r, err := s.Scrub(context.Background(), nil)
			if err != nil {
				t.Errorf("scrub: %v", err)
			}
			total.Bad += r.Bad
			total.Repaired += r.Repaired
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if total.Bad != 1 || total.Repaired != 1 {
		t.Fatalf("scrub %+v, want the base's bad block found and repaired", total)
	}
	if b, _ := os.ReadFile(leg0); bytes.Contains(b, []byte("XXXX")) {
		t.Fatal("the base's leg 0 is still corrupt")
	}
}

// A base frozen by this layer's own Snapshot keeps its read-write
// instance; a leg lost after that is repaired in place.
func TestFrozenInSessionBaseRepaired(t *testing.T) {
	data := bytes.Repeat([]byte{0x5c}, 1<<20)
	env := testEnv(t, 4<<20)
	l := build(t, env, mirrorSpec)
	defer l.Close()
	if err := l.WriteAt(data, 0, false); err != nil {
		t.Fatal(err)
	}
	img, err := l.Snapshot("s1")
	if err != nil {
		t.Fatal(err)
	}
	leg1 := filepath.Join(env.Images, img, "leg1.img")
	if err := os.Remove(leg1); err != nil {
		t.Fatal(err)
	}
	if d := l.Describe(); d.State != block.StateDegraded {
		t.Fatalf("after the base lost a leg: %+v, want degraded", d)
	}
	if n := repair(t, l); n != 2 {
		t.Fatalf("repair walk reached %d repairers, want 2", n)
	}
	if d := l.Describe(); d.State != block.StateOK {
		t.Fatalf("after repair: %+v", d)
	}
	if got, err := os.ReadFile(leg1); err != nil || !bytes.Equal(got[:len(data)], data) {
		t.Fatalf("base leg 1 not rebuilt: %v", err)
	}
}

// Two clones of one snapshot share its image; their maintenance of it is
// serialised by the image's lock, so the second waits for the first.
func TestSharedBaseMaintenanceIsExclusive(t *testing.T) {
	data := bytes.Repeat([]byte{0x33}, 1<<20)
	env, img := snapshotted(t, mirrorSpec, data)
	l := build(t, env, mirrorSpec)
	defer l.Close()
	c := clone(t, env, img, mirrorSpec)
	defer c.Close()
	leg0 := filepath.Join(env.Images, img, "leg0.img")
	if err := os.Remove(leg0); err != nil {
		t.Fatal(err)
	}
	// Another maintainer (the clone's, in another process: flock) holds
	// the image.
	unlock, err := lockImage(context.Background(), filepath.Join(env.Images, img))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan int)
	go func() { done <- repair(t, l) }()
	select {
	case <-done:
		t.Fatal("the repair went on while another maintainer held the image")
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := os.Stat(leg0); err == nil {
		t.Fatal("the leg was recreated while another maintainer held the image")
	}
	unlock()
	if n := <-done; n != 2 {
		t.Fatalf("repair walk reached %d repairers, want 2", n)
	}
	// The clone then finds the shared image repaired (its instance shows
	// the old state until it is maintained or reopened).
	if n := repair(t, c); n != 2 {
		t.Fatalf("clone's repair walk reached %d repairers, want 2", n)
	}
	for _, v := range []*Layer{l, c} {
		if d := v.Describe(); d.State != block.StateOK {
			t.Fatalf("after both repairs: %+v", d)
		}
	}
	// A maintainer waiting for the lock gives up with its context.
	unlock, err = lockImage(context.Background(), filepath.Join(env.Images, img))
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := block.WalkMaintain(ctx, c, func(block.Layer) bool { return true }); err == nil {
		t.Fatal("a maintenance walk waiting for a held image did not give up")
	}
}

// After a flatten the bases are out of the chain: not described, not
// maintained (the collector may be removing them).
func TestFlattenedBasesLeaveTheChain(t *testing.T) {
	env, img := snapshotted(t, mirrorSpec, bytes.Repeat([]byte{1}, 1<<16))
	l := build(t, env, mirrorSpec)
	defer l.Close()
	if n := len(l.Children()); n != 2 {
		t.Fatalf("%d children before flatten, want 2", n)
	}
	if err := l.Flatten(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(env.Images, img)); err != nil { // collected
		t.Fatal(err)
	}
	if d := l.Describe(); len(d.Children) != 1 || d.Children[0].Image != l.Top() || d.State != block.StateOK {
		t.Fatalf("after flatten: %+v, want the top only", d)
	}
	if n := repair(t, l); n != 1 {
		t.Fatalf("repair walk reached %d repairers, want the top's only", n)
	}
	if _, err := os.Stat(filepath.Join(env.Images, img)); err == nil {
		t.Fatal("a repair recreated a collected image")
	}
}

// A clone may not open for maintenance an image that the volume whose
// snapshot froze it still has open read-write (two read-write instances
// would overwrite each other's metadata); once that volume's stack is
// closed it can.
func TestFrozenImageNotOpenedTwice(t *testing.T) {
	data := bytes.Repeat([]byte{0x77}, 1<<20)
	env := testEnv(t, 4<<20)
	l := build(t, env, mirrorSpec)
	if err := l.WriteAt(data, 0, false); err != nil {
		t.Fatal(err)
	}
	img, err := l.Snapshot("s1")
	if err != nil {
		t.Fatal(err)
	}
	c := clone(t, env, img, mirrorSpec)
	defer c.Close()
	leg0 := filepath.Join(env.Images, img, "leg0.img")
	if err := os.Remove(leg0); err != nil {
		t.Fatal(err)
	}
	if err := block.WalkMaintain(context.Background(), c, func(block.Layer) bool { return true }); err == nil {
		t.Fatal("the clone opened for maintenance an image its source volume holds read-write")
	}
	if _, err := os.Stat(leg0); err == nil {
		t.Fatal("the leg was recreated beside the source volume's read-write instance")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if n := repair(t, c); n != 2 {
		t.Fatalf("clone's repair walk reached %d repairers, want 2", n)
	}
	if d := c.Describe(); d.State != block.StateOK {
		t.Fatalf("clone after repair: %+v", d)
	}
	if got, err := os.ReadFile(leg0); err != nil || !bytes.Equal(got[:len(data)], data) {
		t.Fatalf("the snapshot's leg 0 was not rebuilt: %v", err)
	}
}

// frozenHolderEnv names the directory in which TestFrozenHolderProcess,
// run as a child process, builds its volume.
const frozenHolderEnv = "BASALT_COW_FROZEN_HOLDER"

// TestFrozenHolderProcess is the other node of
// TestFrozenImageHeldAcrossProcesses: run as a child with frozenHolderEnv
// set, it builds a volume there, writes 0x77s, snapshots it, prints the
// snapshot's image and keeps the volume open until its stdin closes.
func TestFrozenHolderProcess(t *testing.T) {
	root := os.Getenv(frozenHolderEnv)
	if root == "" {
		return // only as a child
	}
	env := block.Env{Dir: filepath.Join(root, "vol"), Images: filepath.Join(root, "images"), Size: 4 << 20, Create: true}
	l := build(t, env, mirrorSpec)
	if err := l.WriteAt(bytes.Repeat([]byte{0x77}, 1<<20), 0, false); err != nil {
		t.Fatal(err)
	}
	img, err := l.Snapshot("s1")
	if err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("image " + img + "\n")
	io.Copy(io.Discard, os.Stdin)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestFrozenImageHeldAcrossProcesses: as TestFrozenImageNotOpenedTwice,
// with the volume that froze the image open in another process (another
// node): a clone here may not open the image read-write for maintenance
// until that process has closed it.
func TestFrozenImageHeldAcrossProcesses(t *testing.T) {
	root := t.TempDir()
	child := exec.Command(os.Args[0], "-test.run=^TestFrozenHolderProcess$")
	child.Env = append(os.Environ(), frozenHolderEnv+"="+root)
	child.Stderr = os.Stderr
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	img, ok := strings.CutPrefix(strings.TrimSpace(line), "image ")
	if err != nil || !ok {
		t.Fatalf("the child process said %q (%v)", line, err)
	}
	env := block.Env{Dir: filepath.Join(root, "vol"), Images: filepath.Join(root, "images"), Size: 4 << 20}
	c := clone(t, env, img, mirrorSpec)
	defer c.Close()
	leg0 := filepath.Join(env.Images, img, "leg0.img")
	if err := os.Remove(leg0); err != nil {
		t.Fatal(err)
	}
	err = block.WalkMaintain(context.Background(), c, func(block.Layer) bool { return true })
	if err == nil || !strings.Contains(err.Error(), "open read-write") {
		t.Fatalf("the clone's maintenance of an image another process holds read-write: %v", err)
	}
	if _, err := os.Stat(leg0); err == nil {
		t.Fatal("the leg was recreated beside the other process's read-write instance")
	}
	stdin.Close()
	go io.Copy(io.Discard, stdout)
	if err := child.Wait(); err != nil {
		t.Fatalf("child process: %v", err)
	}
	if n := repair(t, c); n != 2 {
		t.Fatalf("clone's repair walk reached %d repairers, want 2", n)
	}
	data := bytes.Repeat([]byte{0x77}, 1<<20)
	if got, err := os.ReadFile(leg0); err != nil || !bytes.Equal(got[:len(data)], data) {
		t.Fatalf("the snapshot's leg 0 was not rebuilt: %v", err)
	}
}
