package volume

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block/cow"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// waitChain waits until volume id's chain has n images and collections
// have settled, and returns the chain.
func (e *env) waitChain(id string, n int) []string {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		e.settle()
		ch := e.chain(id)
		if len(ch) == n && e.volume(id).Job == nil {
			e.settle()
			return ch
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("volume %s reads %d images %v, want %d", id, len(ch), ch, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDeletedSnapshotSpaceReclaimed: deleting a snapshot that only the
// volume's own top sits on collapses its image with the top, and the old
// top — with every chunk the snapshot alone held — is collected; the
// volume reads the same throughout. While a clone sits on the image it is
// kept; once the clone is deleted too, it is collapsed then. A delete of
// the volume meeting a collapse waits for it.
func TestDeletedSnapshotSpaceReclaimed(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	const size = 4 << 20
	v, model := e.filledVolume(s, alice, size, 1)
	sn, err := s.CreateSnapshot(ctx, alice, v.ID, "s1", "")
	if err != nil {
		t.Fatal(err)
	}
	img := e.snapAvailable(sn.ID).Image
	top := e.top(v.ID)
	e.fill(s, v.ID, model, 2, [2]int64{1 << 20, 1 << 20}) // the snapshot's copy of this MiB is dead once it goes

	if err := s.DeleteSnapshot(ctx, alice, sn.ID); err != nil {
		t.Fatal(err)
	}
	if ch := e.waitChain(v.ID, 1); ch[0] != img {
		t.Fatalf("after the collapse the volume reads %v, want the snapshot's image %s as its top", ch, img)
	}
	if e.hasImage(top) {
		t.Errorf("the old top %s was not collected after the collapse", top)
	}
	e.wantImages(s, []string{v.ID}, nil)
	e.sameVolume(s, v.ID, model, "after the collapse")
	if lj := e.volume(v.ID).LastJob; lj != nil {
		t.Errorf("a successful collapse replaced last_job: %+v", lj)
	}

	// A clone holds the image: nothing is collapsed until it goes.
	sn2, err := s.CreateSnapshot(ctx, alice, v.ID, "s2", "")
	if err != nil {
		t.Fatal(err)
	}
	img2 := e.snapAvailable(sn2.ID).Image
	clone, err := s.CreateVolume(ctx, alice, CreateVolume{FromSnapshot: sn2.ID})
	if err != nil {
		t.Fatal(err)
	}
	cloneData := slices.Clone(model)
	e.fill(s, v.ID, model, 3, [2]int64{0, 1 << 20})
	if err := s.DeleteSnapshot(ctx, alice, sn2.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if ch := e.waitChain(v.ID, 2); ch[1] != img2 {
		t.Fatalf("with a clone on it the volume reads %v, want %s kept below its top", ch, img2)
	}
	e.sameVolume(s, clone.ID, cloneData, "clone of a deleted snapshot")
	if err := s.DeleteVolume(ctx, alice, clone.ID); err != nil {
		t.Fatal(err)
	}
	if ch := e.waitChain(v.ID, 1); ch[0] != img2 {
		t.Fatalf("after the clone went the volume reads %v, want %s as its top", ch, img2)
	}
	e.wantImages(s, []string{v.ID}, nil)
	e.sameVolume(s, v.ID, model, "after the second collapse")

	// A delete right after a snapshot's deletion waits for the collapse.
	if _, err := s.CreateSnapshot(ctx, alice, v.ID, "s3", ""); err != nil {
		t.Fatal(err)
	}
	e.fill(s, v.ID, nil, 4, [2]int64{0, size})
	if err := s.DeleteSnapshot(ctx, alice, "s3"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolume(ctx, alice, v.ID); err != nil {
		t.Fatalf("delete after a snapshot's deletion: %v", err)
	}
	e.settle()
	e.settle()
	e.wantImages(s, nil, nil)
	checkProvisioned(t)
}

// TestNoCollapseDuringSnapshot: between a snapshot's freeze and the
// commit that names its image, that image is the top's parent and no
// record names it yet; a collapse job running then must leave it alone
// (the volume's Snapshotting says a snapshot is being taken).
func TestNoCollapseDuringSnapshot(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	const size = 1 << 20
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: size})
	if err != nil {
		t.Fatal(err)
	}
	e.fill(s, v.ID, nil, 1, [2]int64{0, size})
	// CreateSnapshot's first transaction: the record, creating, and the
	// volume's Snapshotting.
	sn := &meta.Snapshot{ID: newID("snap-"), Name: "s", Owner: v.Owner, OwnerID: v.OwnerID, VolumeID: v.ID,
		Status: meta.StatusCreating, Node: s.cfg.Node, SizeBytes: v.SizeBytes, Stack: v.Stack, Type: v.Type}
	limit, err := s.Limit()
	if err != nil {
		t.Fatal(err)
	}
	e.update(func(tx *meta.Tx) error {
		cur, err := tx.Volume(v.ID)
		if err != nil {
			return err
		}
		cur.Snapshotting = append(cur.Snapshotting, sn.ID)
		tx.PutVolume(cur)
		tx.PutSnapshot(sn)
		return tx.Provision(sn.SizeBytes, limit)
	})
	// finishSnapshot's freeze, then a collapse job before the record's
	// commit.
	_, tok, err := s.leases.acquire(ctx, v.ID) // a freeze is its writer's
	if err != nil {
		t.Fatal(err)
	}
	img, err := s.freeze(e.volume(v.ID), sn.ID, tok)
	if err != nil {
		t.Fatal(err)
	}
	l, release, err := s.acquireWriter(e.volume(v.ID), tok)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := s.collapseJob(ctx, v.ID, l, nil)
	release()
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := rep.(CollapseReport); !ok || r.Collapsed != "" {
		t.Errorf("collapse during a snapshot: %+v", rep)
	}
	if top := e.top(v.ID); top == img {
		t.Fatalf("snapshot %s's image %s became the volume's live top", sn.ID, img)
	}
	// The snapshot finishes as it would have.
	if got, err := s.finishSnapshot(ctx, sn.ID, sn.Node, tok); err != nil || got.Image != img {
		t.Fatalf("finishing the snapshot: %+v, %v", got, err)
	}
	cleanupAll(t, s, alice)
	checkProvisioned(t)
}

// TestDeleteWaitsOutCollapses: a delete that meets a collapse job waits for
// it and tries again, as often as a collapse is running — one may follow
// another (CI once saw a volume delete fail as the second of two collapses
// began) — and only a collapse that outlasts lockWait makes it VolumeBusy.
func TestDeleteWaitsOutCollapses(t *testing.T) {
	old := lockWait
	lockWait = 300 * time.Millisecond
	t.Cleanup(func() { lockWait = old })
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	// A collapse that never ends: VolumeBusy once the wait is over.
	e.setJob(v.ID, &meta.Job{Kind: meta.JobCollapse, Node: s.cfg.Node, StartedAt: now()})
	start := time.Now()
	wantCode(t, s.DeleteVolume(ctx, alice, v.ID), errs.CodeVolumeBusy)
	if d := time.Since(start); d < lockWait {
		t.Errorf("gave up after %v, before lockWait %v", d, lockWait)
	}
	// Three collapses one after another, each seen by one try: the
	// delete goes through after the third.
	e.setJob(v.ID, nil)
	tries := 0
	id := v.ID
	err = s.pastCollapse(ctx, &id, func() error {
		if tries++; tries <= 3 {
			return errCollapsing
		}
		return nil
	})
	if err != nil || tries != 4 {
		t.Fatalf("after %d tries: %v", tries, err)
	}
	if err := s.DeleteVolume(ctx, alice, v.ID); err != nil {
		t.Fatal(err)
	}
	checkProvisioned(t)
}

// TestCollapseDecisionsShareScans: collapse jobs started together (a
// burst of snapshot deletes proposes one per volume) decide on shared
// reads of the snapshot records and the image superblocks, not one whole
// read each: with a 2000-volume store, 500 jobs reading 2500 superblocks
// apiece took the node's CPU and memory (660 MB) for tens of seconds and
// starved the metadata store until it was taken for lost. Each decision
// still sees everything as it was after it asked.
func TestCollapseDecisionsShareScans(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	const k = 24
	var vols, tops []string
	for range k {
		v, err := s.CreateVolume(ctx, alice, CreateVolume{SizeBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		vols, tops = append(vols, v.ID), append(tops, e.top(v.ID))
	}
	var reads atomic.Int64
	first := make(chan struct{})
	var once sync.Once
	old := readImage
	readImage = func(images, id string) (cow.Image, error) {
		reads.Add(1)
		// The first scan is slow: every other decision asks meanwhile.
		once.Do(func() { time.Sleep(300 * time.Millisecond); close(first) })
		<-first
		return old(images, id)
	}
	t.Cleanup(func() { readImage = old })
	var wg sync.WaitGroup
	whys := make([]string, k)
	errs := make([]error, k)
	for i := range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// An image nothing is built on and no snapshot names: the
			// decision reads every image to be sure.
			whys[i], errs[i] = s.needed(ctx, vols[i], "img-"+strings.Repeat("0", 15)+strconv.Itoa(i%10), tops[i])
		}()
	}
	wg.Wait()
	for i := range k {
		if errs[i] != nil || whys[i] != "" {
			t.Errorf("volume %s: needed = %q, %v; want nothing needs it", vols[i], whys[i], errs[i])
		}
	}
	if n := reads.Load(); n > 4*k {
		t.Errorf("%d decisions read %d image superblocks (%d images): want the scans shared (at most %d reads)", k, n, k, 4*k)
	}
	cleanupAll(t, s, alice)
}

// TestSharedScanStartsAfterCaller: a caller of a shared scan gets the
// result of a run that began after it asked, never of one already under
// way (its reads must come after its own earlier ones), and callers that
// ask during one run share the next.
func TestSharedScanStartsAfterCaller(t *testing.T) {
	var runs atomic.Int64
	release := make(chan struct{})
	started := make(chan int64, 10)
	sc := newSharedScan(context.Background(), func(ctx context.Context) (int64, error) {
		n := runs.Add(1)
		started <- n
		if n == 1 {
			<-release
		}
		return n, nil
	}, func(fn func()) { go fn() })
	ctx := ctxT(t)
	res := make(chan int64, 10)
	get := func() {
		n, err := sc.get(ctx)
		if err != nil {
			t.Error(err)
		}
		res <- n
	}
	go get()
	if n := <-started; n != 1 {
		t.Fatalf("first run is %d", n)
	}
	// Run 1 is under way: these three must wait for run 2.
	for range 3 {
		go get()
	}
	for sc.pending() != 3 {
		time.Sleep(time.Millisecond)
	}
	close(release)
	got := []int64{<-res, <-res, <-res, <-res}
	slices.Sort(got)
	if !slices.Equal(got, []int64{1, 2, 2, 2}) {
		t.Fatalf("callers got runs %v, want [1 2 2 2]: the first its own run, the others one run begun after they asked", got)
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("%d runs, want 2", n)
	}
}
