package mirror

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// fixture is the setting of the tests of legs that refuse: a mirror of two
// legs, a.img a plain file and b.img a file under test layers, filled with
// random data that model holds.
type fixture struct {
	*Layer
	t      *testing.T
	id     string       // the test layers' switch and hook id
	refuse *atomic.Bool // leg b's mirrortest-volatile refuses flushes
	region int64
	model  []byte
	rng    *rand.Rand
}

// newFixture opens the mirror of regions of region bytes over size bytes
// whose leg b is b.img under wrap, outermost first: "hook" (writeHooks),
// "volatile" (a page cache that a refused flush drops), "dsync" (FUA
// writes sync the cache), "syncresize" (Resize syncs first) and "filling"
// (blocktest's filling disk), all switched by the test's id.
func newFixture(t *testing.T, region, size int64, seed uint64, wrap ...string) *fixture {
	t.Helper()
	id := t.Name() + "/b.img"
	leg := `{"type":"file","params":{"path":"b.img"}}`
	for i := len(wrap) - 1; i >= 0; i-- {
		switch w := wrap[i]; w {
		case "hook", "volatile":
			leg = fmt.Sprintf(`{"type":"mirrortest-%s","params":{"id":%q},"children":[%s]}`, w, id, leg)
		case "dsync", "syncresize":
			leg = fmt.Sprintf(`{"type":"mirrortest-%s","children":[%s]}`, w, leg)
		case "filling":
			leg = blocktest.FillingSpec(id, leg)
		default:
			t.Fatalf("no test layer %q", w)
		}
	}
	spec := fmt.Sprintf(`{"type":"mirror","params":{"region":%d},"children":[{"type":"file","params":{"path":"a.img"}},%s]}`, region, leg)
	l := openMirror(t, block.Env{Dir: t.TempDir(), Size: size, Create: true}, spec)
	t.Cleanup(func() { l.Close() })
	f := &fixture{Layer: l, t: t, id: id, region: region, rng: rand.New(rand.NewPCG(seed, 2))}
	if strings.Contains(spec, "mirrortest-volatile") {
		f.refuse = volatileSwitch(id)
	}
	f.model = fillAll(t, l, seed)
	return f
}

// write writes random data over region r, into the model too.
func (f *fixture) write(r int64) {
	f.t.Helper()
	write(f.t, f.Layer, f.model, randBytes(f.rng, f.region), r*f.region)
}

// failB fails leg b, which then misses writes to regions.
func (f *fixture) failB(regions ...int64) {
	f.t.Helper()
	f.failLeg(1, f.legs[1].dev, errors.New("a disk error"))
	if err := f.persist(); err != nil {
		f.t.Fatal(err)
	}
	for _, r := range regions {
		f.write(r)
	}
}

// settle lets intent bits go at once and flushes twice: no bit is left
// set but those of writes to come.
func (f *fixture) settle() {
	f.t.Helper()
	f.clearDelay.Store(0)
	f.flushes(2)
}

// flushes flushes n times, each after the background work of the last.
func (f *fixture) flushes(n int) {
	f.t.Helper()
	for range n {
		if err := f.Flush(); err != nil {
			f.t.Fatal(err)
		}
		f.bg.Wait()
	}
}

// holdWrite holds the first write to leg b at off (a rebuild's or a
// resync's copy) until release is closed; reached is closed when it is
// held.
func (f *fixture) holdWrite(off int64) (reached, release chan struct{}) {
	reached, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	writeHooks.Store(f.id, func(at int64) {
		if at == off {
			once.Do(func() {
				close(reached)
				<-release
			})
		}
	})
	f.t.Cleanup(func() { writeHooks.Delete(f.id) })
	return reached, release
}

// holdRefusal holds the next flush leg b refuses between the refusal and
// its return (the mirror has not heard of it) until letOn is closed;
// refusedAt is closed when it is held. The file's sync after it succeeds.
func (f *fixture) holdRefusal() (refusedAt, letOn chan struct{}) {
	refusedAt, letOn = make(chan struct{}), make(chan struct{})
	refusedHooks.Store(f.id, func() {
		f.refuse.Store(false)
		close(refusedAt)
		<-letOn
	})
	f.t.Cleanup(func() { refusedHooks.Delete(f.id) })
	return refusedAt, letOn
}

// repair starts a repair; its error comes on the channel.
func (f *fixture) repair() <-chan error {
	done := make(chan error, 1)
	go func() { done <- f.Repair(f.t.Context(), nil) }()
	return done
}

// wantOK fails the test unless both legs are ok.
func (f *fixture) wantOK() {
	f.t.Helper()
	if s := legStates(f.Layer); s[0] != legOK || s[1] != legOK {
		f.t.Fatalf("legs %v, want both ok", s)
	}
}

// alike fails the test unless both legs hold the same bytes in region r,
// and takes those into the model: a write neither acknowledged nor
// refused by every leg may read as either version, so long as every leg
// holds the same.
func (f *fixture) alike(r int64) {
	f.t.Helper()
	a, b := make([]byte, f.region), make([]byte, f.region)
	if err := f.ReadCopy(0, a, r*f.region); err != nil {
		f.t.Fatal(err)
	}
	if err := f.ReadCopy(1, b, r*f.region); err != nil {
		f.t.Fatal(err)
	}
	if i := firstDiff(a, b); i >= 0 {
		f.t.Fatalf("legs differ in region %d at byte %d", r, i)
	}
	copy(f.model[r*f.region:], a)
}
