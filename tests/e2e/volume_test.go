package e2e

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestVolumeLifecycle: create is O(1) and sparse; list/show by id and name;
// extend grows record and file; delete removes the record, the volume's
// directory and (with --image-grace 0s) its image.
func TestVolumeLifecycle(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{Args: []string{"--image-grace", "0s"}})
	admin := n.Admin()

	// The whole CLI run, metadata fsyncs included: the bound only tells
	// O(1) from writing 64 GiB, with room for a loaded machine (sparseness
	// is checked below, on the files).
	start := time.Now()
	r := admin.OK(nil, "volume", "create", "--size", "64GiB", "--name", "big")
	took := time.Since(start)
	t.Logf("volume create of 64 GiB: %v (the whole CLI run)", took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("creating a 64 GiB volume took %v, want < 5s (O(1) thin provisioning)", took)
	}
	requireKeys(t, "volume create output", []byte(r.Stdout),
		"id", "name", "size_bytes", "status", "type", "owner", "multiattach", "source_snapshot", "created_at", "attachments")
	var v Volume
	if err := json.Unmarshal([]byte(r.Stdout), &v); err != nil {
		t.Fatal(err)
	}
	if v.Status != "available" || v.SizeBytes != 64*GiB || v.Name != "big" || v.Type != "standard" ||
		v.Owner != "admin" || v.Multiattach || v.SourceSnapshot != "" || v.CreatedAt == "" || v.Attachments == nil {
		t.Errorf("new volume: %+v", v)
	}
	if _, err := time.Parse(time.RFC3339, v.CreatedAt); err != nil {
		t.Errorf("created_at %q is not RFC 3339: %v", v.CreatedAt, err)
	}

	// standard = cow over one sparse file in the volume's top image.
	img := n.TopImage(admin, v.ID)
	f := n.DataFile(admin, v.ID)
	if want := filepath.Join(n.ImageDir(img), "data.img"); f != want {
		t.Errorf("the file layer of a standard volume is %s, want %s", f, want)
	}
	if got := fileSize(t, f); got != 64*GiB {
		t.Errorf("%s: apparent size %d, want %d", f, got, 64*GiB)
	}
	if a := allocatedTree(t, n.ImageDir(img)) + allocatedTree(t, n.VolumeDir(v.ID)); a > 1*MiB {
		t.Errorf("%d bytes allocated for an empty 64 GiB volume; want sparse files", a)
	}

	// show by id and by name; list.
	for _, ref := range []string{v.ID, "big"} {
		r := admin.OK(nil, "volume", "show", ref)
		requireKeys(t, "volume show output", []byte(r.Stdout),
			"id", "name", "size_bytes", "status", "type", "owner", "multiattach", "source_snapshot", "created_at", "attachments")
		var got Volume
		json.Unmarshal([]byte(r.Stdout), &got)
		if got.ID != v.ID || got.SizeBytes != v.SizeBytes || got.CreatedAt != v.CreatedAt {
			t.Errorf("volume show %s = %+v, want %+v", ref, got, v)
		}
	}
	small := admin.CreateVolume("--size", "512MiB", "--multiattach")
	if small.Name != "" || !small.Multiattach || small.SizeBytes != 512*MiB {
		t.Errorf("unnamed multiattach volume: %+v", small)
	}
	list := admin.OK(nil, "volume", "list")
	var raw []json.RawMessage
	if err := json.Unmarshal([]byte(list.Stdout), &raw); err != nil {
		t.Fatalf("volume list is not a JSON array: %v: %s", err, list.Stdout)
	}
	if len(raw) != 2 {
		t.Fatalf("volume list has %d entries, want 2: %s", len(raw), list.Stdout)
	}
	for _, e := range raw {
		requireKeys(t, "volume list entry", e,
			"id", "name", "size_bytes", "status", "type", "owner", "multiattach", "source_snapshot", "created_at", "attachments")
	}
	if vs := admin.Volumes(); vs[0].ID != v.ID || vs[1].ID != small.ID {
		t.Errorf("volume list order: %s, %s; want oldest first %s, %s", vs[0].ID, vs[1].ID, v.ID, small.ID)
	}

	// Sizes in every accepted syntax.
	for _, c := range []struct {
		in   string
		want int64
	}{{"10G", 10 * GiB}, {"0.125TiB", 128 * GiB}, {"1048576", MiB}, {"1.5GiB", 3 * GiB / 2}, {"512MiB", 512 * MiB}} {
		got := admin.CreateVolume("--size", c.in)
		if got.SizeBytes != c.want {
			t.Errorf("--size %s made %d bytes, want %d", c.in, got.SizeBytes, c.want)
		}
		if fs := fileSize(t, n.DataFile(admin, got.ID)); fs != c.want {
			t.Errorf("--size %s: file is %d bytes, want %d", c.in, fs, c.want)
		}
		admin.OK(nil, "volume", "delete", got.ID)
	}

	// extend by name: size and file grow, data stays sparse.
	var ext Volume
	admin.OK(&ext, "volume", "extend", "big", "--size", "100GiB")
	if ext.SizeBytes != 100*GiB || ext.Status != "available" {
		t.Errorf("extended volume: %+v", ext)
	}
	if got := admin.Volume(v.ID); got.SizeBytes != 100*GiB {
		t.Errorf("volume show after extend: size %d", got.SizeBytes)
	}
	if got := fileSize(t, f); got != 100*GiB {
		t.Errorf("%s after extend: %d bytes, want %d", f, got, 100*GiB)
	}
	if a := allocatedTree(t, n.ImageDir(img)); a > 1*MiB {
		t.Errorf("%s: extend allocated %d bytes", n.ImageDir(img), a)
	}

	// delete: record, volume directory and image gone, name free again.
	admin.OK(nil, "volume", "delete", v.ID)
	if exists(n.VolumeDir(v.ID)) || slices.Contains(n.WaitImages(10*time.Second, imageGone(img)), img) {
		t.Errorf("%s or %s still exists after delete", n.VolumeDir(v.ID), n.ImageDir(img))
	}
	admin.Fail("NotFound", "volume", "show", v.ID)
	admin.Fail("NotFound", "volume", "show", "big")
	if vs := admin.Volumes(); len(vs) != 1 || vs[0].ID != small.ID {
		t.Errorf("volume list after delete: %+v", vs)
	}
	again := admin.CreateVolume("--size", "1GiB", "--name", "big")
	if again.ID == v.ID {
		t.Errorf("re-created volume reuses the deleted id")
	}
	againImg := n.TopImage(admin, "big")
	admin.OK(nil, "volume", "delete", "big") // delete by name works too
	if exists(n.VolumeDir(again.ID)) || slices.Contains(n.WaitImages(10*time.Second, imageGone(againImg)), againImg) {
		t.Errorf("volume deleted by name left its directory or image")
	}
	if st := admin.Status(); st.Store.ProvisionedBytes != small.SizeBytes {
		t.Errorf("provisioned_bytes = %d after deletes, want %d (only the 512MiB volume is left)", st.Store.ProvisionedBytes, small.SizeBytes)
	}
}

