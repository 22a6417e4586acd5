package volume

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/meta"
)

// storeFiles returns every regular file under the store's volume and
// image directories with its modification time and contents.
func storeFiles(t *testing.T, e *env) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, root := range []string{filepath.Dir(e.st.VolumeDir("x")), e.st.ImagesDir()} {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[p] = fi.ModTime().String() + "\x00" + string(b)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestReaderStackWritesNothing: a node serving a ro attachment of a
// volume it does not write opened the volume's stack read-write, with no
// lease behind it. Its layers then wrote as they do for a writer: a
// mirror whose write-intent bits were set — by the writer on another
// node, in the middle of its writes — resynchronised those regions and
// cleared the bits, under that writer's feet (a crash of the writer then
// left legs that differ and nothing saying so). A reader's stack is
// read-only now: serving it changes no file of the store.
func TestReaderStackWritesNothing(t *testing.T) {
	e, a, _, xb := twoNodes(t)
	ctx := ctxT(t)
	alice := caller("alice")
	const size = 4 << 20
	v, err := a.CreateVolume(ctx, alice, CreateVolume{SizeBytes: size, Type: "mirrored"})
	if err != nil {
		t.Fatal(err)
	}
	model := make([]byte, size)
	e.fill(a, v.ID, model, 3, [2]int64{0, size})

	// A writer on a (a job) in the middle of its writes: not flushed,
	// the mirror's intent bits set on disk.
	w, release, err := a.acquireWritable(e.volume(v.ID))
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	p := pattern(9, 1<<20)
	if err := w.WriteAt(p, 1<<20, false); err != nil {
		t.Fatal(err)
	}
	copy(model[1<<20:], p)
	before := storeFiles(t, e)

	_, exp := servedRO(t, a, xb, alice, v.ID)
	if !exp.ReadOnly || !exp.Device.Capabilities().ReadOnly {
		t.Fatalf("b serves the ro attachment (export read-only %v) through a stack that can write (read-only %v)", exp.ReadOnly, exp.Device.Capabilities().ReadOnly)
	}
	got := make([]byte, size)
	if err := exp.Device.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, model) {
		t.Fatalf("the reader reads wrong data at byte %d", firstDiff(got, model))
	}
	time.Sleep(200 * time.Millisecond) // a background resync would have run
	exp.Release()                      // b's last user: the stack is closed

	after := storeFiles(t, e)
	for p := range before {
		if after[p] != before[p] {
			t.Errorf("serving a reader on b changed %s", p)
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("serving a reader on b made %s", p)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	release()
	e.sameVolume(a, v.ID, model, "volume after the writer")
}

// TestWriterReplacesReaderStack: a node serving the ro attachments of a
// multiattach volume nobody writes has the volume open read-only; when an
// rw attachment then connects to it, the writer opens a stack of its own,
// and the readers — whose stack would not see its writes — are revoked,
// to reconnect to the writer's stack and read what it wrote.
func TestWriterReplacesReaderStack(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	x := runExports(t, s)
	ctx := ctxT(t)
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20, Multiattach: true})
	if err != nil {
		t.Fatal(err)
	}
	ro, err := s.Attach(ctx, alice, v.ID, "reader", meta.ModeRO)
	if err != nil {
		t.Fatal(err)
	}
	rexp, err := x.Open(ctx, ro.Export, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rexp.Release()
	if !rexp.Device.Capabilities().ReadOnly {
		t.Fatal("the reader's stack, opened with nobody writing the volume, can write")
	}
	rw, err := s.Attach(ctx, alice, v.ID, "writer", meta.ModeRW)
	if err != nil {
		t.Fatal(err)
	}
	wexp, err := x.Open(ctx, rw.Export, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer wexp.Release()
	if wexp.Device.Capabilities().ReadOnly {
		t.Fatal("the rw attachment is served read-only")
	}
	waitRevoked(t, rexp, "a writer opened the volume here")
	p := pattern(4, 1<<20)
	if err := wexp.Device.WriteAt(p, 0, true); err != nil {
		t.Fatal(err)
	}
	again, err := x.Open(ctx, ro.Export, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Release()
	got := make([]byte, 1<<20)
	if err := again.Device.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, p) {
		t.Fatal("the reconnected reader does not read what the writer wrote")
	}
}
