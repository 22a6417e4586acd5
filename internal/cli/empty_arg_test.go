package cli

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// TestEmptyArgument: an empty id or name on the command line (an unset
// variable: `basalt volume delete "$VOL"`) is the command line's mistake,
// said as a UsageError naming the argument before anything is sent. It
// used to go out as is: `volume show ""` asked for GET /v1/volumes/ and
// failed with `route "GET /v1/volumes/" not found (NotFound)`, `detach ""`
// likewise, and `snapshot create ""` was refused by the server as a
// request without a volume.
func TestEmptyArgument(t *testing.T) {
	var requests atomic.Int32
	ep, id := fakeAPI(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		http.NotFound(w, r)
	}))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"volume", "show", ""}, "ID_OR_NAME"},
		{[]string{"volume", "delete", ""}, "ID_OR_NAME"},
		{[]string{"volume", "extend", "", "--size", "2GiB"}, "ID_OR_NAME"},
		{[]string{"volume", "flatten", ""}, "ID_OR_NAME"},
		{[]string{"snapshot", "create", ""}, "VOLUME"},
		{[]string{"snapshot", "delete", ""}, "ID_OR_NAME"},
		{[]string{"attach", "", "--host", "h1"}, "VOLUME"},
		{[]string{"detach", ""}, "ATTACHMENT_ID"},
		{[]string{"attachment", "show", ""}, "ID"},
	} {
		r := run(ep, id, c.args...)
		if r.code != 1 || !strings.Contains(r.stderr, "(UsageError)") || !strings.Contains(r.stderr, "empty "+c.want) {
			t.Errorf("basalt %q: %+v; want a UsageError about the empty %s", c.args, r, c.want)
		}
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("%d requests sent for command lines with an empty argument", n)
	}
}
