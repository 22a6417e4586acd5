package volume

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/meta"
)

// TestCollector: requests from many goroutines are served; a waiter
// returns once the requests made before it ran; a burst of requests is
// served by one run; a stopped service releases its waiters instead of
// hanging them.
func TestCollector(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.collectSoon()
			s.collected()
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatal("collection requests not served")
	}
	s.gc.mu.Lock()
	asked, done := s.gc.asked, s.gc.done
	s.gc.mu.Unlock()
	if done < 50 || done > asked {
		t.Fatalf("served %d of %d requests", done, asked)
	}

	// A burst of requests within the delay is served by one run (two if
	// the burst straddles a run's start).
	old := collectDelay
	collectDelay = 300 * time.Millisecond
	t.Cleanup(func() { collectDelay = old })
	s.collected()
	s.gc.mu.Lock()
	before := s.gc.runs
	s.gc.mu.Unlock()
	for range 20 {
		s.collectSoon()
		time.Sleep(5 * time.Millisecond)
	}
	s.collected()
	s.gc.mu.Lock()
	runs := s.gc.runs - before
	s.gc.mu.Unlock()
	if runs < 1 || runs > 2 {
		t.Fatalf("20 requests within the delay took %d runs, want 1 (2 at most)", runs)
	}

	s.Stop()
	s.collectSoon()
	stopped := make(chan struct{})
	go func() { s.collected(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("a waiter on a stopped service hangs")
	}
}

// TestSweepStacks: a collection removes the stacks of volumes that have
// no record and are older than the grace, unless this node is creating
// them or it could only read a stale copy of the records; recorded volumes
// keep theirs however old.
func TestSweepStacks(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{ImageGrace: time.Hour})
	alice := caller("alice")
	v, err := s.CreateVolume(ctxT(t), alice, CreateVolume{SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-2 * time.Hour)
	stack := func(id string, mtime time.Time) {
		t.Helper()
		dir := e.st.VolumeDir(id)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cow.sb"), []byte("leftover"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(dir, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chtimes(e.st.VolumeDir(v.ID), past, past); err != nil {
		t.Fatal(err)
	}
	old, young, creating := newID("vol-"), newID("vol-"), newID("vol-")
	stack(old, past)
	stack(young, time.Now())
	stack(creating, past)
	s.claim("create/" + creating)
	// A stale copy of the records (what a node without quorum reads)
	// proves nothing: the sweep removes nothing from it.
	s.sweepStacks(meta.Stale(ctxT(t)))
	if !exists(e.st.VolumeDir(old)) {
		t.Fatal("a sweep over a stale copy of the records removed a stack")
	}
	collect := func() {
		s.collectSoon()
		s.collected()
	}
	collect()
	want := []string{v.ID, young, creating}
	slices.Sort(want)
	if got := e.volumeDirs(); !slices.Equal(got, want) {
		t.Fatalf("volume directories after a collection: %v, want %v (the recorded, the young and the one being created)", got, want)
	}
	s.unclaim("create/" + creating)
	collect()
	want = []string{v.ID, young}
	slices.Sort(want)
	if got := e.volumeDirs(); !slices.Equal(got, want) {
		t.Fatalf("volume directories once the create gave up: %v, want %v", got, want)
	}
	e.sameVolume(s, v.ID, make([]byte, 1<<20), "the recorded volume")
}

// TestCollectorRunsUnasked: a leftover stack (a creation that failed) is
// removed once the grace is over even if no delete ever asks for a
// collection.
func TestCollectorRunsUnasked(t *testing.T) {
	old := minCollectEvery
	minCollectEvery = 50 * time.Millisecond
	t.Cleanup(func() { minCollectEvery = old })
	e := newEnv(t)
	e.started(Config{ImageGrace: 300 * time.Millisecond})
	id := newID("vol-")
	dir := e.st.VolumeDir(id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cow.sb"), []byte("leftover"), 0o600); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); exists(dir); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the leftover stack is still there; no collection ran")
		}
	}
}
