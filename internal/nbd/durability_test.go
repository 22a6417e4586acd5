package nbd

import (
	"bytes"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	_ "github.com/basalt-storage/basalt/internal/block/checksum"
)

// The durability promises a client relies on, through the real server
// over a layer stack whose files lose at a power loss whatever was never
// made durable (blocktest.FaultFS): a FLUSH covers every write
// acknowledged before it — on any connection, as CAN_MULTI_CONN says —
// and a FUA write is durable when its reply arrives.
func TestFlushAndFUASurvivePowerLoss(t *testing.T) {
	fs := blocktest.NewFaultFS()
	env := block.Env{Dir: t.TempDir(), Size: testSize, Create: true, MetaFS: fs.Open}
	spec := blocktest.Spec(t, blocktest.Cached(t, `{"type":"checksum","children":[{"type":"file","params":{"path":"a.img"}}]}`))
	l, err := block.Build(env, spec)
	if err != nil {
		t.Fatal(err)
	}
	_, addr := serve(t, l, nil)
	a, info := open(t, addr, true, false)
	b, _ := open(t, addr, false, false)
	if want := uint16(tflagSendFlush | tflagSendFUA | tflagMultiConn); info.flags&want != want {
		t.Fatalf("export flags %#x: FLUSH, FUA or MULTI_CONN not advertised", info.flags)
	}
	flush := func(c *rawClient) {
		t.Helper()
		if e := c.cmd(0, cmdFlush, 0, 0); e != 0 {
			t.Fatalf("FLUSH: errno %d", e)
		}
	}
	type write struct {
		off  uint64
		data []byte
	}
	flushed := write{0, pattern(20000, 1)}       // then flushed on its connection
	fua := write{40000, pattern(5000, 2)}        // FUA, after the last FLUSH
	other := write{60000, pattern(9000, 3)}      // on b, flushed on a
	unflushed := write{100000, pattern(7000, 4)} // never made durable
	a.mustWrite(flushed.off, flushed.data)
	flush(a)
	b.mustWrite(other.off, other.data)
	flush(a)
	if e := a.writeAt(cflagFUA, fua.off, fua.data); e != 0 {
		t.Fatalf("FUA write: errno %d", e)
	}
	a.mustWrite(unflushed.off, unflushed.data)
	if got := b.mustRead(unflushed.off, uint32(len(unflushed.data))); !bytes.Equal(got, unflushed.data) {
		t.Fatal("a write acknowledged on one connection is not read on the other")
	}

	fs.Crash() // the power fails
	a.close()
	b.close()
	l.Close()
	env.Create, env.MetaFS = false, fs.Restart().Open
	l, err = block.Build(env, spec)
	if err != nil {
		t.Fatalf("reopen after the power loss: %v", err)
	}
	defer l.Close()
	read := func(w write) []byte {
		got := make([]byte, len(w.data))
		if err := l.ReadAt(got, int64(w.off)); err != nil {
			t.Fatalf("read after the power loss: %v", err)
		}
		return got
	}
	for name, w := range map[string]write{"flushed": flushed, "FUA": fua, "flushed on another connection": other} {
		if !bytes.Equal(read(w), w.data) {
			t.Errorf("the %s write is lost", name)
		}
	}
	// The model dropped what nobody made durable: the test can see a loss.
	if !bytes.Equal(read(unflushed), make([]byte, len(unflushed.data))) {
		t.Error("a write never flushed survived the power loss")
	}
}
