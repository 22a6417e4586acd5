package throttle

import (
	"testing"

	"github.com/basalt-storage/basalt/internal/block/blocktest"
)

// Close closes the child once, however often it is called (as linear and
// stripe do: a child's Close need not be idempotent).
func TestCloseClosesTheChildOnce(t *testing.T) {
	child := &blocktest.Fake{N: 4096}
	l := throttle(t, `{"iops":10}`, child)
	l.Close()
	l.Close()
	if child.Closes() != 1 {
		t.Fatalf("child closed %d times", child.Closes())
	}
}
