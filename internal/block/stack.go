package block

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"sync"

	"github.com/basalt-storage/basalt/internal/jsonstrict"
)

// Spec describes a stack: a layer type, its parameters and its children
// (the layers it is built on). Volume types are Specs with placeholders the
// volume service fills in (docs/layers.md).
type Spec struct {
	Type     string          `json:"type"`
	Params   json.RawMessage `json:"params,omitempty"`
	Children []Spec          `json:"children,omitempty"`
}

// Layer is a Device built from a Spec node. Besides serving I/O it
// describes itself for `volume show` (type, parameters, health).
type Layer interface {
	Device
	Describe() Node
}

// Layer states.
const (
	StateOK         = "ok"
	StateDegraded   = "degraded"
	StateRebuilding = "rebuilding"
	StateFailed     = "failed"
)

// Node is a layer's self-description, children included.
type Node struct {
	Type     string          `json:"type"`
	Params   json.RawMessage `json:"params,omitempty"`
	State    string          `json:"state"`
	Progress *float64        `json:"progress,omitempty"` // percent, while rebuilding
	Path     string          `json:"path,omitempty"`     // backing file of a file layer
	// Image is the copy-on-write image whose stack this node is (set on
	// the children of a cow node: its top, then its base images).
	Image    string `json:"image,omitempty"`
	Children []Node `json:"children,omitempty"`
}

// Env is what a layer factory may use besides its parameters.
type Env struct {
	// Dir holds the stack's files (layer metadata, backing files that are
	// named relative to it).
	Dir string
	// Size is the size the stack is being created with (Create) or last
	// had; leaf layers size their files from it.
	Size int64
	// Create is true on the first build: layers create their files and
	// metadata; otherwise they open what exists and fail if it is missing.
	Create bool
	// ReadOnly opens every layer read-only.
	ReadOnly bool
	// Images is the directory of copy-on-write images shared by every
	// volume of a store (cow).
	Images string
	// Base, on Create, is the image a new cow top starts from: a clone of
	// the snapshot that froze it. Empty: a new, empty volume. With
	// ReadOnly (and not Create) it is the image to open instead of the
	// volume's top: a snapshot, read in place.
	Base string
	// Keys wraps data keys (crypt); nil when the cluster has none.
	Keys Keys
	// MetaFS opens layer metadata files (nil: the real file system). Crash
	// tests substitute files that fail at a chosen write (package fault).
	MetaFS func(path string) (MetaFile, error)
	Log    *slog.Logger
	// ChildSpecs are the specs the layer's children were built from (set
	// by Build for the layer's New only): a redundant layer rebuilds a
	// failed child from its spec, whatever subtree it is.
	ChildSpecs []Spec
	// Fence, if set, is entered before every write that reaches storage —
	// data through file layers, metadata through OpenMeta — and a refusal
	// refuses the write. It is how a node that lost a volume's write
	// lease stops changing the volume at the bottom of the stack, whatever
	// the layers above (background resyncs included) still try.
	Fence Fence
}

// Fence stops a stack's writes where they reach storage (Env.Fence).
// Every write, sync, trim and resize of a file enters it first and exits
// it once the system call is done, so that its owner, having refused
// every later write, can wait for those already let through — a write
// stalled in the file system (an NFS server that does not answer for a
// while) must not land after the next writer's first one.
type Fence interface {
	// Enter lets a write through (nil; Exit must follow) or refuses it
	// (ErrFenced, say; no Exit).
	Enter() error
	Exit()
}

// FenceFunc is a Fence that asks f at every Enter and keeps no count: for
// a writer that nothing waits for (f alone decides).
type FenceFunc func() error

// Enter implements Fence.
func (f FenceFunc) Enter() error { return f() }

// Exit implements Fence.
func (FenceFunc) Exit() {}

// MetaFile is a layer metadata file: what package superblock and package
// bitmap store their copies in.
type MetaFile interface {
	io.ReaderAt
	io.WriterAt
	Sync() error
	Close() error
}

