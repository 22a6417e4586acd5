package blocktest

import (
	"sync/atomic"

	"github.com/basalt-storage/basalt/internal/block"
)

// SwitchFence is a block.Fence (Env.Fence) that refuses every write with
// block.ErrFenced while Refuse is set, as a node's fence does while its
// lease of the metadata cluster goes unrenewed.
type SwitchFence struct{ Refuse atomic.Bool }

// Enter implements block.Fence.
func (f *SwitchFence) Enter() error {
	if f.Refuse.Load() {
		return block.ErrFenced
	}
	return nil
}

// Exit implements block.Fence.
func (f *SwitchFence) Exit() {}
