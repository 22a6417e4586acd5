package volume

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/cow"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/meta/metatest"
	"github.com/basalt-storage/basalt/internal/pki"
	"github.com/basalt-storage/basalt/internal/store"
)

func TestMain(m *testing.M) {
	// Collections run at once, as requested: tests wait for them (settle),
	// and their nodes collect with no grace, so a collection must not
	// drift into a creation on another node that shares the store.
	collectDelay = 0
	metatest.Main(m)
}

// openTestStore returns the package's shared metadata store and its CA.
func openTestStore(t testing.TB) (*meta.Store, *pki.CA) {
	e := metatest.Shared(t)
	return e.Meta, e.CA
}

// quietLog is the services' logger: silent, unless BASALT_TEST_LOG is set
// (then to stderr, for a flaky test's story).
func quietLog() *slog.Logger {
	if os.Getenv("BASALT_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var uniqN atomic.Int64

// uniq makes a name unique within the shared store (lower-case letters and
// digits after prefix, so it also makes valid volume type names).
func uniq(prefix string) string {
	return prefix + strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + strconv.FormatInt(uniqN.Add(1), 36)
}

// env is one test's world: the shared metadata store, a private data root
// and a node name of its own, so that Start (which adopts the records of
// its node) touches only this test's records.
type env struct {
	t    *testing.T
	meta *meta.Store
	st   *store.Store
	node string
	svcs []*Service
}

func newEnv(t *testing.T) *env {
	m, _ := openTestStore(t)
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, meta: m, st: st, node: uniq("node")}
}

// service makes a Service of this env's node; it is stopped at cleanup.
// Unless the test says otherwise, unreferenced images are collected at
// once (no grace), so tests can check what collection leaves.
func (e *env) service(cfg Config) *Service {
	if cfg.Node == "" {
		cfg.Node = e.node
	}
	if cfg.ImageGrace == 0 {
		cfg.ImageGrace = -1
	}
	s := New(e.meta, e.st, cfg, quietLog())
	e.t.Cleanup(s.Stop)
	e.svcs = append(e.svcs, s)
	return s
}

// settle waits until the image collections the services were asked for
// have run: what the store holds is then what they left.
func (e *env) settle() {
	for _, s := range e.svcs {
		s.collected()
	}
}

// hasImage reports whether image name is in the store, once collections
// have settled.
func (e *env) hasImage(name string) bool {
	e.settle()
	return exists(filepath.Join(e.st.ImagesDir(), name))
}

// started makes a Service and runs its Start.
func (e *env) started(cfg Config) *Service {
	s := e.service(cfg)
	if err := s.Start(context.Background()); err != nil {
		e.t.Fatalf("Start: %v", err)
	}
	return s
}

func caller(name string) Caller { return Caller{Name: name, ID: uniq("uid")} }

var adminCaller = Caller{Name: "admin", ID: "admin-id-for-tests", Admin: true}

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	if !errs.IsCode(err, code) {
		t.Fatalf("error %v, want %s", err, code)
	}
}