// OpenMeta opens the metadata file name (relative to Dir), creating it
// empty if it does not exist. Layers open every metadata file through it.
// A read-only Env never creates or changes anything: the file is opened
// read-only, and a missing one reads as empty.
func (env Env) OpenMeta(name string) (MetaFile, error) {
	f, err := env.openMeta(name)
	if err != nil || env.Fence == nil {
		return f, err
	}
	return fencedMeta{MetaFile: f, fence: env.Fence}, nil
}

// fencedMeta refuses writes and syncs once the fence says so.
type fencedMeta struct {
	MetaFile
	fence Fence
}

func (f fencedMeta) WriteAt(p []byte, off int64) (int, error) {
	if err := f.fence.Enter(); err != nil {
		return 0, err
	}
	defer f.fence.Exit()
	return f.MetaFile.WriteAt(p, off)
}

func (f fencedMeta) Sync() error {
	if err := f.fence.Enter(); err != nil {
		return err
	}
	defer f.fence.Exit()
	return f.MetaFile.Sync()
}

func (env Env) openMeta(name string) (MetaFile, error) {
	path := name
	if !filepath.IsAbs(path) {
		path = filepath.Join(env.Dir, name)
	}
	if env.MetaFS != nil {
		return env.MetaFS(path)
	}
	if env.ReadOnly {
		f, err := os.Open(path)
		if errors.Is(err, fs.ErrNotExist) {
			return emptyMeta{}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("metadata file: %w", err)
		}
		return f, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("metadata file: %w", err)
	}
	return f, nil
}

// SyncDir makes the entries of directory dir durable: the files and
// directories created in it. A layer that creates metadata files syncs
// their directory (and a new directory's parent) before anything that
// names them is written: fsync of a file does not cover its name on every
// file system (ext4 without a journal, an in-place fdatasync on ext4 with
// one).
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// emptyMeta is a missing metadata file opened read-only: empty, unwritable.
type emptyMeta struct{}

func (emptyMeta) ReadAt([]byte, int64) (int, error)  { return 0, io.EOF }
func (emptyMeta) WriteAt([]byte, int64) (int, error) { return 0, ErrReadOnly }
func (emptyMeta) Sync() error                        { return nil }
func (emptyMeta) Close() error                       { return nil }

// Factory builds a layer from its parameters and built children.
type Factory func(env Env, params json.RawMessage, children []Layer) (Layer, error)

// Type is a registered layer type.
type Type struct {
	Name string
	// Doc is one line for `basalt type` listings and docs.
	Doc string
	// MinChildren and MaxChildren bound the children (-1: no maximum).
	MinChildren, MaxChildren int
	// TolerateFailedChildren: a child that cannot be built (its file is
	// gone, unreadable) is passed to New as a Failed layer instead of
	// failing the whole stack. Redundant layers (mirror, parity) set it.
	TolerateFailedChildren bool
	// ChildSize is the size each child is created with when this layer is
	// created with size bytes and n children (nil: size itself). Layers
	// that spread data (stripe, parity) or add metadata in band (checksum,
	// crypt) set it.
	ChildSize func(params json.RawMessage, size int64, n int) (int64, error)
	New       Factory
	// Params is a value of the layer's parameter type (a struct): CheckNew
	// holds a new stack's parameters to its fields' JSON names exactly —
	// no other case, no key twice (jsonstrict) — which building a saved
	// stack does not (DecodeParams). Nil: not checked.
	Params any
	// Compose, when set, is used instead of New: the layer builds its
	// children itself from their specs (cow builds one child stack per
	// image, each in its own directory).
	Compose func(env Env, params json.RawMessage, children []Spec) (Layer, error)
	// Files lists the files the layer opens in its directory, as its
	// parameters name them, defaults included (a backing file, a metadata
	// file); nil when it opens none or its parameters do not decode (New
	// reports that). Check refuses a stack in which two layers sharing a
	// directory would open the same file: each would overwrite the other's.
	Files func(params json.RawMessage) []string
	// ChildDir, when set, says the children live in directories of their
	// own (cow: one per image), in which the layer itself keeps these
	// files; else they share the layer's directory.
	ChildDir []string
}

