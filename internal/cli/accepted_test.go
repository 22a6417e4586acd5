package cli

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/basalt-storage/basalt/internal/api"
)

// Tests of the 202 answers of calls that are synchronous by contract:
// an extend or a snapshot handed on to the volume's writer, another node,
// that had not finished when the call stopped waiting for it. The CLI
// printed the volume still `extending` (the snapshot still `creating`) and
// exited 0, which a script reads as done: it went on to grow the file
// system on a volume that still had its old size.

const (
	oldSize = 1 << 30
	newSize = 2 << 30
)

// extendAPI is a fake API whose extend of volume "v" answers 202 (the
// volume still extending), then polls show it extending twice more and
// then at rest as final says.
func extendAPI(t *testing.T, final api.Volume) (endpoint, identity string, polls *atomic.Int32) {
	polls = new(atomic.Int32)
	endpoint, identity = fakeAPI(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := api.Volume{ID: "vol-0000000000000001", Name: "v", SizeBytes: oldSize, Status: "extending", Type: "standard"}
		status := http.StatusOK
		switch {
		case r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/extend"):
			status = http.StatusAccepted
		case r.Method == "GET" && polls.Add(1) > 2:
			v = final
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(v)
	}))
	return endpoint, identity, polls
}

// TestExtendAcceptedWaits: after a 202, `volume extend` waits until the
// volume is extended, and prints it at its new size.
func TestExtendAcceptedWaits(t *testing.T) {
	done := api.Volume{ID: "vol-0000000000000001", Name: "v", SizeBytes: newSize, Status: "available", Type: "standard"}
	ep, id, polls := extendAPI(t, done)
	r := run(ep, id, "-o", "json", "volume", "extend", "v", "--size", "2GiB")
	var v api.Volume
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &v) != nil {
		t.Fatalf("volume extend answered 202: %+v", r)
	}
	if v.Status != "available" || v.SizeBytes != newSize || polls.Load() < 3 {
		t.Errorf("volume extend answered 202 printed %+v after %d polls; want the volume at its new size", v, polls.Load())
	}
	if !strings.Contains(r.stderr, "waiting") {
		t.Errorf("volume extend waited without saying so: %q", r.stderr)
	}
}

// TestExtendAcceptedFails: an extend that fails on the writer after the
// 202 (the volume back at rest at its old size) fails the command, with
// the reason the volume records.
func TestExtendAcceptedFails(t *testing.T) {
	failed := api.Volume{ID: "vol-0000000000000001", Name: "v", SizeBytes: oldSize, Status: "available", Type: "standard",
		StatusMessage: "extend to 2147483648 bytes failed: no space left on device"}
	ep, id, _ := extendAPI(t, failed)
	r := run(ep, id, "volume", "extend", "v", "--size", "2GiB")
	if r.code != 1 || !strings.Contains(r.stderr, "(JobFailed)") || !strings.Contains(r.stderr, "no space left on device") {
		t.Errorf("volume extend failing after its 202: %+v; want exit 1, JobFailed with the volume's status message", r)
	}
}

// TestExtendAcceptedNoWait: --wait=false returns at once after a 202,
// exit 0, and says that the extend goes on and how to follow it.
func TestExtendAcceptedNoWait(t *testing.T) {
	ep, id, polls := extendAPI(t, api.Volume{})
	r := run(ep, id, "volume", "extend", "v", "--size", "2GiB", "--wait=false")
	if r.code != 0 || polls.Load() != 0 {
		t.Fatalf("volume extend --wait=false: %+v after %d polls", r, polls.Load())
	}
	if !strings.Contains(r.stderr, "basalt volume show vol-0000000000000001") {
		t.Errorf("volume extend --wait=false answered 202 does not say how to follow the extend: %q", r.stderr)
	}
}

// TestSnapshotAcceptedWaits: after a 202 (the snapshot still creating),
// `snapshot create` waits until the snapshot is available; and fails if
// the snapshot ends in error.
func TestSnapshotAcceptedWaits(t *testing.T) {
	for _, final := range []string{"available", "error"} {
		polls := new(atomic.Int32)
		ep, id := fakeAPI(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			sn := api.Snapshot{ID: "snap-0000000000000001", VolumeID: "vol-0000000000000001", SizeBytes: oldSize, Status: "creating"}
			status := http.StatusOK
			switch {
			case r.Method == "POST":
				status = http.StatusAccepted
			case polls.Add(1) > 2:
				sn.Status = final
				if final == "error" {
					sn.StatusMessage = "the volume's writer changed"
				}
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			json.NewEncoder(w).Encode(sn)
		}))
		r := run(ep, id, "-o", "json", "snapshot", "create", "v")
		if final == "error" {
			if r.code != 1 || !strings.Contains(r.stderr, "(JobFailed)") || !strings.Contains(r.stderr, "the volume's writer changed") {
				t.Errorf("snapshot create ending in error after its 202: %+v; want exit 1, JobFailed with the reason", r)
			}
			continue
		}
		var sn api.Snapshot
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &sn) != nil || sn.Status != "available" {
			t.Errorf("snapshot create answered 202: %+v; want the snapshot available", r)
		}
	}
}

// TestJobHintWithoutWait: a job started without --wait runs on; the
// command says how to follow it (as --wait=false of an extend does).
func TestJobHintWithoutWait(t *testing.T) {
	ep, id := fakeAPI(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		json.NewEncoder(w).Encode(api.Volume{ID: "vol-0000000000000001", Status: "available",
			Progress: &api.Progress{Job: "scrub"}})
	}))
	r := run(ep, id, "volume", "scrub", "v")
	if r.code != 0 || !strings.Contains(r.stderr, "basalt volume show vol-0000000000000001") || !strings.Contains(r.stderr, "--wait") {
		t.Errorf("volume scrub without --wait: %+v; want a hint on stderr to follow the job", r)
	}
}
