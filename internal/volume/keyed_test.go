package volume

import (
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/meta"
)

// TestKeyed: one lock per key while anyone holds a reference, shared by
// all who ask meanwhile; the key is forgotten with its last reference,
// and a second drop of one reference changes nothing.
func TestKeyed(t *testing.T) {
	var k keyed[sync.Mutex]
	a, dropA := k.get("v")
	b, dropB := k.get("v")
	if a != b {
		t.Fatal("two holders of one key got different locks")
	}
	if c, dropC := k.get("w"); c == a {
		t.Fatal("two keys share a lock")
	} else {
		dropC()
	}
	dropA()
	dropA()
	if k.size() != 1 {
		t.Fatalf("%d keys with one reference left, want 1", k.size())
	}
	dropB()
	if k.size() != 0 {
		t.Fatalf("%d keys after every reference was dropped, want 0", k.size())
	}

	// Exclusion holds across holders of the key.
	unlock := lockKey(&k, "v")
	got := make(chan struct{})
	go func() {
		defer lockKey(&k, "v")()
		close(got)
	}()
	select {
	case <-got:
		t.Fatal("a second holder locked a locked key")
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	<-got
	if k.size() != 0 {
		t.Fatalf("%d keys after both unlocked, want 0", k.size())
	}
}

// TestVolumeLocksForgotten: the per-volume locks of a node (write gates,
// open locks, lease-change locks) last only while something uses them.
// Before, a node kept three mutexes for every volume it had ever opened,
// snapshotted or taken the lease of, for as long as it ran.
func TestVolumeLocksForgotten(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	x := runExports(t, s)
	for range 3 {
		v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: uniq("v"), SizeBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		a, err := s.Attach(ctx, alice, v.ID, "hv1", meta.ModeRW)
		if err != nil {
			t.Fatal(err)
		}
		exp, err := x.Open(ctx, a.Export, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := exp.Device.WriteAt(make([]byte, 4096), 0, true); err != nil {
			t.Fatal(err)
		}
		if _, err := s.CreateSnapshot(ctx, alice, a.VolumeID, "", ""); err != nil {
			t.Fatal(err)
		}
		if s.gates.size() == 0 || s.openMus.size() != 0 {
			t.Fatalf("with a connection open: %d gates (want its one), %d open locks (want none)", s.gates.size(), s.openMus.size())
		}
		exp.Release()
		if err := s.Detach(ctx, alice, a.ID); err != nil {
			t.Fatal(err)
		}
	}
	if g, o, c := s.gates.size(), s.openMus.size(), s.leases.changing.size(); g+o+c != 0 {
		t.Fatalf("after 3 volumes were served, snapshotted and detached: %d gates, %d open locks, %d lease-change locks kept; want none", g, o, c)
	}
	cleanupAll(t, s, alice)
}