func (e *env) provisioned() int64 {
	e.t.Helper()
	n, err := e.meta.Provisioned(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

func (e *env) volume(id string) *meta.Volume {
	e.t.Helper()
	v, err := e.meta.Volume(context.Background(), id)
	if err != nil {
		e.t.Fatalf("volume %s: %v", id, err)
	}
	return v
}

func (e *env) snapshot(id string) *meta.Snapshot {
	e.t.Helper()
	sn, err := e.meta.Snapshot(context.Background(), id)
	if err != nil {
		e.t.Fatalf("snapshot %s: %v", id, err)
	}
	return sn
}

// snapAvailable fails unless snapshot id is available with an image: a
// snapshot is made synchronously, so it is as soon as CreateSnapshot
// returns.
func (e *env) snapAvailable(id string) *meta.Snapshot {
	e.t.Helper()
	sn := e.snapshot(id)
	if sn.Status != meta.StatusAvailable || sn.Image == "" || sn.Node != "" || sn.StatusMessage != "" {
		e.t.Fatalf("snapshot %s is not available: %+v", id, sn)
	}
	return sn
}

func (e *env) update(fn func(tx *meta.Tx) error) {
	e.t.Helper()
	if err := e.meta.Update(context.Background(), fn); err != nil {
		e.t.Fatal(err)
	}
}

// filledVolume creates a volume of size bytes for c through s and writes
// all of it (pattern seed); it returns the volume and what it holds.
func (e *env) filledVolume(s *Service, c Caller, size int64, seed uint64) (*meta.Volume, []byte) {
	e.t.Helper()
	v, err := s.CreateVolume(ctxT(e.t), c, CreateVolume{SizeBytes: size})
	if err != nil {
		e.t.Fatal(err)
	}
	model := make([]byte, size)
	e.fill(s, v.ID, model, seed, [2]int64{0, size})
	return v, model
}

// editVolume changes volume id's record in one transaction, as a
// workflow of some node would.
func (e *env) editVolume(id string, fn func(v *meta.Volume)) {
	e.t.Helper()
	e.update(func(tx *meta.Tx) error {
		v, err := tx.Volume(id)
		if err != nil {
			return err
		}
		if v == nil {
			return fmt.Errorf("no volume %s", id)
		}
		fn(v)
		tx.PutVolume(v)
		return nil
	})
}

// editSnapshot is editVolume for a snapshot's record.
func (e *env) editSnapshot(id string, fn func(sn *meta.Snapshot)) {
	e.t.Helper()
	e.update(func(tx *meta.Tx) error {
		sn, err := tx.Snapshot(id)
		if err != nil {
			return err
		}
		if sn == nil {
			return fmt.Errorf("no snapshot %s", id)
		}
		fn(sn)
		tx.PutSnapshot(sn)
		return nil
	})
}

// extending records volume id as being extended to target by node, as
// the extend's first transaction does (the bytes provisioned).
func (e *env) extending(id string, target int64, node string) {
	e.t.Helper()
	e.update(func(tx *meta.Tx) error {
		v, err := tx.Volume(id)
		if err != nil {
			return err
		}
		if err := tx.Provision(target-v.SizeBytes, math.MaxInt64); err != nil {
			return err
		}
		v.Status, v.TargetSize, v.Node = meta.StatusExtending, target, node
		tx.PutVolume(v)
		return nil
	})
}

// flattenFor is a flatten job recorded for node.
func flattenFor(node string) *meta.Job {
	return &meta.Job{Kind: meta.JobFlatten, Node: node, StartedAt: now()}
}

// setJob records job j on volume id (nil: none).
func (e *env) setJob(id string, j *meta.Job) {
	e.t.Helper()
	e.editVolume(id, func(v *meta.Volume) { v.Job = j })
}

// waitJob waits until volume id has no job running and returns the record.
func (e *env) waitJob(id string) *meta.Volume {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		v := e.volume(id)
		if v.Job == nil {
			return v
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("volume %s still runs job %+v", id, v.Job)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// flattened waits until volume id has no job running and checks that its
// last job was a flatten that succeeded.
func (e *env) flattened(id, what string) {
	e.t.Helper()
	if lj := e.waitJob(id).LastJob; lj == nil || lj.Kind != meta.JobFlatten || lj.Error != "" {
		e.t.Fatalf("%s: last job %+v, want a flatten that succeeded", what, lj)
	}
}

// pattern is n deterministic bytes for seed, none of them zero (so written
// data is never mistaken for a hole).
func pattern(seed uint64, n int64) []byte {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	b := make([]byte, n)
	rand.NewChaCha8(key).Read(b)
	for i, x := range b {
		if x == 0 {
			b[i] = 1
		}
	}
	return b
}

// acquireWritable opens volume v's live stack on s as a workflow that
// writes it does: s takes v's write lease (asWriter), then the stack
// (acquireWriter); release lets go of both.
func (s *Service) acquireWritable(v *meta.Volume) (block.Layer, func(), error) {
	done, token, err := s.asWriter(context.Background(), v.ID)
	if err != nil {
		return nil, nil, err
	}
	l, release, err := s.acquireWriter(v, token)
	if err != nil {
		done()
		return nil, nil, err
	}
	var once sync.Once
	return l, func() { once.Do(func() { release(); done() }) }, nil
}

// withStack runs fn on volume id's live stack, opened as its writer
// (acquireWritable), and releases it after.
func (e *env) withStack(s *Service, id string, fn func(l block.Layer)) {
	e.t.Helper()
	l, release, err := s.acquireWritable(e.volume(id))
	if err != nil {
		e.t.Fatalf("acquire %s: %v", id, err)
	}
	defer release()
	fn(l)
}

// withReader runs fn on volume id's live stack as a reader has it
// (acquireReader: the stack open on s, else one opened read-only), and
// releases it after.
func (e *env) withReader(s *Service, id string, fn func(l block.Layer)) {
	e.t.Helper()
	l, release, err := s.acquireReader(e.volume(id))
	if err != nil {
		e.t.Fatalf("acquire %s: %v", id, err)
	}
	defer release()
	fn(l)
}

// fill writes pattern(seed) at each extent {offset, length} of volume id
// through its live stack, flushes, and applies the same writes to model
// (if not nil) so the test knows what the volume must hold.
func (e *env) fill(s *Service, id string, model []byte, seed uint64, exts ...[2]int64) {
	e.t.Helper()
	e.withStack(s, id, func(l block.Layer) {
		for i, x := range exts {
			p := pattern(seed+uint64(i)*7919, x[1])
			if err := l.WriteAt(p, x[0], false); err != nil {
				e.t.Fatalf("write %d+%d to %s: %v", x[0], x[1], id, err)
			}
			if model != nil {
				copy(model[x[0]:], p)
			}
		}
		if err := l.Flush(); err != nil {
			e.t.Fatalf("flush %s: %v", id, err)
		}
	})
}

// readAt reads n bytes at off of volume id through its live stack.
func (e *env) readAt(s *Service, id string, off, n int64) []byte {
	e.t.Helper()
	b := make([]byte, n)
	e.withReader(s, id, func(l block.Layer) {
		if err := l.ReadAt(b, off); err != nil {
			e.t.Fatalf("read %d+%d of %s: %v", off, n, id, err)
		}
	})
	return b
}

// readVolume reads the whole device of volume id through its live stack;
// the device must be exactly the record's size.
func (e *env) readVolume(s *Service, id string) []byte {
	e.t.Helper()
	v := e.volume(id)
	var b []byte
	e.withReader(s, id, func(l block.Layer) {
		if l.Size() != v.SizeBytes {
			e.t.Fatalf("volume %s: device is %d bytes, record says %d", id, l.Size(), v.SizeBytes)
		}
		b = make([]byte, l.Size())
		if err := l.ReadAt(b, 0); err != nil {
			e.t.Fatalf("read %s: %v", id, err)
		}
	})
	return b
}

// sameVolume fails unless volume id holds exactly want.
func (e *env) sameVolume(s *Service, id string, want []byte, what string) {
	e.t.Helper()
	got := e.readVolume(s, id)
	if bytes.Equal(got, want) {
		return
	}
	if len(got) != len(want) {
		e.t.Fatalf("%s: volume %s is %d bytes, want %d", what, id, len(got), len(want))
	}
	if i := firstDiff(got, want); i >= 0 {
		e.t.Fatalf("%s: volume %s differs at byte %d (got %#x, want %#x)", what, id, i, got[i], want[i])
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// images lists the image directories of the env's store.
func (e *env) images() []string {
	e.t.Helper()
	e.settle()
	entries, err := os.ReadDir(e.st.ImagesDir())
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, d := range entries {
		out = append(out, d.Name())
	}
	slices.Sort(out)
	return out
}

// top is the image volume id writes into (its cow.sb on disk).
// volumeDirs lists the store's volume directories.
func (e *env) volumeDirs() []string {
	e.t.Helper()
	ents, err := os.ReadDir(filepath.Dir(e.st.VolumeDir("x")))
	if err != nil {
		e.t.Fatal(err)
	}
	var names []string
	for _, d := range ents {
		names = append(names, d.Name())
	}
	return names
}

func (e *env) top(id string) string {
	e.t.Helper()
	img, err := cow.TopOf(e.st.VolumeDir(id))
	if err != nil {
		e.t.Fatalf("top of %s: %v", id, err)
	}
	return img
}

// chain is the images volume id reads, top first.
func (e *env) chain(id string) []string {
	e.t.Helper()
	var out []string
	for img := e.top(id); img != ""; {
		out = append(out, img)
		im, err := cow.ReadImage(e.st.ImagesDir(), img)
		if err != nil {
			e.t.Fatalf("chain of %s: %v", id, err)
		}
		img = im.Parent
	}
	return out
}

// wantImages fails unless the store holds exactly the images the given
// volumes (their whole chains) and snapshots need: collection removed the
// rest and kept all of those.
func (e *env) wantImages(s *Service, vols []string, snaps []string) {
	e.t.Helper()
	need := map[string]bool{}
	for _, id := range vols {
		for _, img := range e.chain(id) {
			need[img] = true
		}
	}
	for _, id := range snaps {
		img := e.snapshot(id).Image
		for img != "" {
			need[img] = true
			im, err := cow.ReadImage(e.st.ImagesDir(), img)
			if err != nil {
				e.t.Fatalf("image %s of snapshot %s: %v", img, id, err)
			}
			img = im.Parent
		}
	}
	var want []string
	for img := range need {
		want = append(want, img)
	}
	slices.Sort(want)
	if got := e.images(); !slices.Equal(got, want) {
		e.t.Fatalf("images on disk %v, want exactly %v", got, want)
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// allocated is the bytes of disk a file holds (not its apparent size).
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// statSize is a file's apparent size.
func statSize(path string) (int64, error) {
	var st syscall.Stat_t
	err := syscall.Stat(path, &st)
	return st.Size, err
}

// dataFiles lists the data files (*.img) of every image of the store.
func (e *env) dataFiles() []string {
	e.t.Helper()
	files, err := filepath.Glob(filepath.Join(e.st.ImagesDir(), "*", "*.img"))
	if err != nil {
		e.t.Fatal(err)
	}
	return files
}

// checkProvisioned verifies the metadata invariant of doc.go across the
// whole shared store: capacity/provisioned equals the bytes of every volume
// and snapshot record not finished deleting (extends in flight count their
// target size). Call it only when no workflow of any test is running.
// It checks the owned index against the records too (at any time: both
// are read at one revision).
func checkProvisioned(t *testing.T) {
	t.Helper()
	m, _ := openTestStore(t)
	ctx := context.Background()
	if problems, err := m.CheckOwnedIndex(ctx); err != nil || len(problems) > 0 {
		t.Fatalf("the owned index disagrees with the records: %v %v", err, problems)
	}
	var sum int64
	vols, err := m.Volumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols {
		sum += v.SizeBytes
		if v.Status == meta.StatusExtending && v.TargetSize > v.SizeBytes {
			sum += v.TargetSize - v.SizeBytes
		}
	}
	snaps, err := m.Snapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sn := range snaps {
		sum += sn.SizeBytes
	}
	p, err := m.Provisioned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p != sum {
		t.Fatalf("capacity/provisioned = %d, but the records hold %d bytes", p, sum)
	}
}

// cleanupAll deletes every snapshot and volume of the given owners.
func cleanupAll(t *testing.T, s *Service, owners ...Caller) {
	t.Helper()
	ctx := context.Background()
	for _, c := range owners {
		snaps, err := s.Snapshots(ctx, c, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, sn := range snaps {
			if err := s.DeleteSnapshot(ctx, c, sn.ID); err != nil {
				t.Fatalf("cleanup snapshot %s: %v", sn.ID, err)
			}
		}
		vols, err := s.Volumes(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vols {
			if err := s.DeleteVolume(ctx, c, v.ID); err != nil {
				t.Fatalf("cleanup volume %s: %v", v.ID, err)
			}
		}
	}
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

func sameBytes(a, b []byte) bool { return bytes.Equal(a, b) }

// registerWrapper registers test layer type name: one child, wrapped by
// wrap when the layer is built.
func registerWrapper(name, doc string, wrap func(child block.Layer) block.Layer) {
	block.Register(block.Type{Name: name, Doc: "test: " + doc, MinChildren: 1, MaxChildren: 1,
		New: func(_ block.Env, _ json.RawMessage, children []block.Layer) (block.Layer, error) {
			return wrap(children[0]), nil
		}})
}
