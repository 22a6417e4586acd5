package block

import "testing"

// A trim or write-zeroes of no bytes does nothing and succeeds, as a write
// of no bytes does and as every layer with children answers it. File
// passed it to fallocate, which refuses a zero length with EINVAL: the
// no-op failed (an NBD client got EIO) whenever a file layer was at the
// top of the stack or under a layer that forwards it (throttle).
func TestFileZeroLengthTrimAndZeroes(t *testing.T) {
	_, d := openZeroed(t, 1<<20)
	defer d.Close()
	for _, fua := range []bool{false, true} {
		if err := d.Trim(4096, 0, fua); err != nil {
			t.Errorf("trim of 0 bytes (fua %v): %v", fua, err)
		}
		for _, f := range []ZeroFlags{{}, {NoHole: true}, {Fast: true}, {NoHole: true, Fast: true}} {
			f.FUA = fua
			if err := d.WriteZeroes(4096, 0, f); err != nil {
				t.Errorf("write-zeroes of 0 bytes (%+v): %v", f, err)
			}
		}
	}
	// Still refused where nothing may be written at all.
	d.Close()
	if err := d.Trim(4096, 0, false); err != ErrClosed {
		t.Errorf("trim of 0 bytes after Close: %v, want ErrClosed", err)
	}
}
