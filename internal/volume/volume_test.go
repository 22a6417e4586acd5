package volume

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/meta/metatest"
	"github.com/basalt-storage/basalt/internal/pki"
	"github.com/basalt-storage/basalt/internal/store"
)

func TestMain(m *testing.M) { metatest.Main(m) }

// openTestStore returns the package's shared metadata store and its CA.
func openTestStore(t testing.TB) (*meta.Store, *pki.CA) {
	e := metatest.Shared(t)
	return e.Meta, e.CA
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var uniqN atomic.Int64

// uniq makes a name unique within the shared store.
func uniq(prefix string) string {
	return prefix + strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + strconv.FormatInt(uniqN.Add(1), 36)
}

// env is one test's world: the shared metadata store, a private data root
// and a node name of its own, so that Start (which adopts the records of
// its node) touches only this test's records.
type env struct {
	t    *testing.T
	meta *meta.Store
	st   *store.Store
	node string
}

func newEnv(t *testing.T) *env {
	m, _ := openTestStore(t)
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, meta: m, st: st, node: uniq("node")}
}

// service makes a Service of this env's node; it is stopped at cleanup.
func (e *env) service(cfg Config) *Service {
	if cfg.Node == "" {
		cfg.Node = e.node
	}
	s := New(e.meta, e.st, cfg, quietLog())
	e.t.Cleanup(s.Stop)
	return s
}

// started makes a Service and runs its Start.
func (e *env) started(cfg Config) *Service {
	s := e.service(cfg)
	if err := s.Start(context.Background()); err != nil {
		e.t.Fatalf("Start: %v", err)
	}
	return s
}

func caller(name string) Caller { return Caller{Name: name, ID: uniq("uid")} }

var adminCaller = Caller{Name: "admin", ID: "admin-id-for-tests", Admin: true}

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	if !errs.IsCode(err, code) {
		t.Fatalf("error %v, want %s", err, code)
	}
}

func (e *env) provisioned() int64 {
	e.t.Helper()
	n, err := e.meta.Provisioned(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// waitVolume polls a volume until its status is one of want.
func (e *env) waitVolume(id string, want ...string) *meta.Volume {
	e.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		v, err := e.meta.Volume(context.Background(), id)
		if err != nil {
			e.t.Fatalf("volume %s: %v", id, err)
		}
		for _, w := range want {
			if v.Status == w {
				return v
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("volume %s is %s (%s), want %v", id, v.Status, v.StatusMessage, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitSnapshot polls a snapshot until its status is one of want.
func (e *env) waitSnapshot(id string, want ...string) *meta.Snapshot {
	e.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		sn, err := e.meta.Snapshot(context.Background(), id)
		if err != nil {
			e.t.Fatalf("snapshot %s: %v", id, err)
		}
		for _, w := range want {
			if sn.Status == w {
				return sn
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("snapshot %s is %s (%s), want %v", id, sn.Status, sn.StatusMessage, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitFile waits until path exists (a job has begun writing).
func (e *env) waitFile(path string) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !e.st.Exists(path) {
		if time.Now().After(deadline) {
			e.t.Fatalf("%s never appeared", path)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fill writes random data at the given offsets of a volume's file and
// returns the file's whole content afterwards.
func (e *env) fill(volID string, seed uint64, exts ...[2]int64) []byte {
	e.t.Helper()
	p := e.st.VolumePath(volID)
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	for _, x := range exts {
		b := make([]byte, x[1])
		for i := range b {
			b[i] = byte(rng.UintN(255) + 1)
		}
		if _, err := f.WriteAt(b, x[0]); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		e.t.Fatal(err)
	}
	return e.read(p)
}

func (e *env) read(path string) []byte {
	e.t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

// checkProvisioned verifies the metadata invariant of doc.go across the
// whole shared store: capacity/provisioned equals the bytes of every volume
// and snapshot record not finished deleting (extends in flight count their
// target size). Call it only when no job of any test is running.
func checkProvisioned(t *testing.T) {
	t.Helper()
	m, _ := openTestStore(t)
	ctx := context.Background()
	var sum int64
	vols, err := m.Volumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols {
		sum += v.SizeBytes
		if v.Status == meta.StatusExtending && v.TargetSize > v.SizeBytes {
			sum += v.TargetSize - v.SizeBytes
		}
	}
	snaps, err := m.Snapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sn := range snaps {
		sum += sn.SizeBytes
	}
	p, err := m.Provisioned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p != sum {
		t.Fatalf("capacity/provisioned = %d, but the records hold %d bytes", p, sum)
	}
}

func sameBytes(a, b []byte) bool { return bytes.Equal(a, b) }
