// Package cow is the `cow` layer: copy-on-write images, which make
// snapshots and clones O(1) whatever the volume's size.
//
// A volume's data is a chain of images, newest (the "top") first. An
// image is a directory under Env.Images holding its own child stack (built
// from the cow node's one child spec: a file, a stripe of files, a
// mirror...), an allocation map (package bitmap, one bit per chunk: this
// image holds the chunk) and image.sb (package superblock: id, parent,
// size, chunk size, child spec, and the tag of the snapshot that created
// it). The volume's directory holds cow.sb: which image is its top.
//
//	snapshot: flush; create an empty image whose parent is the top; point
//	          cow.sb at it (the commit). The old top is now frozen: nothing
//	          ever writes it again, and the snapshot names it.
//	clone:    a new volume whose top is an empty image whose parent is the
//	          snapshot's image (Env.Base on Create).
//	collapse: when the top's parent is needed by nothing else (its
//	          snapshot deleted, no clone on it), copy the chunks the top
//	          holds into the parent and point cow.sb at the parent (the
//	          commit); the old top leaves the chain and the parent, written
//	          again, is the top (collapse.go).
//
// Reads: an in-memory owner table says, per chunk, which image of the chain
// holds it (built at open from the allocation maps, kept current by
// writes; paged, so that it costs memory for the chunks held, not for the
// volume's size: owner.go), so a read costs one table lookup and one read
// of the image that holds the chunk — independent of the chain's length
// (at most MaxChain images). Writes to a chunk a base image holds copy the
// chunk up into the top first (a per-chunk lock serialises them); writes
// to chunks no image holds go straight to the top.
//
// Crash safety. A chunk's allocation bit is persisted only after its data
// is durable in the top (Flush: child flush, then the bits of every chunk
// the top took before it began — a chunk is recorded as pending before the
// owner table sends any write to the top; FUA: the write, then its bits,
// and a flush first when the write lands in a chunk another write copied
// up whose bit is not durable yet). So after a crash a chunk reads either
// from the top, with all data acknowledged as durable, or from the base,
// when the copy-up was never made durable — never from a top chunk whose
// copied-up base data was lost. A chunk no image holds reads from the top;
// one whose data landed but whose bit did not is claimed by the top at the
// next read-write open (claimUnheld), so a snapshot cannot hide it. New
// images are named durably (their directory and Env.Images synced) before
// cow.sb can name them. cow.sb and image.sb are superblocks (two copies); a
// snapshot's steps before the cow.sb write leave only an unreferenced image
// directory, which Collect removes; a collapse's steps before it change
// only chunks the top overrides. A cow.sb write that fails (a full store)
// may still have landed: until cow.sb is rewritten naming the top the
// layer goes on with — the next write or flush tries — nothing is
// acknowledged.
//
// Base images are opened read-only, yet they are children like the top
// (Children, Describe), and repair and scrub reach them through Maintain
// (maintain.go), which opens one read-write for the call only.
//
// Who calls it: block.Build through the registry; the volume service for
// Snapshot, Flatten, Collapse, Top and Collect, and Maintain through
// block.WalkMaintain.
package cow

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/bitmap"
	"github.com/basalt-storage/basalt/internal/block/superblock"
)

func init() {
	block.Register(block.Type{
		Name: "cow", Doc: "copy-on-write images: O(1) snapshots and clones",
		Params:      Params{},
		MinChildren: 1, MaxChildren: 1, Compose: Compose,
		Files:    func(json.RawMessage) []string { return []string{volFile} },
		ChildDir: []string{imgFile, mapFile},
	})
}

const (
	// DefaultChunk is the copy-on-write unit when params give none.
	DefaultChunk = 64 << 10
	// MaxChain bounds a chain's length; a volume deeper than this must be
	// flattened before its next snapshot.
	MaxChain = 1024
	version  = 1
	volFile  = "cow.sb"
	imgFile  = "image.sb"
	mapFile  = "alloc.map"
)

// Params are the cow layer's parameters.
type Params struct {
	Chunk int64 `json:"chunk,omitempty"`
}

// volMeta is cow.sb's payload.
type volMeta struct {
	Version int    `json:"version"`
	Top     string `json:"top"`
}

// imageMeta is image.sb's payload.
type imageMeta struct {
	Version int        `json:"version"`
	ID      string     `json:"id"`
	Parent  string     `json:"parent,omitempty"`
	Size    int64      `json:"size"`
	Chunk   int64      `json:"chunk"`
	Spec    block.Spec `json:"spec"`
	Tag     string     `json:"tag,omitempty"` // the snapshot that created this image
	// Froze is the image that snapshot froze (Parent until a flatten
	// clears it): what a repeated Snapshot(Tag) returns.
	Froze string `json:"froze,omitempty"`
}

// maxSize bounds a recorded size (as the other layers' metadata does):
// far beyond any volume, small enough that no chunk arithmetic overflows.
const maxSize = 1 << 62