// TestVolumeIdempotency: repeating a create with the same client token
// returns the first volume and provisions nothing more.
func TestVolumeIdempotency(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	a := admin.CreateVolume("--size", "1GiB", "--name", "tok", "--client-token", "T-123")
	b := admin.CreateVolume("--size", "1GiB", "--name", "tok", "--client-token", "T-123")
	if a.ID != b.ID {
		t.Fatalf("same client token gave two volumes: %s and %s", a.ID, b.ID)
	}
	if vs := admin.Volumes(); len(vs) != 1 {
		t.Errorf("volume list has %d volumes after an idempotent retry, want 1", len(vs))
	}
	if st := admin.Status(); st.Store.ProvisionedBytes != GiB {
		t.Errorf("provisioned_bytes %d after an idempotent retry, want %d", st.Store.ProvisionedBytes, GiB)
	}
	// Another token is another volume; tokens are per user.
	c := admin.CreateVolume("--size", "1GiB", "--client-token", "T-456")
	if c.ID == a.ID {
		t.Errorf("different tokens gave the same volume")
	}
	alice := admin.CreateUser("alice")
	d := alice.CreateVolume("--size", "1GiB", "--client-token", "T-123")
	if d.ID == a.ID {
		t.Errorf("alice's create with admin's token returned admin's volume %s", a.ID)
	}
	// Snapshots take tokens too.
	s1 := admin.CreateSnapshot(a.ID, "--client-token", "S-1")
	s2 := admin.CreateSnapshot(a.ID, "--client-token", "S-1")
	if s1.ID != s2.ID {
		t.Errorf("same snapshot client token gave %s and %s", s1.ID, s2.ID)
	}
	admin.Fail("InvalidRequest", "volume", "create", "--size", "1GiB", "--client-token", "bad token!")
	// Deleting the volume frees its token: the same create makes a new one.
	admin.OK(nil, "snapshot", "delete", s1.ID)
	admin.OK(nil, "volume", "delete", a.ID)
	e := admin.CreateVolume("--size", "1GiB", "--name", "tok", "--client-token", "T-123")
	if e.ID == a.ID {
		t.Errorf("a create with the token of a deleted volume returned the deleted volume")
	}
}

