package cli

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/api"
)

// TestDetachVolumeNameHint: `basalt detach VOLUME`, as an EBS user types
// it (detach-volume takes the volume), answered only `attachment "data"
// not found`. The error keeps the server's code and message and says
// that detach takes an attachment id, and where to find it.
func TestDetachVolumeNameHint(t *testing.T) {
	ep, id := fakeAPI(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		ref := strings.TrimPrefix(r.URL.Path, "/v1/attachments/")
		json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorDetail{Code: "NotFound", Message: "attachment \"" + ref + "\" not found"}})
	}))
	for _, args := range [][]string{{"detach", "data"}, {"attachment", "show", "data"}} {
		r := run(ep, id, args...)
		if r.code != 1 || !strings.Contains(r.stderr, `attachment "data" not found`) || !strings.Contains(r.stderr, "(NotFound)") ||
			!strings.Contains(r.stderr, "basalt attachment list --volume data") {
			t.Errorf("basalt %v: %+v; want NotFound, the server's message and how to find the attachment", args, r)
		}
	}
	// An attachment id that does not exist: the server's error alone.
	r := run(ep, id, "detach", "att-0000000000000001")
	if r.code != 1 || strings.Contains(r.stderr, "attachment list") {
		t.Errorf("basalt detach att-…: %+v; want the server's NotFound alone", r)
	}
}