// validID reports whether id is an image id as newImage makes them:
// "img-" and 16 lowercase hex digits. Ids name directories, so one from a
// payload is checked before any path is built from it.
func validID(id string) bool {
	h, ok := strings.CutPrefix(id, "img-")
	if !ok || len(h) != 16 {
		return false
	}
	for _, c := range []byte(h) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// decodeVolMeta decodes cow.sb's payload: version 1, a valid top id.
func decodeVolMeta(payload []byte) (volMeta, error) {
	var vm volMeta
	if err := json.Unmarshal(payload, &vm); err != nil {
		return vm, fmt.Errorf("%s: bad payload: %w", volFile, err)
	}
	if vm.Version != version || !validID(vm.Top) {
		return vm, fmt.Errorf("%s: version %d, top %q: not a payload this build wrote", volFile, vm.Version, vm.Top)
	}
	return vm, nil
}

// decodeImageMeta decodes image id's image.sb payload and checks what the
// layer sizes and names things from: version 1, its own id, a valid parent
// id or none, a size in (0, maxSize], a chunk that is a power of two of at
// least 4096. (A chunk of 0 divided by zero; a size of 2^60 asked for
// terabytes of owner table.)
func decodeImageMeta(payload []byte, id string) (imageMeta, error) {
	var m imageMeta
	if err := json.Unmarshal(payload, &m); err != nil {
		return m, fmt.Errorf("image %s: bad image.sb: %w", id, err)
	}
	switch {
	case m.Version != version || m.ID != id || !validID(m.ID) || m.Parent != "" && !validID(m.Parent):
		return m, fmt.Errorf("image %s: image.sb of version %d names image %q, parent %q", id, m.Version, m.ID, m.Parent)
	case m.Size <= 0 || m.Size > maxSize || m.Chunk < 4096 || m.Chunk&(m.Chunk-1) != 0:
		return m, fmt.Errorf("image %s: implausible size %d or chunk %d in image.sb", id, m.Size, m.Chunk)
	}
	return m, nil
}

// image is one open image of a chain.
type image struct {
	meta  imageMeta
	depth uint32 // 1 for the chain's root, top's is the highest
	// dev is the image's stack: read-write for the top and for a former
	// top a Snapshot of this layer froze (frozen), read-only for the
	// other bases. chainMu guards it (Maintain swaps a base's).
	dev block.Layer
	rw  bool // dev was opened read-write
	// frozen: a Snapshot of this layer froze the image while dev was
	// open read-write; the lock holdFrozen took, which keeps maintainers
	// in every process away from the image until this layer closes.
	frozen *os.File
	sb     *superblock.Block // top only
	alloc  *bitmap.Bitmap    // top only
}

// Layer is a cow layer.
type Layer struct {
	env    block.Env
	params json.RawMessage
	chunk  int64
	vsb    *superblock.Block

	// chainMu: I/O holds it shared; Snapshot, Resize and Flatten's commit
	// hold it exclusively to change the chain or the owner table's size.
	chainMu sync.RWMutex
	top     *image
	byDepth []*image // byDepth[d] is the image at depth d (index 0 unused)
	all     []*image // every image opened, closed on Close
	owner   ownerTable
	size    int64

	// broken is set when a commit write of cow.sb failed: it may have
	// landed or not, so which top the disk names is unknown, and nothing
	// may be acknowledged until it is known again — after a reopen, or
	// once brokenErr has rewritten cow.sb naming the top memory has (see
	// brokenCommit). recommitMu serialises those rewrites.
	broken     atomic.Pointer[brokenCommit]
	recommitMu sync.Mutex

	pendMu  sync.Mutex
	pending []int64 // chunks newly held by the top, bits not yet persisted
	// unsynced marks the chunks copied up from a base whose allocation
	// bits are not durable yet (claim sets, flush clears): a FUA write
	// into one must persist the bit before it is acknowledged, or a crash
	// would send the chunk's reads back to the base.
	unsynced chunkSet
	// flushMu makes flushes one at a time, so that a flush that returns
	// has persisted every bit claimed before it began, including those an
	// earlier flush was still writing.
	flushMu sync.Mutex

	locks [256]sync.Mutex // copy-up locks by chunk

	// dirty, while a Collapse runs, collects the chunks whose content in
	// the top changed (touched, by every path that writes the top).
	dirty atomic.Pointer[dirtySet]
}

// Compose implements block.Type.Compose.
func Compose(env block.Env, raw json.RawMessage, children []block.Spec) (block.Layer, error) {
	p := Params{Chunk: DefaultChunk}
	if err := block.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.Chunk < 4096 || p.Chunk&(p.Chunk-1) != 0 {
		return nil, fmt.Errorf("chunk %d must be a power of two of at least 4096", p.Chunk)
	}
	if env.Images == "" {
		return nil, errors.New("no image directory (Env.Images)")
	}
	l := &Layer{env: env, params: raw, chunk: p.Chunk}
	var err error
	if env.Create {
		err = l.create(children[0])
	} else {
		err = l.open()
	}
	if err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

func (l *Layer) create(child block.Spec) error {
	if l.env.ReadOnly {
		return block.ErrReadOnly
	}
	if l.env.Base != "" {
		f, err := l.env.OpenMeta(filepath.Join(l.imageDir(l.env.Base), imgFile))
		if err != nil {
			return fmt.Errorf("base image %s: %w", l.env.Base, err)
		}
		sb, _, err := superblock.OpenFile(f)
		if err != nil {
			f.Close()
			return fmt.Errorf("base image %s: %w", l.env.Base, err)
		}
		sb.Close()
	}
	top, err := l.newImage(imageMeta{Parent: l.env.Base, Size: l.env.Size, Chunk: l.chunk, Spec: child})
	if err != nil {
		return err
	}
	f, err := l.env.OpenMeta(volFile)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(volMeta{Version: version, Top: top.meta.ID})
	if l.vsb, err = superblock.CreateFile(f, 0, b); err != nil {
		// The image stays: cow.sb may name it (a torn write can land).
		// Collect removes it once nothing does.
		f.Close()
		top.dev.Close()
		top.sb.Close()
		top.alloc.Close()
		return fmt.Errorf("%s: %w", volFile, err)
	}
	top.dev.Close()
	top.sb.Close()
	top.alloc.Close()
	return l.open()
}

// newImage creates an image directory with an empty child stack and
// allocation map, and returns it open. On failure nothing is left.
func (l *Layer) newImage(m imageMeta) (*image, error) {
	var id [8]byte
	rand.Read(id[:])
	m.Version, m.ID = version, "img-"+hex.EncodeToString(id[:])
	dir := l.imageDir(m.ID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	im, err := l.createImage(dir, m)
	if err == nil {
		// The image's files, then the image itself, named durably
		// before cow.sb (written in place) can name the image.
		if err = block.SyncDir(dir); err == nil {
			err = block.SyncDir(l.env.Images)
		}
		if err != nil {
			im.dev.Close()
			im.sb.Close()
			im.alloc.Close()
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("create image %s: %w", m.ID, err)
	}
	return im, nil
}

func (l *Layer) createImage(dir string, m imageMeta) (*image, error) {
	env := l.env
	env.Dir, env.Size, env.Create, env.Base = dir, m.Size, true, ""
	dev, err := block.Build(env, m.Spec)
	if err != nil {
		return nil, err
	}
	im := &image{meta: m, dev: dev, rw: true}
	if im.alloc, err = l.openMap(dir, m); err == nil {
		err = im.alloc.Sync()
	}
	if err != nil {
		dev.Close()
		return nil, err
	}
	f, err := l.env.OpenMeta(filepath.Join(dir, imgFile))
	if err == nil {
		b, _ := json.Marshal(m)
		im.sb, err = superblock.CreateFile(f, 0, b)
		if err != nil {
			f.Close()
		}
	}
	if err != nil {
		dev.Close()
		im.alloc.Close()
		return nil, err
	}
	return im, nil
}

func (l *Layer) openMap(dir string, m imageMeta) (*bitmap.Bitmap, error) {
	f, err := l.env.OpenMeta(filepath.Join(dir, mapFile))
	if err != nil {
		return nil, err
	}
	b, err := bitmap.OpenFile(f, chunks(m.Size, m.Chunk))
	if err != nil {
		f.Close()
	}
	return b, err
}

func chunks(size, chunk int64) int64 { return (size + chunk - 1) / chunk }

func (l *Layer) imageDir(id string) string { return filepath.Join(l.env.Images, id) }

// open reads cow.sb (or, read-only with Env.Base, takes that image as the
// top) and opens the chain, top read-write and bases read-only, and builds
// the owner table.
func (l *Layer) open() error {
	var vm volMeta
	if l.env.ReadOnly && l.env.Base != "" {
		vm.Top = l.env.Base // a snapshot's image, read in place
	} else {
		f, err := l.env.OpenMeta(volFile)
		if err != nil {
			return err
		}
		sb, payload, err := superblock.OpenFile(f)
		if err != nil {
			f.Close()
			return fmt.Errorf("%s: %w", volFile, err)
		}
		l.vsb = sb
		if vm, err = decodeVolMeta(payload); err != nil {
			return err
		}
	}
	if !validID(vm.Top) {
		return fmt.Errorf("top image %q is not an image id", vm.Top)
	}
	// Walk from the top to the root, then number the images root first.
	var chain []*image
	for id, first := vm.Top, true; id != ""; first = false {
		if len(chain) > MaxChain {
			return fmt.Errorf("chain of image %s is longer than %d", vm.Top, MaxChain)
		}
		im, err := l.openImage(id, first)
		if err != nil {
			return err
		}
		l.all = append(l.all, im)
		chain = append(chain, im)
		id = im.meta.Parent
	}
	l.top = chain[0]
	l.size = l.top.meta.Size
	l.byDepth = make([]*image, len(chain)+1)
	l.owner = newOwnerTable(chunks(l.size, l.chunk), ownerShift)
	l.unsynced = newChunkSet(l.owner.Len(), unsyncedShift)
	for i := range chain {
		im := chain[len(chain)-1-i]
		im.depth = uint32(i + 1)
		l.byDepth[im.depth] = im
		if im.meta.Chunk != l.chunk {
			return fmt.Errorf("image %s has chunk %d, the volume %d", im.meta.ID, im.meta.Chunk, l.chunk)
		}
		m := im.alloc
		for c := m.NextSet(0); c >= 0 && c < l.owner.Len(); c = m.NextSet(c + 1) {
			l.owner.Store(c, im.depth)
		}
		if im != l.top { // a base's map is read once: drop it
			m.Close()
			im.alloc = nil
		}
	}
	if l.env.ReadOnly {
		return nil
	}
	return l.claimUnheld()
}

// claimUnheld makes the top hold every chunk that no image holds but the
// top's stack has data for: writes whose bits a crash kept from the disk
// (their data may have landed). Such a chunk reads from the top already;
// held, it stays the top's through a snapshot, where an unheld chunk
// would read from the new, empty top. Its bit is persisted by the next
// flush, after the data.
func (l *Layer) claimUnheld() error {
	topd := l.top.depth
	for c, e := range l.owner.unheld(0, l.owner.Len()) {
		err := dataIn(l.top.dev, c*l.chunk, min(e*l.chunk, l.size)-c*l.chunk, func(off, m int64) {
			for k := off / l.chunk; k*l.chunk < off+m; k++ {
				if l.owner.CompareAndSwap(k, 0, topd) {
					l.claim(k, false)
				}
			}
		})
		if err != nil {
			return fmt.Errorf("image %s: %w", l.top.meta.ID, err)
		}
	}
	return nil
}

// openImage opens image id: read-write with its map and superblock if it
// is the top, read-only otherwise (its map is closed after the owner
// table is built).
func (l *Layer) openImage(id string, top bool) (*image, error) {
	dir := l.imageDir(id)
	f, err := l.env.OpenMeta(filepath.Join(dir, imgFile))
	if err != nil {
		return nil, err
	}
	sb, payload, err := superblock.OpenFile(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("image %s: %w", id, err)
	}
	im := &image{sb: sb}
	if im.meta, err = decodeImageMeta(payload, id); err != nil {
		sb.Close()
		return nil, err
	}
	env := l.env
	env.Dir, env.Size, env.Create, env.Base = dir, im.meta.Size, false, ""
	env.ReadOnly = l.env.ReadOnly || !top
	if im.dev, err = block.Build(env, im.meta.Spec); err != nil {
		sb.Close()
		return nil, fmt.Errorf("image %s: %w", id, err)
	}
	im.rw = !env.ReadOnly
	// Resize grows the device before it records the size, so an image
	// recording more than its device holds is not ours; refuse it before
	// the owner table and the map are sized from it.
	if n := im.dev.Size(); n < im.meta.Size {
		im.dev.Close()
		sb.Close()
		return nil, fmt.Errorf("image %s records %d bytes; its device holds %d", id, im.meta.Size, n)
	}
	if im.alloc, err = l.openMap(dir, im.meta); err != nil {
		im.dev.Close()
		sb.Close()
		return nil, fmt.Errorf("image %s: %w", id, err)
	}
	if !top {
		sb.Close()
		im.sb = nil
	}
	return im, nil
}

// run is a stretch of consecutive chunks with the same owner.
type run struct {
	off, n int64
	owner  uint32
}

// runs splits [off, off+n) into runs of one owner. Top-held chunks and
// chunks nobody holds both read from the top, so they share a run (owner
// reported as the top's depth) unless split says otherwise.
func (l *Layer) runs(off, n int64, split bool) []run {
	var out []run
	topd := l.top.depth
	for n > 0 {
		c := off / l.chunk
		m := min(n, (c+1)*l.chunk-off)
		o := l.owner.Load(c)
		if !split && o == 0 {
			o = topd
		}
		if k := len(out) - 1; k >= 0 && out[k].owner == o && out[k].off+out[k].n == off {
			out[k].n += m
		} else {
			out = append(out, run{off, m, o})
		}
		off, n = off+m, n-m
	}
	return out
}

// Size implements block.Device.
func (l *Layer) Size() int64 {
	l.chainMu.RLock()
	defer l.chainMu.RUnlock()
	return l.size
}

// Capabilities implements block.Device: writes, zeroes and trims are
// handled chunk by chunk here, so what the top's stack supports is what
// this layer supports. Fast zeroing is declared whenever zeroing is: a
// fast zero either is the top's own (when no base holds a chunk of the
// range) or fails at once (see WriteZeroes).
func (l *Layer) Capabilities() block.Capabilities {
	l.chainMu.RLock()
	defer l.chainMu.RUnlock()
	c := l.top.dev.Capabilities()
	c.ReadOnly = c.ReadOnly || l.env.ReadOnly
	c.FastZero = c.WriteZeroes
	return c
}

// Children implements block.Parent: the stacks of the chain's images, the
// top's first, then each base newest first. Bases are read-only (see
// Maintain); images a flatten detached are not in the chain any more.
func (l *Layer) Children() []block.Layer {
	l.chainMu.RLock()
	defer l.chainMu.RUnlock()
	chain := l.chain()
	out := make([]block.Layer, len(chain))
	for i, im := range chain {
		out[i] = im.dev
	}
	return out
}

// chain lists the images the volume reads from, top first; the caller
// holds chainMu.
func (l *Layer) chain() []*image {
	out := []*image{l.top}
	for d := int(l.top.depth) - 1; d >= 1; d-- {
		if im := l.byDepth[d]; im != nil {
			out = append(out, im)
		}
	}
	return out
}

// ReadAt implements block.Device.
func (l *Layer) ReadAt(p []byte, off int64) error {
	l.chainMu.RLock()
	defer l.chainMu.RUnlock()
	if err := l.inRange(off, int64(len(p))); err != nil {
		return err
	}
	at := int64(0)
	for _, r := range l.runs(off, int64(len(p)), false) {
		if err := l.readFrom(l.byDepth[r.owner], p[at:at+r.n], r.off); err != nil {
			return err
		}
		at += r.n
	}
	return nil
}

// TryReadAt implements block.NoWaitReader: as ReadAt, but only if the
// chain is not being changed (a snapshot or extend holds it) and every
// image the range maps to answers at once.
func (l *Layer) TryReadAt(p []byte, off int64) bool {
	if !l.chainMu.TryRLock() {
		return false
	}
	defer l.chainMu.RUnlock()
	if l.inRange(off, int64(len(p))) != nil {
		return false
	}
	at := int64(0)
	for _, r := range l.runs(off, int64(len(p)), false) {
		if !l.tryReadFrom(l.byDepth[r.owner], p[at:at+r.n], r.off) {
			return false
		}
		at += r.n
	}
	return true
}

// SpliceTo implements block.Splicer: run by run, each from the image that
// holds it, as ReadAt reads them, stopping at the first run an image does
// not move whole or that reaches beyond a base's (pre-extend) size, whose
// zeroes ReadAt supplies. With nowait it gives up, as TryReadAt does, when
// the chain is being changed.
func (l *Layer) SpliceTo(pipe int, off int64, n int, nowait bool) int {
	if nowait {
		if !l.chainMu.TryRLock() {
			return 0
		}
	} else {
		l.chainMu.RLock()
	}
	defer l.chainMu.RUnlock()
	if l.inRange(off, int64(n)) != nil {
		return 0
	}
	moved := 0
	for _, r := range l.runs(off, int64(n), false) {
		im := l.byDepth[r.owner]
		size := im.meta.Size
		if im == l.top {
			size = l.size
		}
		if r.off+r.n > size {
			break
		}
		k := block.SpliceTo(im.dev, pipe, r.off, int(r.n), nowait)
		moved += k
		if int64(k) < r.n {
			break
		}
	}
	return moved
}

// inRange refuses a request that does not lie inside the device
// (block.Device); the caller holds chainMu, which guards l.size.
func (l *Layer) inRange(off, n int64) error {
	if err := block.CheckRange(off, n, l.size); err != nil {
		return fmt.Errorf("cow: %w", err)
	}
	return nil
}

// readFrom reads from one image.
func (l *Layer) readFrom(im *image, p []byte, off int64) error {
	if p = l.held(im, p, off); len(p) == 0 {
		return nil
	}
	return im.dev.ReadAt(p, off)
}

// tryReadFrom is readFrom without waiting (block.TryReadAt).
func (l *Layer) tryReadFrom(im *image, p []byte, off int64) bool {
	if p = l.held(im, p, off); len(p) == 0 {
		return true
	}
	return block.TryReadAt(im.dev, p, off)
}

// held returns the part of p, read at off, that lies within image im;
// the rest, beyond a base's (smaller, pre-extend) size, it fills with
// zeroes.
func (l *Layer) held(im *image, p []byte, off int64) []byte {
	size := im.meta.Size
	if im == l.top {
		size = l.size
	}
	if off >= size {
		clear(p)
		return nil
	}
	if end := off + int64(len(p)); end > size {
		clear(p[size-off:])
		p = p[:size-off]
	}
	return p
}

// WriteAt implements block.Device.
func (l *Layer) WriteAt(p []byte, off int64, fua bool) error {
	return l.write(off, int64(len(p)), fua, func(r run, at int64) error {
		return l.top.dev.WriteAt(p[at:at+r.n], r.off, fua)
	}, func(buf []byte, r run, at int64) {
		copy(buf[r.off%l.chunk:], p[at:at+r.n])
	})
}

// SpliceFrom implements block.SpliceWriter: run by run into the top, as
// WriteAt writes them, when no base holds a chunk of the range (else
// nothing is taken: a copy-up needs the bytes in a buffer, and WriteAt
// does that). It stops at the first run the top does not take whole.
func (l *Layer) SpliceFrom(pipe int, off int64, n int) int {
	if l.env.ReadOnly || n <= 0 {
		return 0
	}
	l.chainMu.RLock()
	if _, ok := l.top.dev.(block.SpliceWriter); !ok || l.inRange(off, int64(n)) != nil {
		l.chainMu.RUnlock()
		return 0
	}
	topd := l.top.depth
	for _, r := range l.runs(off, int64(n), true) {
		if r.owner != topd && r.owner != 0 {
			l.chainMu.RUnlock()
			return 0
		}
	}
	l.chainMu.RUnlock()
	// Every run is recorded as the top's, as WriteAt records it, the ones
	// not taken (after the first run taken short) too: the caller writes
	// them next, and until then the top holds what readers saw there
	// before. A snapshot taken meanwhile makes the top a new, empty image
	// whose chunks its base holds: such a chunk is copied up with its old
	// content (overlay leaves it), which changes nothing a reader sees,
	// and no byte more is taken.
	moved, stop := 0, false
	_ = l.write(off, int64(n), false, func(r run, _ int64) error {
		if !stop {
			k := block.SpliceFrom(l.top.dev, pipe, r.off, int(r.n))
			moved += k
			stop = int64(k) < r.n
		}
		return nil
	}, func([]byte, run, int64) { stop = true })
	return moved
}

// write is the shared path of writes and zeroes: direct covers a run the
// top holds or nobody holds; overlay puts a run's new content into a
// copied-up chunk buffer.
func (l *Layer) write(off, n int64, fua bool, direct func(r run, at int64) error, overlay func(buf []byte, r run, at int64)) error {
	if l.env.ReadOnly {
		return block.ErrReadOnly
	}
	if err := l.brokenErr(); err != nil {
		return err
	}
	l.chainMu.RLock()
	defer l.chainMu.RUnlock()
	if err := l.inRange(off, n); err != nil {
		return err
	}
	defer l.touched(off, n)
	var fresh []int64
	at := int64(0)
	topd := l.top.depth
	for _, r := range l.runs(off, n, true) {
		switch r.owner {
		case topd:
			if err := direct(r, at); err != nil {
				return err
			}
		case 0:
			if err := direct(r, at); err != nil {
				return err
			}
			// Claimed after the write: a chunk nobody holds reads from
			// the top, bit or no bit (and claimUnheld claims it after a
			// crash), so no order matters here.
			for c := r.off / l.chunk; c*l.chunk < r.off+r.n; c++ {
				if l.owner.CompareAndSwap(c, 0, topd) {
					l.claim(c, false)
					fresh = append(fresh, c)
				}
			}
		default:
			for c := r.off / l.chunk; c*l.chunk < r.off+r.n; c++ {
				lo, hi := max(r.off, c*l.chunk), min(r.off+r.n, (c+1)*l.chunk)
				ok, err := l.copyUp(c, fua, run{lo, hi - lo, r.owner}, at+lo-r.off, direct, overlay)
				if err != nil {
					return err
				}
				if ok {
					fresh = append(fresh, c)
				}
			}
		}
		at += r.n
	}
	if fua {
		return l.persistFUA(off, n, fresh)
	}
	return nil
}

// claim records that chunk c is the top's from now on (the caller then or
// just before says so in the owner table): c joins pending, whose bits the
// next flush persists after the data. A chunk copied up from a base is
// claimed before the owner table names the top, so that any write that
// then goes straight to the top, and any flush after that write, finds it
// pending; it is also marked unsynced until its bit is durable.
func (l *Layer) claim(c int64, copied bool) {
	if copied {
		l.unsynced.add(c)
	}
	l.pendMu.Lock()
	l.pending = append(l.pending, c)
	l.pendMu.Unlock()
}

// copyUp writes piece r of chunk c, which a base held when the run was
// made: under the chunk's lock, if a base still holds it, the whole chunk
// is read from there, overlaid and written to the top; if the top took it
// meanwhile, the piece is written directly. It reports whether this call
// moved the chunk to the top.
func (l *Layer) copyUp(c int64, fua bool, r run, at int64, direct func(run, int64) error, overlay func([]byte, run, int64)) (bool, error) {
	mu := &l.locks[c%int64(len(l.locks))]
	mu.Lock()
	defer mu.Unlock()
	o := l.owner.Load(c)
	if o == l.top.depth || o == 0 {
		return false, direct(r, at)
	}
	start := c * l.chunk
	buf := make([]byte, min(l.chunk, l.size-start))
	if err := l.readFrom(l.byDepth[o], buf, start); err != nil {
		return false, fmt.Errorf("copy up chunk %d: %w", c, err)
	}
	overlay(buf, r, at)
	if err := l.top.dev.WriteAt(buf, start, fua); err != nil {
		return false, fmt.Errorf("copy up chunk %d: %w", c, err)
	}
	l.claim(c, true)
	l.owner.Store(c, l.top.depth)
	return true, nil
}

// persistFUA ends a FUA write of [off, off+n), whose data is durable: the
// chunks it moved to the top (fresh, their whole content written with FUA)
// get their bits persisted at once. If the range also touches a chunk
// another write copied up and whose bit is not durable yet, the write
// would be lost with that bit, so the whole flush runs instead: the other
// write's data, then every pending bit.
func (l *Layer) persistFUA(off, n int64, fresh []int64) error {
	for c := off / l.chunk; c*l.chunk < off+n; c++ {
		if l.unsynced.has(c) && !slices.Contains(fresh, c) {
			return l.flush()
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	for _, c := range fresh {
		l.top.alloc.Set(c)
	}
	if err := l.top.alloc.Sync(); err != nil {
		return err
	}
	for _, c := range fresh {
		l.unsynced.remove(c)
	}
	return nil
}

// WriteZeroes implements block.Device.
func (l *Layer) WriteZeroes(off, n int64, f block.ZeroFlags) error {
	if f.Fast {
		return l.fastZero(off, n, f)
	}
	zf := block.ZeroFlags{NoHole: f.NoHole, FUA: f.FUA}
	return l.write(off, n, f.FUA, func(r run, _ int64) error {
		return l.top.dev.WriteZeroes(r.off, r.n, zf)
	}, func(buf []byte, r run, _ int64) {
		clear(buf[r.off%l.chunk : r.off%l.chunk+r.n])
	})
}

// fastZero zeroes [off, off+n) if that costs no copy-up: when no base
// holds a chunk of the range, the top's stack zeroes it (its own fast zero,
// a punched hole for a file), and chunks nobody held become the top's, as
// after any write. A chunk a base holds would have to be read and copied
// up, so then it fails with ErrNotSupported before writing anything, as
// it does when the top's stack cannot zero fast.
//
// A chunk nobody holds is zeroed in the top too, not skipped: after a
// crash the top may hold data of a chunk whose allocation bit was never
// persisted, and reads of such a chunk come from the top.
func (l *Layer) fastZero(off, n int64, f block.ZeroFlags) error {
	if l.env.ReadOnly {
		return block.ErrReadOnly
	}
	if err := l.brokenErr(); err != nil {
		return err
	}
	l.chainMu.RLock()
	defer l.chainMu.RUnlock()
	if err := l.inRange(off, n); err != nil {
		return err
	}
	defer l.touched(off, n) // a collapse running copies what changed again
	if !l.top.dev.Capabilities().FastZero {
		return block.ErrNotSupported
	}
	topd := l.top.depth
	// Unsplit runs report chunks nobody holds as the top's; under chainMu
	// a chunk only ever moves to the top, so the check holds throughout.
	for _, r := range l.runs(off, n, false) {
		if r.owner != topd {
			return block.ErrNotSupported
		}
	}
	if err := l.top.dev.WriteZeroes(off, n, f); err != nil {
		return err
	}
	var fresh []int64
	for c := off / l.chunk; c*l.chunk < off+n; c++ {
		if l.owner.CompareAndSwap(c, 0, topd) {
			l.claim(c, false)
			fresh = append(fresh, c)
		}
	}
	if f.FUA {
		return l.persistFUA(off, n, fresh)
	}
	return nil
}

// Trim implements block.Device: ranges the top holds (or nobody holds)
// are trimmed in the top; ranges a base holds keep their data (a trim is
// advisory, and copying up to discard would cost space, not free it).
func (l *Layer) Trim(off, n int64, fua bool) error {
	if l.env.ReadOnly {
		return block.ErrReadOnly
	}
	if err := l.brokenErr(); err != nil {
		return err
	}
	l.chainMu.RLock()
	defer l.chainMu.RUnlock()
	if err := l.inRange(off, n); err != nil {
		return err
	}
	defer l.touched(off, n)
	for _, r := range l.runs(off, n, false) {
		if r.owner != l.top.depth {
			continue
		}
		if err := l.top.dev.Trim(r.off, r.n, fua); err != nil {
			return err
		}
	}
	return nil
}

// Flush implements block.Device: the top's data, then the allocation bits
// of every write completed before the flush began.
func (l *Layer) Flush() error {
	l.chainMu.RLock()
	defer l.chainMu.RUnlock()
	return l.flush()
}

func (l *Layer) flush() error {
	if l.env.ReadOnly {
		return nil
	}
	if err := l.brokenErr(); err != nil {
		return err
	}
	l.flushMu.Lock()
	defer l.flushMu.Unlock()
	l.pendMu.Lock()
	list := l.pending
	l.pending = nil
	l.pendMu.Unlock()
	fail := func(err error) error {
		l.pendMu.Lock()
		l.pending = append(l.pending, list...)
		l.pendMu.Unlock()
		return err
	}
	if err := l.top.dev.Flush(); err != nil {
		return fail(err)
	}
	for _, c := range list {
		l.top.alloc.Set(c)
	}
	if err := l.top.alloc.Sync(); err != nil {
		return fail(fmt.Errorf("allocation map: %w", err))
	}
	for _, c := range list {
		l.unsynced.remove(c)
	}
	return nil
}

// Extents implements block.Device: ranges the top holds or nobody holds
// are described by the top's stack; ranges a base holds are data.
func (l *Layer) Extents(off, n int64) ([]block.Extent, error) {
	l.chainMu.RLock()
	defer l.chainMu.RUnlock()
	if err := l.inRange(off, n); err != nil {
		return nil, err
	}
	var out []block.Extent
	for i, r := range l.runs(off, min(n, 4096*l.chunk), false) {
		if i == 64 {
			break
		}
		if r.owner != l.top.depth {
			out = block.AppendExtent(out, block.Extent{Length: r.n})
			continue
		}
		ex, err := l.top.dev.Extents(r.off, r.n)
		if err != nil {
			return nil, err
		}
		got := int64(0)
		for _, e := range ex {
			e.Length = min(e.Length, r.n-got)
			out = block.AppendExtent(out, e)
			got += e.Length
		}
		if got < r.n {
			break
		}
	}
	return out, nil
}

// Resize implements block.Resizer.
func (l *Layer) Resize(n int64) error {
	if l.env.ReadOnly {
		return block.ErrReadOnly
	}
	l.chainMu.Lock()
	defer l.chainMu.Unlock()
	// The growth is recorded in the top's image.sb: after a failed
	// commit cow.sb may name another image, which a reopen would find at
	// the old size, so cow.sb must name the top first (as for a write).
	// Under chainMu no commit can fail meanwhile.
	if err := l.brokenErr(); err != nil {
		return fmt.Errorf("resize: %w", err)
	}
	if n < l.size {
		return fmt.Errorf("cannot shrink from %d to %d bytes", l.size, n)
	}
	// A Resize that failed after growing the stack or the map (its
	// image.sb write refused, or a crash) leaves them larger than the
	// recorded size; they never shrink, so grow only what is smaller:
	// a new target between the two is as valid as any other.
	if l.top.dev.Size() < n {
		r, ok := l.top.dev.(block.Resizer)
		if !ok {
			return fmt.Errorf("the image's %s layer cannot grow", l.top.dev.Describe().Type)
		}
		if err := r.Resize(n); err != nil {
			return err
		}
	}
	if l.top.alloc.Len() < chunks(n, l.chunk) {
		if err := l.top.alloc.Grow(chunks(n, l.chunk)); err != nil {
			return err
		}
	}
	m := l.top.meta
	m.Size = n
	if err := l.writeImage(l.top, m); err != nil {
		return err
	}
	// Under chainMu held exclusively: the tables keep their pages (no
	// entry is copied) and gain empty slots.
	l.owner.grow(chunks(n, l.chunk))
	l.unsynced.grow(l.owner.Len())
	l.size = n
	return nil
}

func (l *Layer) writeImage(im *image, m imageMeta) error {
	b, _ := json.Marshal(m)
	if err := im.sb.Write(b); err != nil {
		return fmt.Errorf("image %s: %w", m.ID, err)
	}
	im.meta = m
	return nil
}

// brokenCommit is a failed commit: its error, and cow.sb's payload naming
// the top the layer goes on with (a failed snapshot's old top, a failed
// collapse's parent).
type brokenCommit struct {
	err     error
	payload []byte
}

// breakCommit records that a commit's cow.sb write failed with err; top
// is the top the layer goes on with. The caller holds chainMu exclusively.
func (l *Layer) breakCommit(err error, top string) {
	b, _ := json.Marshal(volMeta{Version: version, Top: top})
	l.broken.Store(&brokenCommit{err: err, payload: b})
}

// brokenErr is nil unless a commit's cow.sb write failed (broken). Then
// it rewrites cow.sb naming the top memory has, and if that write
// succeeds the disk and memory agree again and it returns nil: a
// snapshot or collapse whose commit a full store refused keeps writes
// from being acknowledged only until space is back, not until the volume
// is reopened. While broken nothing changes the top: Snapshot and a
// collapse's commit flush first, and flush calls this.
func (l *Layer) brokenErr() error {
	if l.broken.Load() == nil {
		return nil
	}
	l.recommitMu.Lock()
	defer l.recommitMu.Unlock()
	b := l.broken.Load()
	if b == nil {
		return nil // another caller settled it
	}
	if err := l.vsb.Write(b.payload); err != nil {
		return fmt.Errorf("%v; since then rewriting %s failed: %w", b.err, volFile, err)
	}
	l.broken.Store(nil)
	l.logger().Info("cow: cow.sb names the top again after a failed commit", "err", b.err)
	return nil
}

// Top is the id of the image the volume writes into.
func (l *Layer) Top() string {
	l.chainMu.RLock()
	defer l.chainMu.RUnlock()
	return l.top.meta.ID
}

// Depth is the number of images in the chain.
func (l *Layer) Depth() int {
	l.chainMu.RLock()
	defer l.chainMu.RUnlock()
	return int(l.top.depth)
}

// FrozenFor reports whether the current top was started by a snapshot
// tagged tag: that snapshot's freeze is done, and Snapshot(tag) returns
// its image without freezing again.
func (l *Layer) FrozenFor(tag string) bool {
	l.chainMu.RLock()
	defer l.chainMu.RUnlock()
	return tag != "" && l.top.meta.Tag == tag
}

// Snapshot freezes the current top and starts a new one on it, returning
// the frozen image's id: the snapshot's data. tag names the snapshot; a
// repeated call with the same tag (a snapshot resumed after a crash) finds
// its own work done and returns the same image. Its cost is a flush and
// the creation of an empty image, whatever the volume's size. Callers stop
// writers first if the snapshot must be exact (writes racing with it land
// on one side or the other).
func (l *Layer) Snapshot(tag string) (string, error) {
	if l.env.ReadOnly {
		return "", block.ErrReadOnly
	}
	l.chainMu.Lock()
	defer l.chainMu.Unlock()
	if tag != "" && l.top.meta.Tag == tag {
		return l.top.meta.Froze, nil
	}
	if int(l.top.depth) >= MaxChain {
		return "", fmt.Errorf("the volume has %d images, the most a chain may have: flatten it first", MaxChain)
	}
	if err := l.flush(); err != nil {
		return "", fmt.Errorf("snapshot: %w", err)
	}
	old := l.top
	im, err := l.newImage(imageMeta{Parent: old.meta.ID, Size: l.size, Chunk: l.chunk, Spec: old.meta.Spec, Tag: tag, Froze: old.meta.ID})
	if err != nil {
		return "", fmt.Errorf("snapshot: %w", err)
	}
	b, _ := json.Marshal(volMeta{Version: version, Top: im.meta.ID})
	if err := l.vsb.Write(b); err != nil {
		// The write may have landed or not: the chain on disk is unknown,
		// so nothing more may be acknowledged until cow.sb names the old
		// top again (brokenErr) or a reopen reads it. The new image stays
		// (Collect removes it if it is not the top).
		im.dev.Close()
		im.sb.Close()
		im.alloc.Close()
		err = fmt.Errorf("snapshot: %s: %w", volFile, err)
		l.breakCommit(err, old.meta.ID)
		return "", err
	}
	// Committed. The old top is a base from now on: its map and
	// superblock are never written again, unless a collapse makes it the
	// top again.
	old.alloc.Close()
	old.sb.Close()
	old.alloc, old.sb = nil, nil
	if old.frozen == nil { // else frozen before, and made the top again by a collapse
		f, err := holdFrozen(l.imageDir(old.meta.ID))
		if err != nil {
			// Committed all the same; only maintainers elsewhere are
			// not kept away (lockImage fails on such a file system too).
			l.logger().Warn("cow: cannot hold the frozen image's lock", "image", old.meta.ID, "err", err)
		}
		old.frozen = f
	}
	im.depth = old.depth + 1
	l.byDepth = append(l.byDepth, im)
	l.all = append(l.all, im)
	l.top = im
	return old.meta.ID, nil
}

// Flatten copies every chunk a base holds into the top and then detaches
// the top from its parent, so the volume no longer needs any snapshot's
// images. Writes go on meanwhile. Interrupted, it is simply run again
// (chunks already copied are skipped).
func (l *Layer) Flatten(ctx context.Context, progress block.Progress) error {
	if l.env.ReadOnly {
		return block.ErrReadOnly
	}
	// A snapshot taken meanwhile makes the old top a base, so the chunks
	// it holds need another pass; commit only when a check under the
	// exclusive lock finds no chunk held by a base.
	for {
		if err := l.flattenPass(ctx, progress); err != nil {
			return err
		}
		l.chainMu.Lock()
		if !l.baseHoldsAny() {
			break
		}
		l.chainMu.Unlock()
	}
	defer l.chainMu.Unlock()
	if err := l.flush(); err != nil {
		return fmt.Errorf("flatten: %w", err)
	}
	if l.top.meta.Parent == "" {
		return nil
	}
	m := l.top.meta
	m.Parent = ""
	if err := l.writeImage(l.top, m); err != nil {
		return fmt.Errorf("flatten: %w", err)
	}
	// Bases stay open (closed with the layer) but hold nothing any more.
	l.byDepth = []*image{nil}
	for d := 1; d < int(l.top.depth); d++ {
		l.byDepth = append(l.byDepth, nil)
	}
	l.byDepth = append(l.byDepth, l.top)
	return nil
}

// flattenStep is how many chunks flattenPass looks through per progress
// report.
const flattenStep = 1024

// flattenPass copies up every chunk a base holds. It looks for them a step
// at a time under chainMu shared, skipping the chunks nothing holds
// without touching them (ownerTable.held), and copies each up under
// chainMu shared of its own, as writes do.
func (l *Layer) flattenPass(ctx context.Context, progress block.Progress) error {
	l.chainMu.RLock()
	total := l.owner.Len()
	l.chainMu.RUnlock()
	keep := func(run, int64) error { return nil } // the chunk's content is its base's
	for c := int64(0); c < total; {
		if err := ctx.Err(); err != nil {
			return err
		}
		end := min((c/flattenStep+1)*flattenStep, total)
		l.chainMu.RLock()
		var err error
		if c = l.nextBaseHeld(c, end); c < end {
			moved := false
			if o := l.owner.Load(c); o != 0 && o != l.top.depth {
				moved, err = l.copyUp(c, false, run{c * l.chunk, 0, o}, 0, keep, func([]byte, run, int64) {})
			}
			if moved {
				l.touched(c*l.chunk, l.chunk)
			}
			c++
		}
		l.chainMu.RUnlock()
		if err != nil {
			return fmt.Errorf("flatten: %w", err)
		}
		if progress != nil && c == end {
			progress(c, total)
		}
	}
	return nil
}

// nextBaseHeld returns the first chunk in [c, to) a base image holds, or
// to; the caller holds chainMu.
func (l *Layer) nextBaseHeld(c, to int64) int64 {
	for k, o := range l.owner.held(c, to) {
		if o != l.top.depth {
			return k
		}
	}
	return to
}

// baseHoldsAny reports whether a base image holds any chunk; the caller
// holds chainMu.
func (l *Layer) baseHoldsAny() bool {
	return l.nextBaseHeld(0, l.owner.Len()) < l.owner.Len()
}

// logger is the stack's logger, or one that discards.
func (l *Layer) logger() *slog.Logger {
	if l.env.Log != nil {
		return l.env.Log
	}
	return slog.New(slog.DiscardHandler)
}

// Close implements block.Device: flushes nothing (callers flush), closes
// every image.
func (l *Layer) Close() error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	for _, im := range l.all {
		keep(im.dev.Close())
		if im.frozen != nil {
			keep(im.frozen.Close()) // releases the lock
		}
		if im.alloc != nil {
			keep(im.alloc.Close())
		}
		if im.sb != nil {
			keep(im.sb.Close())
		}
	}
	l.all = nil
	if l.vsb != nil {
		keep(l.vsb.Close())
		l.vsb = nil
	}
	return first
}

// Describe implements block.Layer: one child per image of the chain, as
// Children orders them, each naming its image. A base's lost redundancy is
// the volume's (most of its data may live there), so the cow's state is
// the worst of them all.
func (l *Layer) Describe() block.Node {
	// Shared, so that Maintain does not close a base being described.
	l.chainMu.RLock()
	defer l.chainMu.RUnlock()
	chain := l.chain()
	kids := make([]block.Node, len(chain))
	for i, im := range chain {
		kids[i] = im.dev.Describe()
		kids[i].Image = im.meta.ID
	}
	return block.Node{Type: "cow", Params: l.params, State: block.Worst(kids), Children: kids}
}