var (
	registryMu sync.RWMutex
	registry   = map[string]Type{}
)

// Register adds a layer type; each layer package calls it from init.
// Registering a name twice is a programming error.
func Register(t Type) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[t.Name]; dup {
		panic("block: layer type registered twice: " + t.Name)
	}
	registry[t.Name] = t
}

// Types lists the registered layer types by name.
func Types() []Type {
	registryMu.RLock()
	defer registryMu.RUnlock()
	out := make([]Type, 0, len(registry))
	for _, t := range registry {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Check validates a spec without building anything: known types, child
// counts, depth, and no file opened by two layers in one directory.
func Check(s Spec) error {
	return check(s, dirFiles{}, 1)
}

// CheckNew is Check for a stack given as new input (a volume type being
// created): each layer's parameters must also name its fields exactly
// (Type.Params) — not in another case, no key twice — which Check, run
// by every Build, does not ask of saved stacks: some were accepted before
// names were case-sensitive, and must still build.
func CheckNew(s Spec) error {
	if err := Check(s); err != nil {
		return err
	}
	return exactParams(s)
}

func exactParams(s Spec) error {
	registryMu.RLock()
	t := registry[s.Type]
	registryMu.RUnlock()
	if t.Params != nil && len(s.Params) > 0 {
		if err := jsonstrict.Decode(s.Params, reflect.New(reflect.TypeOf(t.Params)).Interface()); err != nil {
			return fmt.Errorf("layer %q: params: %w", s.Type, err)
		}
	}
	for i, c := range s.Children {
		if err := exactParams(c); err != nil {
			return fmt.Errorf("%s child %d: %w", s.Type, i, err)
		}
	}
	return nil
}

// MaxDepth bounds how deeply a spec nests. Real stacks are a handful of
// layers; the bound keeps Check and Build from recursing without end into
// a spec that contains itself (Specs built in Go can share a Children
// slice) or one nested absurdly deep. (It is far above what a 4 KiB
// spec, the most FuzzCheckSpec tries, can nest: about 140 layers.)
const MaxDepth = 256

// dirFiles maps the files of one directory to the layer opening each.
type dirFiles map[string]string

// claim records that layer typ opens name in the directory of files.
func (files dirFiles) claim(name, typ string) error {
	key := filepath.Clean(name)
	if other, ok := files[key]; ok {
		return fmt.Errorf("layer %q would open %q, which layer %q in the same directory opens too: give one of them another name", typ, name, other)
	}
	files[key] = typ
	return nil
}

func check(s Spec, files dirFiles, depth int) error {
	if depth > MaxDepth {
		return fmt.Errorf("spec nested deeper than %d layers (or containing itself)", MaxDepth)
	}
	registryMu.RLock()
	t, ok := registry[s.Type]
	registryMu.RUnlock()
	if !ok {
		return fmt.Errorf("unknown layer type %q", s.Type)
	}
	if n := len(s.Children); n < t.MinChildren || (t.MaxChildren >= 0 && n > t.MaxChildren) {
		return fmt.Errorf("layer %q takes %s children, not %d", s.Type, childRange(t), n)
	}
	if t.Files != nil {
		for _, name := range t.Files(s.Params) {
			if err := files.claim(name, s.Type); err != nil {
				return err
			}
		}
	}
	for i, c := range s.Children {
		kids := files
		if t.ChildDir != nil {
			kids = dirFiles{}
			for _, name := range t.ChildDir {
				kids.claim(name, s.Type)
			}
		}
		if err := check(c, kids, depth+1); err != nil {
			return fmt.Errorf("%s child %d: %w", s.Type, i, err)
		}
	}
	return nil
}

// Files lists every file name the layers of s open, as their parameters
// give them (see Type.Files).
func Files(s Spec) []string {
	registryMu.RLock()
	t := registry[s.Type]
	registryMu.RUnlock()
	var out []string
	if t.Files != nil {
		out = t.Files(s.Params)
	}
	for _, c := range s.Children {
		out = append(out, Files(c)...)
	}
	return out
}

func childRange(t Type) string {
	switch {
	case t.MaxChildren < 0:
		return fmt.Sprintf("at least %d", t.MinChildren)
	case t.MinChildren == t.MaxChildren:
		return fmt.Sprint(t.MinChildren)
	}
	return fmt.Sprintf("%d to %d", t.MinChildren, t.MaxChildren)
}

// Build turns a spec into a live stack, children first. On failure every
// layer already built is closed. A stack is created (env.Create) only
// with a size in (0, MaxSize], refused before anything exists: a zero
// size would create empty files and a device of no bytes, a larger one
// overflow the layers' arithmetic on it.
func Build(env Env, s Spec) (Layer, error) {
	if err := Check(s); err != nil {
		return nil, err
	}
	if err := checkSize(env); err != nil {
		return nil, err
	}
	return build(env, s)
}

// checkSize refuses to create a stack (or a child, with the size its
// parent's ChildSize gave) with a size outside (0, MaxSize].
func checkSize(env Env) error {
	if env.Create && (env.Size <= 0 || env.Size > MaxSize) {
		return fmt.Errorf("size %d is not in (0, %d]", env.Size, int64(MaxSize))
	}
	return nil
}

func build(env Env, s Spec) (Layer, error) {
	registryMu.RLock()
	t := registry[s.Type]
	registryMu.RUnlock()
	if t.Compose != nil {
		l, err := t.Compose(env, s.Params, s.Children)
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", s.Type, err)
		}
		return l, nil
	}
	cenv := env
	cenv.ChildSpecs = nil
	if env.Create && t.ChildSize != nil {
		n, err := t.ChildSize(s.Params, env.Size, len(s.Children))
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", s.Type, err)
		}
		cenv.Size = n
		if err := checkSize(cenv); err != nil {
			return nil, fmt.Errorf("layer %s: child %w", s.Type, err)
		}
	}
	children := make([]Layer, 0, len(s.Children))
	for i, cs := range s.Children {
		c, err := build(cenv, cs)
		if err != nil && t.TolerateFailedChildren && !env.Create {
			logger(env).Warn("layer child failed to open; continuing degraded", "layer", s.Type, "child", i, "err", err)
			c, err = Failed(cenv, cs, err), nil
		}
		if err != nil {
			CloseAll(children)
			return nil, fmt.Errorf("%s child %d: %w", s.Type, i, err)
		}
		children = append(children, c)
	}
	lenv := env
	lenv.ChildSpecs = s.Children
	l, err := t.New(lenv, s.Params, children)
	if err != nil {
		CloseAll(children)
		return nil, fmt.Errorf("layer %s: %w", s.Type, err)
	}
	return l, nil
}

