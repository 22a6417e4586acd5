// Package layers links every layer type into the binary: import it for its
// side effect, and every type is registered with package block.
package layers

import (
	_ "github.com/basalt-storage/basalt/internal/block/checksum"
	_ "github.com/basalt-storage/basalt/internal/block/cow"
	_ "github.com/basalt-storage/basalt/internal/block/crypt"
	_ "github.com/basalt-storage/basalt/internal/block/file"
	_ "github.com/basalt-storage/basalt/internal/block/linear"
	_ "github.com/basalt-storage/basalt/internal/block/mirror"
	_ "github.com/basalt-storage/basalt/internal/block/parity"
	_ "github.com/basalt-storage/basalt/internal/block/stripe"
	_ "github.com/basalt-storage/basalt/internal/block/throttle"
)
