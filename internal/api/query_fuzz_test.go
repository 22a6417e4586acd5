package api

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/volume"
)

// FuzzCheckQuery: a query string reaches the handler only when it
// parses, names only parameters the route takes and each at most once;
// anything else is InvalidRequest. The object endpoints' booleans
// (queryBool) are true, false or InvalidRequest.
func FuzzCheckQuery(f *testing.F) {
	for _, s := range []string{"", "volume=db", "volume=a&volume=b", "volumes=db", "volume=%zz", "limit=2&after=x",
		"volume=db;limit=1", "&&", "=", "volume", "volume=&limit=", "a=1&a=2", "content=true", "content=TRUE",
		"content=1", "content=yes", "all=", "all=f"} {
		f.Add(s)
	}
	names := []string{"volume", "limit", "after", "content", "all"}
	f.Fuzz(func(t *testing.T, raw string) {
		reached := false
		h := checkQuery(func(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
			reached = true
			return nil
		}, names)
		r := httptest.NewRequest("GET", "/v1/attachments", nil)
		r.URL.RawQuery = raw
		err := h(httptest.NewRecorder(), r, volume.Caller{})
		q, perr := url.ParseQuery(raw)
		ok := perr == nil
		for name, vs := range q {
			ok = ok && slices.Contains(names, name) && len(vs) == 1
		}
		if reached != ok {
			t.Fatalf("%q: handler reached %v, want %v (%v)", raw, reached, ok, err)
		}
		if !ok {
			var e *errs.Error
			if !errors.As(err, &e) || e.Code != errs.CodeInvalidRequest || e.Kind != errs.KindInvalid {
				t.Fatalf("%q: %v, want InvalidRequest", raw, err)
			}
			return
		}
		for _, name := range []string{"content", "all"} {
			b, err := queryBool(r, name)
			want, perr := strconv.ParseBool(q.Get(name))
			switch {
			case q.Get(name) == "":
				if err != nil || b {
					t.Fatalf("%q: %s absent: %v %v, want false", raw, name, b, err)
				}
			case perr != nil:
				if !errs.IsCode(err, errs.CodeInvalidRequest) {
					t.Fatalf("%q: %s: %v %v, want InvalidRequest", raw, name, b, err)
				}
			case err != nil || b != want:
				t.Fatalf("%q: %s: %v %v, want %v", raw, name, b, err, want)
			}
		}
	})
}