// DecodeParams strictly decodes a layer's parameters (unknown fields are
// errors: a misspelt parameter must not silently fall back to a default).
func DecodeParams(raw json.RawMessage, v any) error {
	if len(raw) == 0 {
		return nil
	}
	if err := DecodeStrict(raw, v); err != nil {
		return fmt.Errorf("params: %w", err)
	}
	return nil
}

// DecodeStrict decodes one JSON value into v, refusing unknown fields and
// anything after the value: what layers read back from their own
// metadata must be exactly what they wrote. It matches keys to fields
// whatever their case, as stacks saved before CheckNew held new
// parameters to their exact names (Type.Params) hold some in another
// case, and must still build.
func DecodeStrict(raw []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if _, err := d.Token(); err != io.EOF {
		return errors.New("data after the JSON value")
	}
	return nil
}

// Combine is the capability set of a layer that needs every child for an
// operation: an operation is supported only if all children support it, and
// the layer is read-only if any child is.
func Combine(children []Layer) Capabilities {
	c := Capabilities{Flush: true, FUA: true, Trim: true, WriteZeroes: true, FastZero: true, Extents: true, MultiConn: true}
	for _, ch := range children {
		cc := ch.Capabilities()
		c.ReadOnly = c.ReadOnly || cc.ReadOnly
		c.Flush = c.Flush && cc.Flush
		c.FUA = c.FUA && cc.FUA
		c.Trim = c.Trim && cc.Trim
		c.WriteZeroes = c.WriteZeroes && cc.WriteZeroes
		c.FastZero = c.FastZero && cc.FastZero
		c.Extents = c.Extents && cc.Extents
		c.MultiConn = c.MultiConn && cc.MultiConn
	}
	return c
}

