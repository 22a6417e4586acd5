package objects

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestUnexportRacesPut: in sidecar mode Unexport reads the key's record
// and then removes the record file of the key. A PUT that publishes a new
// object between the two must not lose its record to it — the object the
// PUT was acknowledged for would turn into a file written directly (GET
// NoSuchKey, every later PUT KeyHoldsUnexportedFile) while Unexport says
// it removed the old one. Unexport is one of the key's writes: it either
// removes the record it read, or comes after the PUT and removes (and
// reports) the new one.
func TestUnexportRacesPut(t *testing.T) {
	e := newEnv(t, true)
	c := e.alice
	mkBucket(t, c, "unexp")
	put(t, c, "unexp", "k", "one")
	sc := e.be.meta.(*sidecarMeta)

	// The PUT of "two" in progress: past its checks under the key's lock,
	// in its commit under the record's lock.
	unlockKey, err := e.be.keyLock("unexp", "k")
	if err != nil {
		t.Fatal(err)
	}
	unlockRec, err := sc.lock("unexp", "k", unix.LOCK_EX)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		oi  ObjectInfo
		err error
	}
	done := make(chan result, 1)
	go func() {
		oi, err := e.be.Unexport(ctx, "unexp", "k")
		done <- result{oi, err}
	}()
	time.Sleep(200 * time.Millisecond) // Unexport reads the record of "one", if it may

	// The commit: the new record, then the data renamed into place (what
	// sidecarMeta.commit does under the lock held here).
	f, err := os.CreateTemp(e.be.tmp, "obj-*")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("two"); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	m := &objectMeta{ETag: `"` + md5hex("two") + `"`, Key: "k"}
	m.setStat(&st)
	data, err := encodeRecord(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFileSync(sc.tmp, sc.dir, sc.path("unexp", "k"), data); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(f.Name(), filepath.Join(e.root, "unexp", "k")); err != nil {
		t.Fatal(err)
	}
	unlockRec()
	unlockKey()

	res := <-done
	if res.err != nil {
		t.Fatalf("unexport: %v", res.err)
	}
	switch res.oi.ETag {
	case md5hex("one"):
		// Unexport came first: the PUT's object must be served.
		if got := get(t, c, "unexp", "k"); got != "two" {
			t.Fatalf("unexport removed the record of %q, then the key holds %q", "one", got)
		}
	case md5hex("two"):
		// Unexport came after the PUT: it removed the new record.
		if _, err := e.be.Export(ctx, "unexp", "k"); err != nil {
			t.Fatalf("export again: %v", err)
		}
	default:
		t.Fatalf("unexport reported ETag %s", res.oi.ETag)
	}
	verify(t, e, "unexp", VerifyOptions{Content: true})
}
