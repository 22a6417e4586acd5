package e2e

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// exportRE: an export name is a long random string (the secret that grants
// access to the volume).
var exportRE = regexp.MustCompile(`^[A-Za-z0-9_-]{26,}$`)

// volumeAttachmentIDs returns the ids of the attachments `volume show` lists.
func volumeAttachmentIDs(t *testing.T, v Volume) []string {
	t.Helper()
	var ids []string
	for _, raw := range v.Attachments {
		var a Attachment
		if err := json.Unmarshal(raw, &a); err != nil {
			// A list of bare ids is acceptable too.
			var id string
			if err2 := json.Unmarshal(raw, &id); err2 != nil {
				t.Fatalf("volume %s: attachment entry %s is neither an attachment nor an id", v.ID, raw)
			}
			ids = append(ids, id)
			continue
		}
		ids = append(ids, a.ID)
	}
	return ids
}

// TestNBDAttachmentRules: attach/detach through the CLI — the attachment's
// shape, rw/ro exclusivity, multiattach, in-use volumes, ownership and export
// secrets.
func TestNBDAttachmentRules(t *testing.T) {
	t.Parallel()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	alice := admin.CreateUser("alice")
	bob := admin.CreateUser("bob")
	vol := alice.CreateVolume("--size", "64MiB", "--name", "disk")

	// attach rw: the full shape.
	r := alice.OK(nil, "attach", "disk", "--host", "hv1", "--mode", "rw")
	requireKeys(t, "attachment", []byte(r.Stdout), "id", "volume_id", "host", "mode", "status", "nbd_uri", "export", "created_at")
	var rw Attachment
	if err := json.Unmarshal([]byte(r.Stdout), &rw); err != nil {
		t.Fatalf("attach output: %v: %s", err, r)
	}
	if rw.VolumeID != vol.ID || rw.Host != "hv1" || rw.Mode != "rw" || rw.Status == "" {
		t.Errorf("attach rw printed %+v, want volume %s host hv1 mode rw and a status", rw, vol.ID)
	}
	if want := fmt.Sprintf("nbd://127.0.0.1:%d/%s", n.NBD, rw.Export); rw.NBDURI != want {
		t.Errorf("nbd_uri %q, want %q", rw.NBDURI, want)
	}
	if !exportRE.MatchString(rw.Export) {
		t.Errorf("export name %q is not a long random string", rw.Export)
	}
	if _, err := time.Parse(time.RFC3339, rw.CreatedAt); err != nil {
		t.Errorf("created_at %q is not RFC 3339: %v", rw.CreatedAt, err)
	}

	// The volume is in-use and lists the attachment; show and list agree.
	v := alice.Volume("disk")
	if v.Status != "in-use" {
		t.Errorf("attached volume is %q, want in-use", v.Status)
	}
	if ids := volumeAttachmentIDs(t, v); len(ids) != 1 || ids[0] != rw.ID {
		t.Errorf("volume show lists attachments %v, want [%s]", ids, rw.ID)
	}
	var shown Attachment
	alice.OK(&shown, "attachment", "show", rw.ID)
	if shown != rw {
		t.Errorf("attachment show = %+v, want %+v", shown, rw)
	}
	var listed []Attachment
	alice.OK(&listed, "attachment", "list", "--volume", "disk")
	if len(listed) != 1 || listed[0] != rw {
		t.Errorf("attachment list --volume disk = %+v, want [%+v]", listed, rw)
	}

	// One rw at a time: a second rw and any ro are refused, naming the holder.
	for _, mode := range []string{"rw", "ro"} {
		eb := alice.FailBody("AttachConflict", "attach", "disk", "--host", "hv2", "--mode", mode)
		if !strings.Contains(eb.Error.Message, "hv1") {
			t.Errorf("conflict message for a second %s attachment does not name the holder hv1: %q", mode, eb.Error.Message)
		}
	}
	// An in-use volume cannot be deleted.
	alice.Fail("VolumeInUse", "volume", "delete", "disk")

	// Another user sees nothing of it: NotFound, like a missing attachment.
	bob.Fail("NotFound", "attachment", "show", rw.ID)
	bob.Fail("NotFound", "detach", rw.ID)
	bob.Fail("NotFound", "attach", vol.ID, "--host", "evil", "--mode", "ro")
	var bobs []Attachment
	bob.OK(&bobs, "attachment", "list")
	if len(bobs) != 0 {
		t.Errorf("bob lists alice's attachments: %+v", bobs)
	}
	bob.Fail("NotFound", "attachment", "show", "att-0000000000000000")
	// Admin sees it.
	var adm Attachment
	admin.OK(&adm, "attachment", "show", rw.ID)
	if adm.ID != rw.ID {
		t.Errorf("admin's attachment show = %+v", adm)
	}

	// Detach: the volume is available again, the attachment gone.
	alice.Detach(rw.ID)
	if v := alice.Volume("disk"); v.Status != "available" || len(v.Attachments) != 0 {
		t.Errorf("after detach the volume is %q with attachments %s, want available and none", v.Status, v.Attachments)
	}
	alice.Fail("NotFound", "attachment", "show", rw.ID)
	alice.Fail("NotFound", "detach", rw.ID)

	// Several ro attachments while all are ro.
	exports := map[string]bool{rw.Export: true}
	var ros []Attachment
	for _, h := range []string{"hv1", "hv2", "hv3"} {
		a := alice.Attach("disk", h, "ro")
		if a.Mode != "ro" || a.Host != h {
			t.Errorf("attach ro to %s printed %+v", h, a)
		}
		if exports[a.Export] {
			t.Errorf("export name %q reused", a.Export)
		}
		if !exportRE.MatchString(a.Export) {
			t.Errorf("export name %q is not a long random string", a.Export)
		}
		exports[a.Export] = true
		ros = append(ros, a)
	}
	if ids := volumeAttachmentIDs(t, alice.Volume("disk")); len(ids) != 3 {
		t.Errorf("volume show lists %d attachments, want 3: %v", len(ids), ids)
	}
	// rw while ro attachments exist: refused, naming a holder.
	eb := alice.FailBody("AttachConflict", "attach", "disk", "--host", "hv9", "--mode", "rw")
	if !strings.Contains(eb.Error.Message, "hv1") && !strings.Contains(eb.Error.Message, "hv2") && !strings.Contains(eb.Error.Message, "hv3") {
		t.Errorf("conflict message does not name a holder: %q", eb.Error.Message)
	}
	// Detaching some keeps the volume in-use; the last one frees it.
	alice.Detach(ros[0].ID)
	alice.Detach(ros[1].ID)
	if v := alice.Volume("disk"); v.Status != "in-use" {
		t.Errorf("with one ro attachment left the volume is %q, want in-use", v.Status)
	}
	alice.Detach(ros[2].ID)
	if v := alice.Volume("disk"); v.Status != "available" {
		t.Errorf("after the last detach the volume is %q, want available", v.Status)
	}
	alice.OK(nil, "volume", "delete", "disk")

	// A multiattach volume takes several rw attachments (and ro ones).
	alice.CreateVolume("--size", "64MiB", "--name", "shared", "--multiattach")
	m1 := alice.Attach("shared", "node-a", "rw")
	m2 := alice.Attach("shared", "node-b", "rw")
	m3 := alice.Attach("shared", "node-c", "ro")
	for _, a := range []Attachment{m1, m2, m3} {
		if exports[a.Export] {
			t.Errorf("export name %q reused", a.Export)
		}
		exports[a.Export] = true
	}
	mv := alice.Volume("shared")
	if !mv.Multiattach || mv.Status != "in-use" || len(volumeAttachmentIDs(t, mv)) != 3 {
		t.Errorf("multiattach volume after three attachments: %+v", mv)
	}
	alice.Fail("VolumeInUse", "volume", "delete", "shared")
	for _, a := range []Attachment{m1, m2, m3} {
		alice.Detach(a.ID)
	}
	if v := alice.Volume("shared"); v.Status != "available" {
		t.Errorf("multiattach volume after detaching all is %q", v.Status)
	}

	// Bad requests.
	alice.CreateVolume("--size", "64MiB", "--name", "other")
	alice.Fail("InvalidRequest", "attach", "other", "--host", "hv1", "--mode", "rx")
	alice.Fail("NotFound", "attach", "nosuch", "--host", "hv1")

	// The export secrets never reach the server's log.
	for e := range exports {
		if strings.Contains(n.Log(), e) {
			t.Errorf("the server log contains export name %s (a secret, brief §9)", e)
		}
	}
}
