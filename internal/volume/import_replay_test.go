package volume

import (
	"os"
	"testing"

	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/objects"
)

// TestImportReplayAfterObjectChanged: a create from an object repeated
// with its client token (the first answer was lost) returns the volume
// the first call made, though the object was written again since with
// another size: the request, which left the size to the object, is the
// same, so it is no parameter mismatch.
func TestImportReplayAfterObjectChanged(t *testing.T) {
	e := newEnv(t)
	alice := caller("alice")
	be, bucket := e.objectStore(alice)
	s := e.started(Config{Objects: be})
	ctx := ctxT(t)
	put := func(data []byte) {
		t.Helper()
		if _, err := be.PutImage(ctx, objects.ImageInput{Bucket: bucket, Key: "in.raw", Fill: func(f *os.File) error {
			_, err := f.Write(data)
			return err
		}}); err != nil {
			t.Fatal(err)
		}
	}
	put(pattern(1, 1<<20))
	req := CreateVolume{Name: "imported", FromObject: "s3://" + bucket + "/in.raw", ClientToken: "tok-import"}
	v, err := s.CreateVolume(ctx, alice, req)
	if err != nil {
		t.Fatal(err)
	}
	// The import done (it reads the object), then the object replaced.
	got := waitRecord(t, "import", func() *meta.Volume { return e.volume(v.ID) },
		func(v *meta.Volume) bool { return v.Status != meta.StatusCreating })
	if got.Status != meta.StatusAvailable {
		t.Fatalf("import: %s %q", got.Status, got.StatusMessage)
	}
	put(pattern(2, 2<<20)) // the next nightly image, say
	r, err := s.CreateVolume(ctx, alice, req)
	if err != nil {
		t.Fatalf("repeated create from an object written again since: %v, want volume %s", err, v.ID)
	}
	if r.ID != v.ID {
		t.Fatalf("repeated create made volume %s, the first call %s", r.ID, v.ID)
	}
	// A repeat naming a size of its own is compared on it.
	req.SizeBytes = 4 << 20
	_, err = s.CreateVolume(ctx, alice, req)
	wantCode(t, err, "IdempotentParameterMismatch")
	cleanupAll(t, s, alice)
}
