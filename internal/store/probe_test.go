package store

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestProbeStalled: a check that blocks in the kernel — here opening the
// marker, made a FIFO without a writer, as a file on an NFS server that
// does not answer blocks — makes Probe answer ErrStalled in its time
// instead of hanging; callers meanwhile share that one check; once the
// file system answers, Probe answers what the check found.
func TestProbeStalled(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, err := Claim(s.Root, Marker{ID: "probe-test", Cluster: "c"})
	if err != nil {
		t.Fatal(err)
	}
	s.ID = m.ID
	if err := s.Probe(5 * time.Second); err != nil {
		t.Fatalf("a healthy store: %v", err)
	}
	marker := filepath.Join(s.Root, MarkerFile)
	good, err := os.ReadFile(marker)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(marker); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(marker, 0o644); err != nil {
		t.Skipf("no FIFOs here: %v", err)
	}

	start := time.Now()
	if err := s.Probe(100 * time.Millisecond); !errors.Is(err, ErrStalled) {
		t.Fatalf("a check blocked in open: %v, want ErrStalled", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Probe took %v with a 100ms bound", took)
	}
	s.probeMu.Lock()
	first := s.probing
	s.probeMu.Unlock()
	if err := s.Probe(100 * time.Millisecond); !errors.Is(err, ErrStalled) {
		t.Fatalf("again: %v, want ErrStalled", err)
	}
	s.probeMu.Lock()
	again := s.probing
	s.probeMu.Unlock()
	if first == nil || again != first {
		t.Fatal("a second Probe did not share the check under way")
	}

	// The file system answers: the blocked open gets its writer.
	w, err := os.OpenFile(marker, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(good)
	w.Close()
	<-first.done
	if first.err != nil {
		t.Fatalf("the check, once the file system answered: %v", first.err)
	}
	if err := os.Remove(marker); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(marker, good, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Probe(5 * time.Second); err != nil {
		t.Fatalf("after the stall: %v", err)
	}
}