// CloseAll closes every layer and returns the first error.
func CloseAll(layers []Layer) error {
	var first error
	for _, l := range layers {
		if err := l.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Describe lists the descriptions of children.
func Describe(children []Layer) []Node {
	out := make([]Node, len(children))
	for i, c := range children {
		out[i] = c.Describe()
	}
	return out
}

// AppendExtent appends e, merging it into the last extent when both have
// the same flags.
func AppendExtent(out []Extent, e Extent) []Extent {
	if n := len(out); n > 0 && out[n-1].Hole == e.Hole && out[n-1].Zero == e.Zero {
		out[n-1].Length += e.Length
		return out
	}
	return append(out, e)
}

// Worst is the state of a layer that needs all of its children: failed if
// one failed, else rebuilding or degraded if one is, else ok.
func Worst(children []Node) string {
	rank := map[string]int{StateOK: 0, StateDegraded: 1, StateRebuilding: 2, StateFailed: 3}
	worst := StateOK
	for _, c := range children {
		if rank[c.State] > rank[worst] {
			worst = c.State
		}
	}
	return worst
}

func logger(env Env) *slog.Logger {
	if env.Log != nil {
		return env.Log
	}
	return slog.New(slog.DiscardHandler)
}

// failed stands in for a child that could not be built: every operation
// fails with the build error, and it describes itself as failed.
type failed struct {
	spec Spec
	path string // the backing file a leaf spec names, resolved
	err  error
}

// Failed returns a layer for spec, which failed to build in env, that
// fails every operation with err. It describes itself with the path of
// the backing file spec names when spec is a leaf (a file layer: the file
// that is missing or unreadable), resolved against env.Dir as the layer
// would have done, so `volume show` says which file is bad.
func Failed(env Env, spec Spec, err error) Layer {
	return &failed{spec: spec, path: backingPath(env, spec), err: err}
}

// backingPath is the path of the one file a leaf spec opens (per
// its type's Files), or "" for a layer with children or without exactly
// one file.
func backingPath(env Env, spec Spec) string {
	registryMu.RLock()
	t, ok := registry[spec.Type]
	registryMu.RUnlock()
	if !ok || t.MaxChildren != 0 || t.Files == nil {
		return ""
	}
	names := t.Files(spec.Params)
	if len(names) != 1 {
		return ""
	}
	p := names[0]
	if !filepath.IsAbs(p) {
		p = filepath.Join(env.Dir, p)
	}
	return p
}

// IsFailed reports whether l is a Failed placeholder, and if so the spec it
// stands for (to rebuild it) and why it failed.
func IsFailed(l Layer) (Spec, error, bool) {
	if f, ok := l.(*failed); ok {
		return f.spec, f.err, true
	}
	return Spec{}, nil, false
}

func (f *failed) Size() int64                               { return 0 }
func (f *failed) Capabilities() Capabilities                { return Capabilities{} }
func (f *failed) ReadAt([]byte, int64) error                { return f.err }
func (f *failed) WriteAt([]byte, int64, bool) error         { return f.err }
func (f *failed) WriteZeroes(int64, int64, ZeroFlags) error { return f.err }
func (f *failed) Trim(int64, int64, bool) error             { return f.err }
func (f *failed) Flush() error                              { return f.err }
func (f *failed) Extents(int64, int64) ([]Extent, error)    { return nil, f.err }
func (f *failed) Close() error                              { return nil }
func (f *failed) Failure() (Spec, error)                    { return f.spec, f.err }
func (f *failed) Describe() Node {
	return Node{Type: f.spec.Type, Params: f.spec.Params, State: StateFailed, Path: f.path}
}
