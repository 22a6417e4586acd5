package crypt

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/fault"
)

// TestTornWriteIntoHole: a sector that is a hole (never written, or
// zeroed) reads as zeroes; a write into part of it re-encrypts all of it,
// and a crash that tears that write — as a disk does, at 512-byte sectors
// — must leave the bytes the write did not cover zero, as they were
// durably, not garbage: what landed of the ciphertext next to zeroes that
// did not is no longer an all-zero sector.
func TestTornWriteIntoHole(t *testing.T) {
	keys := newKeys(t)
	for _, tc := range []struct {
		name string
		tear func(n int) func(int) bool
	}{
		{"nothing", nil},
		{"half", fault.Half},
		{"oddSectors", func(int) func(int) bool { return func(i int) bool { return i/512%2 == 1 } }},
		{"evenSectors", func(int) func(int) bool { return func(i int) bool { return i/512%2 == 0 } }},
	} {
		for _, hole := range []string{"fresh", "zeroed", "trimmed"} {
			for _, w := range [][2]int64{{100, 1}, {SectorSize + 1000, 600}, {2*SectorSize - 10, 20}} {
				t.Run(fmt.Sprintf("%s/%s/%d+%d", tc.name, hole, w[0], w[1]), func(t *testing.T) {
					dir := t.TempDir()
					l := build(t, block.Env{Dir: dir, Size: 1 << 20, Create: true, Keys: keys})
					l.Close()
					d := &crashDev{Layer: fileChild(t, dir, false, 0), crashAt: -1, tear: tc.tear}
					l, err := New(block.Env{Keys: keys}, nil, []block.Layer{d})
					if err != nil {
						t.Fatal(err)
					}
					if err := l.WriteAt(pattern(4*SectorSize, 1), 0, false); err != nil {
						t.Fatal(err)
					}
					switch hole {
					case "zeroed":
						err = l.WriteZeroes(0, 4*SectorSize, block.ZeroFlags{})
					case "trimmed":
						err = l.Trim(0, 4*SectorSize, false)
					default:
						err = l.WriteZeroes(0, 4*SectorSize, block.ZeroFlags{NoHole: true})
					}
					if err != nil {
						t.Fatal(err)
					}
					if err := l.Flush(); err != nil {
						t.Fatal(err)
					}
					if hole == "fresh" { // never written: a hole in the file
						l.Close()
						dir = t.TempDir()
						d = &crashDev{Layer: fileChild(t, dir, true, DataOffset+(1<<20)), crashAt: -1, tear: tc.tear}
						if l, err = New(block.Env{Size: 1 << 20, Create: true, Keys: keys}, nil, []block.Layer{d}); err != nil {
							t.Fatal(err)
						}
					}
					d.mu.Lock()
					d.crashAt = d.writes
					d.mu.Unlock()
					if err := l.WriteAt(bytes.Repeat([]byte{0xa5}, int(w[1])), w[0], false); err == nil {
						t.Fatal("write through a crash succeeded")
					}
					l.Close()
					l, err = New(block.Env{Keys: keys}, nil, []block.Layer{fileChild(t, dir, false, 0)})
					if err != nil {
						t.Fatal(err)
					}
					defer l.Close()
					got := mustRead(t, l, 0, 4*SectorSize)
					for i, b := range got {
						if (int64(i) < w[0] || int64(i) >= w[0]+w[1]) && b != 0 {
							t.Fatalf("byte %d, beside the torn write %d+%d, reads %#x: a durable zero lost", i, w[0], w[1], b)
						}
					}
				})
			}
		}
	}
}
