package mirror

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// gatedMeta holds superblock writes (the leg states) at a gate while
// armed, so a test can crash the machine while one is under way.
type gatedMeta struct {
	block.MetaFile
	armed *atomic.Bool
	hit   chan struct{}
	gate  chan struct{}
}

func (g gatedMeta) WriteAt(p []byte, off int64) (int, error) {
	if g.armed.Load() && off < bitmapBase {
		g.hit <- struct{}{}
		<-g.gate
	}
	return g.MetaFile.WriteAt(p, off)
}

// Invariant 3: a leg's failure is durable before any write it missed is
// acknowledged. Here leg 0 fails a write; while that failure is still
// being recorded, a FUA write (into a region whose intent bit is already
// set, so it needs no metadata of its own) skips leg 0. If it is
// acknowledged then and the machine stops before the record lands, the
// restart finds both legs ok, resynchronises the dirty region from leg 0,
// the lowest-numbered, and the acknowledged write is gone.
func TestWriteSkippingAFailureBeingRecorded(t *testing.T) {
	t.Parallel()
	const region = 65536
	dir := t.TempDir()
	fs := blocktest.NewFaultFS()
	var armed atomic.Bool
	hit, gate := make(chan struct{}, 1), make(chan struct{})
	metaFS := func(path string) (block.MetaFile, error) {
		f, err := fs.Open(path)
		return gatedMeta{f, &armed, hit, gate}, err
	}
	ida, idb := t.Name()+"a", t.Name()+"b"
	spec := failSpec(`{"region":65536,"meta":"`+faultMeta+`"}`, ida, idb)
	env := block.Env{Dir: dir, Size: 1 << 20, Create: true, MetaFS: metaFS}
	l := openMirror(t, env, spec)
	fillAll(t, l, 61) // every intent bit set and durable (the clear delay keeps them)

	armed.Store(true)
	faults(ida).write.Store(true)
	w1 := make(chan error, 1)
	go func() { w1 <- l.WriteAt([]byte("leg 0 fails this one"), 3*region, false) }()
	<-hit // leg 0 is failed in memory; its record is on its way

	w2 := []byte("acknowledged with FUA while leg 0's failure is being recorded")
	done := make(chan error, 1)
	go func() { done <- l.WriteAt(w2, 5*region+100, true) }()
	answered, acked := false, false
	select {
	case err := <-done:
		answered, acked = true, err == nil
	case <-time.After(time.Second): // it waits for the record: right
	}
	crashed, crashDir := fs.Restart(), copyDir(t, dir) // the machine stops here
	armed.Store(false)
	close(gate)
	<-w1
	if !answered {
		<-done
	}
	l.Close()
	faults(ida).write.Store(false)
	if !acked {
		return
	}
	env = block.Env{Dir: crashDir, Size: 1 << 20, MetaFS: crashed.Open}
	l = openMirror(t, env, spec)
	defer l.Close()
	l.bg.Wait()
	got := make([]byte, len(w2))
	for i := range l.NumCopies() {
		if err := l.ReadCopy(i, got, 5*region+100); err == nil && !bytes.Equal(got, w2) {
			t.Fatalf("copy %d lost a write acknowledged with FUA (legs %v)", i, legStates(l))
		}
	}
}

// A leg found shorter than the mirror at open (its file truncated, or
// replaced by an older, smaller one, while the volume was down) is marked
// failed. It lacks at least what lies beyond its end: those regions must
// be stale, durably before the failure is recorded (a failed leg's size is
// not checked again), or Repair, which grows the leg and copies only stale
// regions, returns it to service reading zeroes there.
func TestShortLegIsStaleBeyondItsEnd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fs := blocktest.NewFaultFS()
	spec := mirrorSpec(`{"region":65536,"meta":"`+faultMeta+`"}`, "a.img", "b.img")
	env := block.Env{Dir: dir, Size: 1 << 20, Create: true, MetaFS: fs.Open}
	l := openMirror(t, env, spec)
	model := fillAll(t, l, 67)
	mustClose(t, l)
	if err := os.Truncate(filepath.Join(dir, "b.img"), 300<<10); err != nil {
		t.Fatal(err)
	}
	env.Create = false
	fs = fs.Restart()
	env.MetaFS = fs.Open
	l = openMirror(t, env, spec)
	if got := legStates(l); got[1] != legFailed {
		t.Fatalf("short leg is %v", got)
	}
	// The machine stops right after the open recorded the failure.
	crashed := fs.Restart()
	l.Close()
	env.MetaFS = crashed.Open
	l = openMirror(t, env, spec)
	defer l.Close()
	if err := l.Repair(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	checkCopies(t, l, model)
}
