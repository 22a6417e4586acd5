package volume

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/meta"
)

// TestReturnedLegRepaired: a mirrored volume opened while one leg's file
// is away runs degraded; while the file stays away nothing is started;
// once it is back, the node starts the volume's repair by itself, which
// copies what the leg missed, and both legs end up alike.
func TestReturnedLegRepaired(t *testing.T) {
	old := legProbeEvery
	legProbeEvery = 20 * time.Millisecond
	t.Cleanup(func() { legProbeEvery = old })
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	const size = 4 << 20
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: size, Type: "mirrored"})
	if err != nil {
		t.Fatal(err)
	}
	model := make([]byte, size)
	e.fill(s, v.ID, model, 5, [2]int64{0, size})

	st, err := s.Stack(ctx, e.volume(v.ID))
	if err != nil || st == nil {
		t.Fatalf("stack: %v %v", st, err)
	}
	mirror := st.Children[0] // the top image's stack
	if mirror.Type != "mirror" || len(mirror.Children) != 2 {
		t.Fatalf("top image's stack %+v, want a mirror of two legs", mirror)
	}
	leg0, leg1 := mirror.Children[0].Path, mirror.Children[1].Path
	if err := os.Rename(leg1, leg1+".away"); err != nil {
		t.Fatal(err)
	}

	// Opened with the leg away (as by an attachment): degraded, and
	// written meanwhile.
	l, release, err := s.acquireWritable(e.volume(v.ID))
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if got := l.Describe().State; got != block.StateDegraded {
		t.Fatalf("stack opened without a leg is %s, want degraded", got)
	}
	changed := bytes.Repeat([]byte{0x5a}, 1<<20)
	if err := l.WriteAt(changed, 1<<20, false); err != nil {
		t.Fatal(err)
	}
	copy(model[1<<20:], changed)
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * legProbeEvery)
	if cur := e.volume(v.ID); cur.Job != nil || cur.LastJob != nil {
		t.Fatalf("a job started while the leg was still away: %+v %+v", cur.Job, cur.LastJob)
	}

	if err := os.Rename(leg1+".away", leg1); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	var lj *meta.JobResult
	for lj == nil {
		if time.Now().After(deadline) {
			t.Fatal("no repair started 20 s after the leg came back")
		}
		time.Sleep(legProbeEvery)
		lj = e.waitJob(v.ID).LastJob
	}
	if lj.Kind != meta.JobRepair || lj.Error != "" {
		t.Fatalf("job after the leg came back: %+v", lj)
	}
	if b, _ := json.Marshal(lj.Report); string(b) != `{"resynced_bytes":1048576}` {
		t.Errorf("repair report %s, want the one region written while the leg was away", b)
	}
	if got := l.Describe().State; got != block.StateOK {
		t.Errorf("stack after the repair is %s", got)
	}
	a, err0 := os.ReadFile(leg0)
	b, err1 := os.ReadFile(leg1)
	if err0 != nil || err1 != nil || !bytes.Equal(a[:size], b[:size]) {
		t.Errorf("legs differ after the repair (%v, %v)", err0, err1)
	}
	release()
	e.sameVolume(s, v.ID, model, "after the returned leg's repair")
}
