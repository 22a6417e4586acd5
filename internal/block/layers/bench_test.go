package layers_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/blocktest"
	"github.com/basalt-storage/basalt/internal/keys"
)

// benchStacks are bench/layers.sh's stacks: one layer over plain files
// each, and a 4-layer stack. The Go benchmarks measure the layers' own
// cost without the NBD server and the network in the way; bench/layers.sh
// is the measurement of record.
var benchStacks = []struct{ name, spec string }{
	{"file", `{"type":"file","params":{"path":"a.img"}}`},
	{"stripe", `{"type":"stripe","children":[` + benchFiles(4) + `]}`},
	{"mirror", `{"type":"mirror","children":[` + benchFiles(2) + `]}`},
	{"parity", `{"type":"parity","children":[` + benchFiles(4) + `]}`},
	{"cow", `{"type":"cow","children":[` + benchFiles(1) + `]}`},
	{"checksum", `{"type":"checksum","children":[` + benchFiles(1) + `]}`},
	{"crypt", `{"type":"crypt","children":[` + benchFiles(1) + `]}`},
	{"stack4", `{"type":"crypt","children":[{"type":"checksum","children":[{"type":"cow","children":[{"type":"stripe","children":[` + benchFiles(4) + `]}]}]}]}`},
}

func benchFiles(n int) string {
	s := ""
	for i := range n {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf(`{"type":"file","params":{"path":"f%d.img"}}`, i)
	}
	return s
}

// BenchmarkStacks runs the bench jobs (4 KiB random reads and writes, 1 MiB
// sequential reads and writes, 16 in flight) on every stack.
//
//	go test ./internal/block/layers -run - -bench Stacks -benchtime 2s
func BenchmarkStacks(b *testing.B) {
	const size = 256 << 20
	for _, st := range benchStacks {
		b.Run(st.name, func(b *testing.B) {
			k, err := keys.New(keys.Generate())
			if err != nil {
				b.Fatal(err)
			}
			dir := b.TempDir()
			env := block.Env{Dir: dir, Images: dir + "/images", Size: size, Create: true, Keys: k}
			d, err := block.Build(env, blocktest.Spec(b, st.spec))
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			buf := make([]byte, 1<<20)
			for i := range buf {
				buf[i] = byte(i * 7)
			}
			for off := int64(0); off < size; off += 1 << 20 {
				if err := d.WriteAt(buf, off, false); err != nil {
					b.Fatal(err)
				}
			}
			// Start every stack from clean pages (and clean layer metadata).
			if err := d.Flush(); err != nil {
				b.Fatal(err)
			}
			for _, job := range []struct {
				name  string
				bs    int
				write bool
				rand  bool
			}{{"randread-4k", 4 << 10, false, true}, {"randwrite-4k", 4 << 10, true, true},
				{"read-1M", 1 << 20, false, false}, {"write-1M", 1 << 20, true, false}} {
				b.Run(job.name, func(b *testing.B) {
					b.SetBytes(int64(job.bs))
					b.SetParallelism(benchPar)
					var next atomic.Int64
					b.RunParallel(func(pb *testing.PB) {
						p := make([]byte, job.bs)
						copy(p, buf)
						for pb.Next() {
							var off int64
							if job.rand {
								off = rand.Int64N(size/int64(job.bs)) * int64(job.bs)
							} else {
								off = next.Add(int64(job.bs)) % size / int64(job.bs) * int64(job.bs)
							}
							var err error
							if job.write {
								err = d.WriteAt(p, off, false)
							} else {
								err = d.ReadAt(p, off)
							}
							if err != nil {
								b.Fatal(err)
							}
						}
					})
				})
			}
		})
	}
}

// benchPar is the number of requests in flight per GOMAXPROCS
// (BENCH_PAR overrides the default 8).
var benchPar = func() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_PAR")); err == nil && n > 0 {
		return n
	}
	return 8
}()
