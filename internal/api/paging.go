package api

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// Paging of list answers. Lists are ordered oldest first, ties by id.
// With ?limit=N (1 to maxPageLimit) an answer holds at most N items and,
// when more follow, a Link header (RFC 8288) whose rel="next" URL asks
// for them: the same query with ?after=TOKEN, a token naming the last
// item answered by its creation time and id. A page continues after that
// position even if the item was deleted meanwhile, so paging a list being
// changed skips nothing that existed throughout and repeats nothing.
// Without limit the whole list is answered, as before paging existed.

// maxPageLimit bounds one page.
const maxPageLimit = 1000

// pageParams are the query parameters of paged lists.
var pageParams = []string{"limit", "after"}

// token renders p for ?after.
func pageToken(p meta.Position) string {
	return base64.RawURLEncoding.EncodeToString([]byte(p.Key()))
}

// parseToken parses a token pageToken made, or one of the form before it
// (Unix nanoseconds, ".", the id: it held times from 1678 to 2262 only),
// which a client paging through an upgrade may still send.
func parseToken(s string) (meta.Position, bool) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return meta.Position{}, false
	}
	if p, ok := meta.ParsePosition(string(b)); ok {
		return p, true
	}
	ns, id, ok := strings.Cut(string(b), ".")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || id == "" {
		return meta.Position{}, false
	}
	return meta.Position{Created: time.Unix(0, n).UTC(), ID: id}, true
}

// parsePageParams parses ?after (nil: none) and ?limit (0: none). Given
// empty (?limit=, a script's "?limit=$N&after=$NEXT" with a variable
// unset) they are refused, as an empty ?volume= is (volumeFilter): read
// as left out, an empty limit answered the whole list, however long, and
// an empty after the first page again — a paging loop whose token went
// missing started over, for ever.
func parsePageParams(q url.Values) (*meta.Position, int, error) {
	for _, name := range pageParams {
		if q.Has(name) && q.Get(name) == "" {
			return nil, 0, errs.Invalid(errs.CodeInvalidRequest, "query parameter %s is empty: give it a value, or leave it out", name)
		}
	}
	var after *meta.Position
	if a := q.Get("after"); a != "" {
		p, ok := parseToken(a)
		if !ok {
			return nil, 0, errs.Invalid(errs.CodeInvalidRequest, "after=%q is not a page token: use the one in the Link header of the page before", a)
		}
		after = &p
	}
	l := q.Get("limit")
	if l == "" {
		return after, 0, nil
	}
	n, err := strconv.Atoi(l)
	if err != nil || n < 1 || n > maxPageLimit {
		return nil, 0, errs.Invalid(errs.CodeInvalidRequest, "limit=%q must be a whole number from 1 to %d", l, maxPageLimit)
	}
	return after, n, nil
}

// wanted is what to ask the service for to answer r: the items after
// ?after, one more than ?limit — so that page sees whether more follow —
// and so a page costs its limit in reads, not the whole list. Parameters
// page refuses ask for one item: the list's own errors (a volume filter
// not found) come first, as they did when page cut whole lists.
func wanted(r *http.Request) meta.Page {
	after, n, err := parsePageParams(r.URL.Query())
	if err != nil {
		return meta.Page{Limit: 1}
	}
	p := meta.Page{After: after}
	if n > 0 {
		p.Limit = n + 1
	}
	return p
}

// page returns the items of list (in its order) that r's ?limit and
// ?after ask for, and sets w's Link header when more follow. list may
// hold only what wanted(r) asked for.
func page[T interface{ Position() meta.Position }](w http.ResponseWriter, r *http.Request, list []T) ([]T, error) {
	q := r.URL.Query()
	after, n, err := parsePageParams(q)
	if err != nil {
		return nil, err
	}
	if after != nil {
		i := 0
		for i < len(list) && !after.Before(list[i].Position()) {
			i++
		}
		list = list[i:]
	}
	if n == 0 || len(list) <= n {
		return list, nil
	}
	list = list[:n]
	next := url.Values{}
	for k, v := range q {
		next[k] = v
	}
	next.Set("after", pageToken(list[n-1].Position()))
	w.Header().Set("Link", "<"+r.URL.Path+"?"+next.Encode()+`>; rel="next"`)
	return list, nil
}