// TestIdempotencyParameterMismatch: a client token reused with different
// parameters is refused (409 IdempotentParameterMismatch), never answered
// with the first volume as if the request had been the same.
func TestIdempotencyParameterMismatch(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	a := admin.CreateVolume("--size", "1GiB", "--name", "tok", "--client-token", "T")
	vol := admin.CreateVolume("--size", "64MiB", "--name", "other")
	admin.CreateSnapshot("tok", "--client-token", "S")
	before := admin.OK(nil, "volume", "list").Stdout

	cases := []struct {
		name string
		args []string
	}{
		{"other name", []string{"volume", "create", "--size", "1GiB", "--name", "tok2", "--client-token", "T"}},
		{"multiattach", []string{"volume", "create", "--size", "1GiB", "--name", "tok", "--multiattach", "--client-token", "T"}},
		{"other size (2 GiB instead of 1 GiB)", []string{"volume", "create", "--size", "2GiB", "--name", "tok", "--client-token", "T"}},
		{"other size (1 GiB + 512 bytes)", []string{"volume", "create", "--size", sz(GiB + 512), "--name", "tok", "--client-token", "T"}},
		{"snapshot of another volume", []string{"snapshot", "create", vol.ID, "--client-token", "S"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cl := n.Admin()
			cl.t = t
			cl.Fail("IdempotentParameterMismatch", c.args...)
		})
	}
	if got := admin.Volume(a.ID); got.SizeBytes != GiB {
		t.Errorf("the token's volume changed: %+v", got)
	}
	if after := admin.OK(nil, "volume", "list").Stdout; after != before {
		t.Errorf("refused requests changed the volume list:\nbefore: %s\nafter:  %s", before, after)
	}
}

// TestConcurrentCreates: racing creates are serialised by the metadata
// transactions: one name, one winner; one token, one volume; the
// provisioning limit holds under concurrency.
func TestConcurrentCreates(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	const racers = 6
	race := func(args ...string) []Result {
		out := make([]Result, racers)
		var wg sync.WaitGroup
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out[i] = admin.Run(args...)
			}()
		}
		wg.Wait()
		return out
	}

	// Same name: exactly one succeeds, the others get NameConflict.
	wins := 0
	for _, r := range race("volume", "create", "--size", "1GiB", "--name", "race") {
		switch {
		case r.Code == 0:
			wins++
		case !strings.Contains(r.Stdout, `"NameConflict"`):
			t.Errorf("racing create with one name: %s", r)
		}
	}
	if wins != 1 {
		t.Errorf("%d racing creates of the name \"race\" succeeded, want 1", wins)
	}

	// Same token (same parameters): every caller gets the same volume.
	ids := map[string]bool{}
	for _, r := range race("volume", "create", "--size", "1GiB", "--client-token", "race-token") {
		var v Volume
		if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &v) != nil {
			t.Errorf("racing create with one token: %s", r)
			continue
		}
		ids[v.ID] = true
	}
	if len(ids) != 1 {
		t.Errorf("racing creates with one client token made %d volumes: %v", len(ids), ids)
	}
	if vs := admin.Volumes(); len(vs) != 2 {
		t.Errorf("%d volumes after the races, want 2", len(vs))
	}
	if st := admin.Status(); st.Store.ProvisionedBytes != 2*GiB {
		t.Errorf("provisioned_bytes %d after the races, want %d", st.Store.ProvisionedBytes, 2*GiB)
	}

	// Capacity: volumes of a third of what is left; at most 3 fit.
	st := admin.Status()
	third := roundDown512((st.Store.LimitBytes - st.Store.ProvisionedBytes) / 3)
	wins = 0
	for _, r := range race("volume", "create", "--size", sz(third)) {
		switch {
		case r.Code == 0:
			wins++
		case !strings.Contains(r.Stdout, `"InsufficientCapacity"`):
			t.Errorf("racing create near the limit: %s", r)
		}
	}
	if wins != 3 {
		t.Errorf("%d racing creates of a third of the free capacity succeeded, want exactly 3", wins)
	}
	if st := admin.Status(); st.Store.ProvisionedBytes > st.Store.LimitBytes {
		t.Errorf("provisioned_bytes %d exceeds limit_bytes %d", st.Store.ProvisionedBytes, st.Store.LimitBytes)
	}
}
