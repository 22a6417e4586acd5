package cli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/basalt-storage/basalt/internal/api"
)

// TestExportBatchFailureKeepsDone: an `object export` of more objects
// than one request carries that fails at the request level after a first
// batch was exported prints that batch's results as its answer (-o json:
// the list) and exits 1 with the error, so a script learns which objects
// were exported. Before, the answer was dropped: stdout said nothing of
// the hundred objects exported.
func TestExportBatchFailureKeepsDone(t *testing.T) {
	var calls atomic.Int32
	ep, id := fakeAPI(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if calls.Add(1) > 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorDetail{Code: "MetadataUnavailable", Message: "no quorum"}})
			return
		}
		var req api.ObjectsRequest
		json.NewDecoder(r.Body).Decode(&req)
		out := make([]api.ObjectResult, 0, len(req.Objects))
		for _, o := range req.Objects {
			n := int64(1)
			out = append(out, api.ObjectResult{Bucket: o.Bucket, Key: o.Key, ETag: "e", Size: &n})
		}
		json.NewEncoder(w).Encode(out)
	}))
	root := t.TempDir()
	dir := filepath.Join(root, "b")
	os.Mkdir(dir, 0o755)
	for i := range objectBatch + 20 {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d", i)), []byte("x"), 0o644)
	}
	r := run(ep, id, "-o", "json", "object", "export", "--root", root, "-r", dir)
	if r.code != 1 || !strings.Contains(r.stderr, "(MetadataUnavailable)") {
		t.Fatalf("export whose second batch failed: %+v; want exit 1 with the server's error", r)
	}
	var done []api.ObjectResult
	if err := json.Unmarshal([]byte(r.stdout), &done); err != nil || len(done) != objectBatch {
		t.Fatalf("stdout: %d results (%v), want the first batch's %d as one JSON list: %q", len(done), err, objectBatch, r.stdout)
	}
	if !strings.Contains(r.stderr, fmt.Sprintf("exported %d of %d objects", objectBatch, objectBatch+20)) {
		t.Errorf("stderr does not say how far it got: %q", r.stderr)
	}
}
