package cow

import (
	"bytes"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
)

// failFrom, when not negative, makes every write of a `flakyfile` layer at
// or beyond that offset fail.
var failFrom atomic.Int64

type flaky struct{ block.Layer }

func (f flaky) WriteAt(p []byte, off int64, fua bool) error {
	if from := failFrom.Load(); from >= 0 && off+int64(len(p)) > from {
		return errors.New("injected write error")
	}
	return f.Layer.WriteAt(p, off, fua)
}

func init() {
	failFrom.Store(-1)
	block.Register(block.Type{Name: "flakyfile", MinChildren: 0, MaxChildren: 0,
		New: func(env block.Env, raw json.RawMessage, _ []block.Layer) (block.Layer, error) {
			l, err := block.Build(env, block.Spec{Type: "file", Params: raw})
			return flaky{l}, err
		}})
}

// TestFailedWriteKeepsItsChunks: a write that copies a chunk up from a
// base and then fails on a later chunk leaves the first chunk the top's;
// its allocation bit must still reach the disk, or a later write to that
// chunk — acknowledged, flushed — is lost on reopen, read from the base
// again.
func TestFailedWriteKeepsItsChunks(t *testing.T) {
	const chunk = 8192
	spec := `{"type":"cow","params":{"chunk":8192},"children":[{"type":"flakyfile","params":{"path":"data.img"}}]}`
	env := testEnv(t, 4*chunk)
	l := build(t, env, spec)
	if err := l.WriteAt(bytes.Repeat([]byte{1}, 2*chunk), 0, false); err != nil { // chunks 0-1, then a base's
		t.Fatal(err)
	}
	if _, err := l.Snapshot("s"); err != nil {
		t.Fatal(err)
	}
	// Chunk 0 copied up, then chunk 1, whose copy-up's write fails.
	failFrom.Store(chunk)
	t.Cleanup(func() { failFrom.Store(-1) })
	if err := l.WriteAt(bytes.Repeat([]byte{2}, 2*chunk), 0, false); err == nil {
		t.Fatal("the write over a failing copy-up succeeded")
	}
	failFrom.Store(-1)
	// Chunk 0 again, acknowledged and flushed.
	want := bytes.Repeat([]byte{3}, chunk)
	if err := l.WriteAt(want, 0, false); err != nil {
		t.Fatal(err)
	}
	l = reopen(t, l, &env, spec)
	defer l.Close()
	got := make([]byte, chunk)
	if err := l.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("after reopen chunk 0 reads %#x…, want the flushed write's %#x", got[0], want[0])
	}
}
