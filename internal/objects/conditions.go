package objects

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/versity/versitygw/backend"
	"github.com/versity/versitygw/s3err"
)

// Conditional requests (RFC 9110 13.1, 13.2; S3 refers its conditional
// reads and writes to the RFC). If-Match and If-None-Match hold `*` or a
// comma-separated list of entity tags, each possibly weak (W/"..."):
//
//   - If-Match holds if any tag of the list matches by strong comparison
//     (13.1.1): a weak tag never matches;
//   - If-None-Match fails if any tag matches by weak comparison (13.1.2):
//     W/ is ignored.
//
// versitygw compares the whole field value with the ETag as one string,
// so a list never matches and a weak tag is compared with its W/. basalt
// evaluates the fields itself; its ETags are always strong.

// etagMatch says how an entity tag of a request is compared.
type etagMatch int

const (
	strongMatch etagMatch = iota // If-Match
	weakMatch                    // If-None-Match
)

// etagListMatches reports whether the If-Match or If-None-Match value v
// matches the object's ETag etag (quoted or not), compared as how says.
// `*` matches any object: the caller has one.
//
// v is the field value as s3api hands it over: it strips the first and
// last character of a value that begins and ends with a quote (and
// DeleteObject every quote at either end), so `"a", "b"` arrives as
// `a", "b` and `"a"` as `a`. S3 clients also send ETags without quotes.
// A value without any quote is therefore one opaque tag, the comma
// included (RFC 9110 allows commas inside a quoted tag; an unquoted list
// is no valid syntax); a value with quotes that does not start with one
// (or with W/) gets back the quotes s3api took.
func etagListMatches(v, etag string, how etagMatch) bool {
	etag = strings.Trim(etag, `"`)
	if etag == "" {
		return false
	}
	v = strings.TrimSpace(v)
	if v == "*" {
		return true
	}
	if !strings.Contains(v, `"`) {
		return v == etag
	}
	if !strings.HasPrefix(v, `"`) && !strings.HasPrefix(v, "W/") {
		v = `"` + v + `"`
	}
	for v != "" {
		v = strings.TrimLeft(v, " \t,")
		if v == "" {
			break
		}
		weak := strings.HasPrefix(v, "W/")
		if weak {
			v = v[2:]
		}
		var tag string
		if rest, ok := strings.CutPrefix(v, `"`); ok {
			// A quoted tag; the closing quote may have been stripped at
			// the end of the value (DeleteObject's trimming).
			end := strings.IndexByte(rest, '"')
			if end < 0 {
				end = len(rest)
			}
			tag, v = rest[:end], rest[min(end+1, len(rest)):]
		} else {
			// Not RFC syntax (an unquoted tag in a list): up to the next
			// separator.
			end := strings.IndexAny(v, ", \t")
			if end < 0 {
				end = len(v)
			}
			tag, v = v[:end], v[end:]
		}
		if tag == etag && (how == weakMatch || !weak) {
			return true
		}
	}
	return false
}

// preconditions evaluates the conditional headers of a read against an
// object's ETag and Last-Modified (whole seconds), in RFC 9110 13.2.2's
// order, which is S3's (and backend.EvaluatePreconditions'):
//
//  1. If-Match false: 412; else, without If-Match, If-Unmodified-Since
//     false: 412;
//  2. If-None-Match false: 304 (a copy's caller makes that 412); else,
//     without If-None-Match, If-Modified-Since false: 304.
//
// If-Match and If-None-Match take lists and weak tags (etagListMatches).
// If-Unmodified-Since holds when the object was last modified at exactly
// that time: it fails only if the object is more recent (RFC 9110
// 13.1.4, and S3), so a client may condition a GET on the Last-Modified a
// HEAD gave it; versitygw counts that case as failed.
func preconditions(etag string, mtime time.Time, pre backend.PreConditions) error {
	if pre.IfMatch != nil {
		if !etagListMatches(*pre.IfMatch, etag, strongMatch) {
			return s3err.GetPreconditionFailedErr(s3err.ConditionIfMatch)
		}
	} else if pre.IfUnmodeSince != nil && mtime.After(*pre.IfUnmodeSince) {
		return s3err.GetPreconditionFailedErr(s3err.ConditionIfUnmodifiedSince)
	}
	if pre.IfNoneMatch != nil {
		if etagListMatches(*pre.IfNoneMatch, etag, weakMatch) {
			return s3err.GetAPIError(s3err.ErrNotModified)
		}
	} else if pre.IfModSince != nil && !mtime.After(*pre.IfModSince) {
		return s3err.GetAPIError(s3err.ErrNotModified)
	}
	return nil
}

