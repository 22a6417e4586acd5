// Package file is the `file` layer: a leaf backed by one sparse file.
//
// Params: {"path": "NAME"} — relative paths are inside the stack's
// directory. With Env.Create the file is created (sparse, Env.Size bytes)
// and must not exist yet; otherwise it must exist.
//
// The layer is block.File (pread/pwrite, FUA by RWF_DSYNC, flush by
// fdatasync, trim and zeroes by fallocate, extents by SEEK_DATA/SEEK_HOLE)
// plus a description.
package file

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/basalt-storage/basalt/internal/block"
)

func init() {
	block.Register(block.Type{
		Name: "file", Doc: "a sparse file on a pool (leaf)",
		Params:      Params{},
		MinChildren: 0, MaxChildren: 0, New: New,
		Files: func(raw json.RawMessage) []string {
			var p Params
			if block.DecodeParams(raw, &p) != nil || p.Path == "" {
				return nil // New refuses these params
			}
			return []string{p.Path}
		},
	})
}

// Params are the file layer's parameters.
type Params struct {
	Path string `json:"path"`
}

// Layer is a file layer.
type Layer struct {
	*block.File
	path   string
	params json.RawMessage
}

// New builds a file layer.
func New(env block.Env, raw json.RawMessage, _ []block.Layer) (block.Layer, error) {
	var p Params
	if err := block.DecodeParams(raw, &p); err != nil {
		return nil, err
	}
	if p.Path == "" {
		return nil, errors.New("params.path is required")
	}
	path := p.Path
	if !filepath.IsAbs(path) {
		path = filepath.Join(env.Dir, path)
	}
	if env.Create {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("create %s: %w", path, err)
		}
		err = f.Truncate(env.Size)
		if err == nil {
			err = f.Sync()
		}
		f.Close()
		if err != nil {
			os.Remove(path)
			return nil, fmt.Errorf("size %s: %w", path, err)
		}
	}
	f, err := block.OpenFile(path, env.ReadOnly)
	if err != nil {
		return nil, err
	}
	if env.Fence != nil {
		f.SetFence(env.Fence)
	}
	return &Layer{File: f, path: path, params: raw}, nil
}

// Describe implements block.Layer.
func (l *Layer) Describe() block.Node {
	state := block.StateOK
	if _, err := os.Stat(l.path); err != nil {
		state = block.StateFailed
	}
	return block.Node{Type: "file", Params: l.params, State: state, Path: l.path}
}
