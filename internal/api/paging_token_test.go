package api

import (
	"encoding/base64"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/meta"
)

// TestPageTokenAnyTime: a page token names its position exactly for every
// time a record can hold — the zero time of records that never set one
// and years past 2262 included, which the tokens of Unix nanoseconds
// could not (a zero-time record's token named a position in 1754, and the
// next page skipped every other zero-time record) — and a token of that
// older form, which a client paging through an upgrade may send, still
// parses.
func TestPageTokenAnyTime(t *testing.T) {
	for _, p := range []meta.Position{
		{Created: time.Time{}, ID: "vol-a"},
		{Created: time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC), ID: "vol-b"},
		{Created: time.Date(2024, 2, 29, 23, 59, 59, 999999999, time.UTC), ID: "snap-c"},
	} {
		got, ok := parseToken(pageToken(p))
		if !ok || !got.Created.Equal(p.Created) || got.ID != p.ID {
			t.Errorf("token of %v parses as %v (ok %v)", p, got, ok)
		}
	}
	old := base64.RawURLEncoding.EncodeToString([]byte("1700000000000000005.vol-d"))
	if got, ok := parseToken(old); !ok || !got.Created.Equal(time.Unix(0, 1700000000000000005)) || got.ID != "vol-d" {
		t.Errorf("a token of the older form parses as %v (ok %v)", got, ok)
	}
}