// ifRangeHolds evaluates an If-Range value v (RFC 9110 13.1.5) against the
// object (etag, Last-Modified mtime): an entity tag holds if it is the
// ETag by strong comparison — a weak one never does; quoted or not, as S3
// clients send ETags — and an HTTP-date if it is exactly the
// Last-Modified. When it does not hold, the Range is ignored and the
// whole object served: the client's copy is of another object.
func ifRangeHolds(v, etag string, mtime time.Time) bool {
	v = strings.TrimSpace(v)
	if strings.HasPrefix(v, "W/") {
		return false
	}
	if t, err := http.ParseTime(v); err == nil {
		return t.Equal(mtime)
	}
	v = strings.Trim(v, `"`)
	return v != "" && v == strings.Trim(etag, `"`)
}

// putConditions evaluates If-Match / If-None-Match of a write (PutObject,
// CompleteMultipartUpload) against the current object (etag, if exists).
// If-None-Match is versitygw's, which is S3's: only `*` (412 if the object
// exists), and never together with If-Match (both NotImplemented
// otherwise). If-Match is a list compared strongly, `*` asking only that
// the object exist; with no object S3 answers NoSuchKey.
func putConditions(etag string, exists bool, ifMatch, ifNoneMatch *string) error {
	if ifNoneMatch != nil {
		return backend.EvaluateObjectPutPreconditions(etag, ifMatch, ifNoneMatch, exists)
	}
	if ifMatch == nil {
		return nil
	}
	if !exists {
		return s3err.GetAPIError(s3err.ErrNoSuchKey)
	}
	if !etagListMatches(*ifMatch, etag, strongMatch) {
		return s3err.GetPreconditionFailedErr(s3err.ConditionIfMatch)
	}
	return nil
}

// deleteConditions evaluates a DeleteObject's If-Match (a list compared
// strongly; `*`: the object exists, as it does here — S3's conditional
// deletes) and then x-amz-if-match-last-modified-time and -size, as
// versitygw does.
func deleteConditions(m *objectMeta, pre backend.ObjectDeletePreconditions) error {
	if pre.IfMatch != nil {
		if !etagListMatches(*pre.IfMatch, m.ETag, strongMatch) {
			return s3err.GetPreconditionFailedErr(s3err.ConditionIfMatch)
		}
		pre.IfMatch = nil
	}
	return backend.EvaluateObjectDeletePreconditions(m.ETag, m.mtime(), m.Size, pre)
}

// maxRangePos is the largest byte position backend.ParseObjectRange parses.
var maxRangePos = strconv.FormatInt(math.MaxInt64, 10)

// clampRange rewrites the positions of a single byte range that overflow
// int64 to math.MaxInt64, for backend.ParseObjectRange, which ignores a
// range it cannot parse (answering the whole object, 200). RFC 9110 14.1.2:
// positions are 1*DIGIT and recipients "MUST anticipate potentially large
// decimal numerals and prevent parsing errors due to integer conversion
// overflows" — such a range is valid, and any position beyond int64 is
// beyond every object, as MaxInt64 is: a last position there means the
// rest of the object (206), a first one is unsatisfiable (416), a suffix
// that long is the whole object. A range whose last position is below
// its first stays invalid (ignored): if both overflow they are compared
// as numerals and the range is left as it is.
func clampRange(rng string) string {
	set, ok := strings.CutPrefix(rng, "bytes=")
	if !ok || strings.Count(set, "-") != 1 {
		return rng
	}
	first, last, _ := strings.Cut(set, "-")
	if !allDigits(first) || !allDigits(last) {
		return rng
	}
	fover, lover := overflowsInt64(first), overflowsInt64(last)
	switch {
	case !fover && !lover:
		return rng
	case fover && lover && compareNumerals(last, first) < 0:
		return rng
	}
	if fover {
		first = maxRangePos
	}
	if lover {
		last = maxRangePos
	}
	return "bytes=" + first + "-" + last
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// overflowsInt64 reports whether the decimal numeral s (digits only; ""
// does not) is beyond int64.
func overflowsInt64(s string) bool {
	if s == "" {
		return false
	}
	_, err := strconv.ParseInt(s, 10, 64)
	return err != nil // digits only: the one error is ErrRange
}

// compareNumerals compares two decimal numerals of any length.
func compareNumerals(a, b string) int {
	a, b = strings.TrimLeft(a, "0"), strings.TrimLeft(b, "0")
	if len(a) != len(b) {
		if len(a) < len(b) {
			return -1
		}
		return 1
	}
	return strings.Compare(a, b)
}
