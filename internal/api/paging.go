package api

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
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

// position is where an item sits in a list's order.
type position struct {
	created time.Time
	id      string
}

func (p position) before(q position) bool {
	if !p.created.Equal(q.created) {
		return p.created.Before(q.created)
	}
	return p.id < q.id
}

// token renders p for ?after.
func (p position) token() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(p.created.UnixNano(), 10) + "." + p.id))
}

func parseToken(s string) (position, bool) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return position{}, false
	}
	ns, id, ok := strings.Cut(string(b), ".")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || id == "" {
		return position{}, false
	}
	return position{time.Unix(0, n).UTC(), id}, true
}

// page returns the items of list (in its order) that r's ?limit and
// ?after ask for, and sets w's Link header when more follow.
func page[T any](w http.ResponseWriter, r *http.Request, list []T, pos func(T) position) ([]T, error) {
	q := r.URL.Query()
	if a := q.Get("after"); a != "" {
		after, ok := parseToken(a)
		if !ok {
			return nil, errs.Invalid(errs.CodeInvalidRequest, "after=%q is not a page token: use the one in the Link header of the page before", a)
		}
		i := 0
		for i < len(list) && !after.before(pos(list[i])) {
			i++
		}
		list = list[i:]
	}
	l := q.Get("limit")
	if l == "" {
		return list, nil
	}
	n, err := strconv.Atoi(l)
	if err != nil || n < 1 || n > maxPageLimit {
		return nil, errs.Invalid(errs.CodeInvalidRequest, "limit=%q must be a whole number from 1 to %d", l, maxPageLimit)
	}
	if len(list) <= n {
		return list, nil
	}
	list = list[:n]
	next := url.Values{}
	for k, v := range q {
		next[k] = v
	}
	next.Set("after", pos(list[n-1]).token())
	w.Header().Set("Link", "<"+r.URL.Path+"?"+next.Encode()+`>; rel="next"`)
	return list, nil
}
