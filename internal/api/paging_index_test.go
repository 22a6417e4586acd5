package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/cluster"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/meta/metatest"
	"github.com/basalt-storage/basalt/internal/store"
	"github.com/basalt-storage/basalt/internal/user"
	"github.com/basalt-storage/basalt/internal/volume"
)

// countedNodeEnv is newNodeEnv on a metadata connection of its own, whose
// reads are counted.
func countedNodeEnv(t *testing.T) (*nodeEnv, *metatest.Reads) {
	t.Helper()
	e := metatest.Shared(t)
	m := e.Connect(t)
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	node := uniq("node")
	vs := volume.New(m, st, volume.Config{Node: node, ImageGrace: -1}, log)
	t.Cleanup(vs.Stop)
	if err := vs.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	us := user.New(m, e.CA)
	s := New(Deps{Volumes: vs, Users: us, Log: log, Cluster: cluster.New(m, e.CA, node, log),
		NBDURI: func(_ context.Context, a *meta.Attachment) string { return "nbd://127.0.0.1:10809/" + a.Export }})
	s.SetReady(true)
	return &nodeEnv{t: t, s: s, us: us, meta: m, node: node}, metatest.CountReads(m)
}

func randID(prefix string) string {
	b := make([]byte, 8)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// TestPagingReadsThePage: a user's list is paged through the owned index
// — the pages, their Link headers and tokens are those of the whole list
// cut — and a page of 2 reads 3 volume records (one more tells whether a
// next page follows), not the 300 others' in the cluster; showing an
// attached volume reads its attachments, not the others' 300.
func TestPagingReadsThePage(t *testing.T) {
	e, reads := countedNodeEnv(t)
	_, alice := e.user("alice", false)
	ctx := context.Background()
	var crowd []*meta.Attachment
	var crowdVols []string
	t.Cleanup(func() {
		for i := range crowd {
			e.meta.Update(ctx, func(tx *meta.Tx) error {
				tx.DeleteAttachment(crowd[i])
				tx.DeleteVolume(crowdVols[i])
				return nil
			})
		}
	})
	for range 3 {
		if err := e.meta.Update(ctx, func(tx *meta.Tx) error {
			for range 100 {
				owner := uniq("crowd")
				v := &meta.Volume{ID: randID("vol-"), OwnerID: owner, Status: meta.StatusInUse, CreatedAt: time.Now().UTC()}
				a := &meta.Attachment{ID: randID("att-"), VolumeID: v.ID, OwnerID: owner, Host: "h", Mode: meta.ModeRO, Export: randID("x"), CreatedAt: v.CreatedAt}
				v.Attachments = []string{a.ID}
				tx.PutVolume(v)
				tx.PutAttachment(a)
				crowd, crowdVols = append(crowd, a), append(crowdVols, v.ID)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		if st, _, out := e.do(alice, "POST", "/v1/volumes", fmt.Sprintf(`{"size":"1MiB","name":"i%d"}`, i)); st != 201 {
			t.Fatalf("create: %d %s", st, out)
		}
	}
	if st, _, out := e.do(alice, "POST", "/v1/attachments", `{"volume":"i3","host":"h1"}`); st != 201 {
		t.Fatalf("attach: %d %s", st, out)
	}
	var all []Volume
	if st, next := e.get(alice, "/v1/volumes", &all); st != 200 || next != "" || len(all) != 5 {
		t.Fatalf("whole list: %d, %d volumes, next %q", st, len(all), next)
	}
	// The pages the whole list cut by 2 gives: its items and tokens.
	var want [][]string
	var wantNext []string
	for i := 0; i < len(all); i += 2 {
		var ids []string
		for _, v := range all[i:min(i+2, len(all))] {
			ids = append(ids, v.ID)
		}
		want = append(want, ids)
		if i+2 < len(all) {
			wantNext = append(wantNext, "/v1/volumes?after="+pageToken(meta.Position{Created: all[i+1].CreatedAt, ID: all[i+1].ID})+"&limit=2")
		}
	}
	reads.Reset()
	target := "/v1/volumes?limit=2"
	var got [][]string
	var gotNext []string
	for target != "" {
		var p []Volume
		st, next := e.get(alice, target, &p)
		if st != 200 {
			t.Fatalf("GET %s: %d", target, st)
		}
		if n := reads.Count(meta.Prefix + "volumes/"); n > 3 {
			t.Errorf("GET %s read %d volume records, want at most 3", target, n)
		}
		if n := reads.Count(meta.Prefix + "attachments/"); n > 1 {
			t.Errorf("GET %s read %d attachment records, want at most 1", target, n)
		}
		reads.Reset()
		var ids []string
		for _, v := range p {
			ids = append(ids, v.ID)
			if v.Name == "i3" && len(v.Attachments) != 1 {
				t.Errorf("volume i3 in a page: attachments %+v", v.Attachments)
			}
		}
		got = append(got, ids)
		if next != "" {
			gotNext = append(gotNext, next)
		}
		target = next
	}
	if !slices.EqualFunc(got, want, slices.Equal) || !slices.Equal(gotNext, wantNext) {
		t.Errorf("pages %v, next %v; want %v, next %v", got, gotNext, want, wantNext)
	}

	// Showing the attached volume reads its attachment alone.
	var v Volume
	if st, _ := e.get(alice, "/v1/volumes/i3", &v); st != 200 || len(v.Attachments) != 1 {
		t.Fatalf("show i3: %d, %+v", st, v)
	}
	if n := reads.Count(meta.Prefix + "attachments/"); n != 1 {
		t.Errorf("showing a volume with one attachment read %d attachment records, want 1", n)
	}
	reads.Reset()
	var as []Attachment
	if st, next := e.get(alice, "/v1/attachments?limit=1", &as); st != 200 || len(as) != 1 || next != "" {
		t.Fatalf("attachments: %d, %d, next %q", st, len(as), next)
	}
	if n := reads.Count(meta.Prefix + "attachments/"); n != 1 {
		t.Errorf("alice's attachment list read %d attachment records, want 1", n)
	}
	if st, _, out := e.do(alice, "DELETE", "/v1/attachments/"+as[0].ID, ""); st != 204 {
		t.Fatalf("detach: %d %s", st, out)
	}
	for _, v := range all {
		if st, _, out := e.do(alice, "DELETE", "/v1/volumes/"+v.ID, ""); st != 202 && st != 204 {
			t.Fatalf("delete: %d %s", st, out)
		}
	}
}
