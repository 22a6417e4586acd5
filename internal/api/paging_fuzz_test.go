package api

import (
	"errors"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// item is a list item that is its own position.
type item meta.Position

func (i item) Position() meta.Position { return meta.Position(i) }

// FuzzParseToken: a page token either does not parse or names a
// position (an id, a time) that renders back to a token naming the same
// position; and every position's token parses back to it.
func FuzzParseToken(f *testing.F) {
	f.Add("", int64(0), "vol-0123456789abcdef")
	f.Add("bW9v", int64(-1), "a.b")
	f.Add(pageToken(meta.Position{Created: time.Unix(1700000000, 5).UTC(), ID: "snap-0123456789abcdef"}), int64(1)<<62, "x")
	f.Add("MTcwMC4", int64(-1)<<63, "\x00\xff")
	f.Add("KzEuYQ", int64(1), ".")     // "+1.a"
	f.Add("MS4", int64(1), "att-0")    // "1." (no id)
	f.Add("LjE", int64(1), "vol-1")    // ".1" (no time)
	f.Add("MQ==", int64(1), "padding") // padded base64
	f.Fuzz(func(t *testing.T, s string, ns int64, id string) {
		if p, ok := parseToken(s); ok {
			if p.ID == "" {
				t.Fatalf("%q: a position without an id", s)
			}
			q, ok := parseToken(pageToken(p))
			if !ok || !q.Created.Equal(p.Created) || q.ID != p.ID {
				t.Fatalf("%q: %v renders as %q, which parses to %v %v", s, p, pageToken(p), q, ok)
			}
		}
		if id == "" {
			return
		}
		p := meta.Position{Created: time.Unix(0, ns).UTC(), ID: id}
		q, ok := parseToken(pageToken(p))
		if !ok || !q.Created.Equal(p.Created) || q.ID != p.ID {
			t.Fatalf("%v: token %q parses to %v %v", p, pageToken(p), q, ok)
		}
	})
}

// FuzzPage: whatever ?limit and ?after hold, page answers InvalidRequest
// or a run of the list, in order, of at most limit items that follow
// after's position; and a Link header exactly when items are left out
// at the end, whose after names the last item answered.
func FuzzPage(f *testing.F) {
	f.Add("", "", uint8(5))
	f.Add("2", "", uint8(5))
	f.Add("1000", "", uint8(0))
	f.Add("1001", "", uint8(3))
	f.Add("0", "", uint8(3))
	f.Add("-1", "", uint8(3))
	f.Add("+2", "", uint8(3))
	f.Add("2", pageToken(meta.Position{Created: time.Unix(0, 2).UTC(), ID: "i2"}), uint8(6))
	f.Add("", "nope", uint8(2))
	f.Add("99999999999999999999", "", uint8(2))
	f.Fuzz(func(t *testing.T, limit, after string, n uint8) {
		var list []item
		for i := range int(n) {
			list = append(list, item{Created: time.Unix(0, int64(i/2)).UTC(), ID: "i" + strconv.Itoa(i)})
		}
		q := url.Values{}
		if limit != "" {
			q.Set("limit", limit)
		}
		if after != "" {
			q.Set("after", after)
		}
		w := httptest.NewRecorder()
		r := httptest.NewRequest("GET", "/v1/volumes?"+q.Encode(), nil)
		got, err := page(w, r, list)
		if err != nil {
			var e *errs.Error
			if !errors.As(err, &e) || e.Code != errs.CodeInvalidRequest || e.Kind != errs.KindInvalid {
				t.Fatalf("limit %q after %q: %v, want InvalidRequest", limit, after, err)
			}
			return
		}
		start := 0
		if a, ok := parseToken(after); after != "" {
			if !ok {
				t.Fatalf("after %q is no token, yet it was taken", after)
			}
			for start < len(list) && !a.Before(list[start].Position()) {
				start++
			}
		}
		rest := list[start:]
		if len(got) > len(rest) || (len(got) > 0 && got[0] != rest[0]) {
			t.Fatalf("limit %q after %q: %d items from %v, want a run from item %d", limit, after, len(got), got, start)
		}
		for i := range got {
			if got[i] != rest[i] {
				t.Fatalf("limit %q after %q: item %d is %v, want %v", limit, after, i, got[i], rest[i])
			}
		}
		if l, err := strconv.Atoi(limit); limit != "" && (err != nil || len(got) > l) {
			t.Fatalf("limit %q: %d items", limit, len(got))
		}
		link := w.Header().Get("Link")
		if (link != "") != (len(got) < len(rest)) {
			t.Fatalf("limit %q after %q: %d of %d items, Link %q", limit, after, len(got), len(rest), link)
		}
		if link == "" {
			return
		}
		m := regexp.MustCompile(`^</v1/volumes\?([^>]*)>; rel="next"$`).FindStringSubmatch(link)
		if m == nil {
			t.Fatalf("Link %q", link)
		}
		next, err := url.ParseQuery(m[1])
		if err != nil || next.Get("limit") != limit {
			t.Fatalf("Link %q: %v, limit %q", link, err, next.Get("limit"))
		}
		if p, ok := parseToken(next.Get("after")); !ok || p != got[len(got)-1].Position() {
			t.Fatalf("Link %q: after names %v %v, want %v", link, p, ok, got[len(got)-1])
		}
	})
}
