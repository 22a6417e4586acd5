package volume

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/jsonstrict"
	"github.com/basalt-storage/basalt/internal/meta"
)

// VolumeType is a named layer stack template: the built-in ones below and
// those an admin creates (meta.VolumeType). File paths in a template are
// relative to the directory the layer is built in — an image's directory
// below a cow layer, the volume's directory above it — so a template needs
// no placeholders.
type VolumeType struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Stack       json.RawMessage `json:"stack"`
	BuiltIn     bool            `json:"built_in"`
}

// DefaultType is the type of a volume created without one.
const DefaultType = "standard"

func file(path string) string { return `{"type":"file","params":{"path":"` + path + `"}}` }

func files(prefix string, n int) string {
	var legs []string
	for i := range n {
		legs = append(legs, file(prefix+string(rune('0'+i))+".img"))
	}
	return strings.Join(legs, ",")
}

// builtIn are the volume types every cluster has.
var builtIn = []VolumeType{
	{Name: "standard", Description: "copy-on-write over one sparse file",
		Stack: json.RawMessage(`{"type":"cow","children":[` + file("data.img") + `]}`)},
	{Name: "striped", Description: "copy-on-write over a stripe (RAID-0) of 4 files",
		Stack: json.RawMessage(`{"type":"cow","children":[{"type":"stripe","children":[` + files("stripe", 4) + `]}]}`)},
	{Name: "mirrored", Description: "copy-on-write over a mirror (RAID-1) of 2 files",
		Stack: json.RawMessage(`{"type":"cow","children":[{"type":"mirror","children":[` + files("leg", 2) + `]}]}`)},
	{Name: "parity", Description: "copy-on-write over parity (RAID-5), 3 data + 1 parity",
		Stack: json.RawMessage(`{"type":"cow","children":[{"type":"parity","children":[` + files("leg", 4) + `]}]}`)},
	{Name: "encrypted", Description: "AES-XTS encryption over copy-on-write over one file",
		Stack: json.RawMessage(`{"type":"crypt","children":[{"type":"cow","children":[` + file("data.img") + `]}]}`)},
	{Name: "verified", Description: "CRC-32C checksums over copy-on-write over one file",
		Stack: json.RawMessage(`{"type":"checksum","children":[{"type":"cow","children":[` + file("data.img") + `]}]}`)},
}

var typeNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// VolumeTypes lists the built-in and admin-created types, by name.
func (s *Service) VolumeTypes(ctx context.Context) ([]VolumeType, error) {
	stored, err := s.meta.VolumeTypes(ctx)
	if err != nil {
		return nil, err
	}
	out := append([]VolumeType(nil), builtIn...)
	for i := range out {
		out[i].BuiltIn = true
	}
	for _, t := range stored {
		out = append(out, VolumeType{Name: t.Name, Description: t.Description, Stack: t.Stack})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// VolumeType returns a type by name.
func (s *Service) VolumeType(ctx context.Context, name string) (*VolumeType, error) {
	for _, t := range builtIn {
		if t.Name == name {
			t.BuiltIn = true
			return &t, nil
		}
	}
	var out *VolumeType
	err := s.meta.Update(ctx, func(tx *meta.Tx) error {
		t, err := tx.VolumeType(name)
		if t != nil {
			out = &VolumeType{Name: t.Name, Description: t.Description, Stack: t.Stack}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if out == nil {
		return nil, errs.New(errs.KindNotFound, errs.CodeUnknownVolumeType, "volume type %q does not exist (see `basalt type list`)", name)
	}
	return out, nil
}

// CreateVolumeType validates a stack template — known layer types, their
// parameters, child counts — by building it for real in scratch space, and
// stores it. Admin only (the API checks).
func (s *Service) CreateVolumeType(ctx context.Context, name, description string, stack json.RawMessage) (*VolumeType, error) {
	if !typeNameRE.MatchString(name) {
		return nil, errs.Invalid(errs.CodeInvalidName, "type name %q is not valid: use 1-63 lower-case letters, digits, '.', '_' or '-'", name)
	}
	for _, t := range builtIn {
		if t.Name == name {
			return nil, errs.Conflict(errs.CodeTypeExists, "volume type %q is built in", name)
		}
	}
	if err := s.checkStack(stack); err != nil {
		return nil, err
	}
	t := &meta.VolumeType{Name: name, Description: description, Stack: stack, CreatedAt: now()}
	err := s.meta.Update(ctx, func(tx *meta.Tx) error {
		cur, err := tx.VolumeType(name)
		if err != nil {
			return err
		}
		if cur != nil {
			return errs.Conflict(errs.CodeTypeExists, "volume type %q already exists", name)
		}
		tx.PutVolumeType(t)
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.log.Info("volume type created", "type", name)
	return &VolumeType{Name: name, Description: description, Stack: stack}, nil
}

// DeleteVolumeType deletes an admin-created type. Volumes of that type keep
// their stacks (each volume records its own).
func (s *Service) DeleteVolumeType(ctx context.Context, name string) error {
	for _, t := range builtIn {
		if t.Name == name {
			return errs.Conflict(errs.CodeTypeProtected, "volume type %q is built in and cannot be deleted", name)
		}
	}
	err := s.meta.Update(ctx, func(tx *meta.Tx) error {
		cur, err := tx.VolumeType(name)
		if err != nil {
			return err
		}
		if cur == nil {
			return errs.New(errs.KindNotFound, errs.CodeUnknownVolumeType, "volume type %q does not exist", name)
		}
		tx.DeleteVolumeType(name)
		return nil
	})
	if err == nil {
		s.log.Info("volume type deleted", "type", name)
	}
	return err
}

// checkStack parses a template and builds it once in scratch space, so
// every mistake a build would find is reported now, with the layer's own
// message.
func (s *Service) checkStack(raw json.RawMessage) error {
	var spec block.Spec
	if err := jsonstrict.Decode(raw, &spec); err != nil {
		return errs.Invalid(errs.CodeInvalidStack, "stack is not a valid layer spec: %v", err)
	}
	if n := countLayers(spec, "cow"); n > 1 {
		// Each cow keeps cow.sb in its directory and is found by image
		// collection through the volume's directory: one per stack.
		return errs.Invalid(errs.CodeInvalidStack, "stack has %d cow layers; at most one is allowed", n)
	}
	if err := block.CheckNew(spec); err != nil {
		return errs.Invalid(errs.CodeInvalidStack, "stack: %v", err)
	}
	if err := checkPaths(spec); err != nil {
		return err
	}
	dir, err := os.MkdirTemp(s.store.TempDir(), "type-check-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	env := s.env(filepath.Join(dir, "volume"))
	env.Images, env.Size, env.Create = filepath.Join(dir, "images"), 64<<20, true
	l, err := block.Build(env, spec)
	if err != nil {
		return errs.Invalid(errs.CodeInvalidStack, "stack: %v", err)
	}
	l.Close()
	return nil
}

func countLayers(spec block.Spec, typ string) int {
	n := 0
	if spec.Type == typ {
		n++
	}
	for _, c := range spec.Children {
		n += countLayers(c, typ)
	}
	return n
}

// checkPaths refuses a stack naming a file — a backing file or a layer's
// metadata file — that leaves the layer's directory: a template must not
// name files elsewhere on the node.
func checkPaths(spec block.Spec) error {
	for _, name := range block.Files(spec) {
		if !filepath.IsLocal(name) || name != filepath.Clean(name) {
			return errs.Invalid(errs.CodeInvalidStack, "file name %q in the stack must be a plain relative name", name)
		}
	}
	return nil
}
