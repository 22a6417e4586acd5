package objects

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/versity/versitygw/s3err"
)

func TestCheckKey(t *testing.T) {
	good := []string{"a", "a/b", "a/b/c.txt", "a b", "ü/日本", "a..b", "...", ".a", "a/.b", "x/" + strings.Repeat("n", 255),
		strings.Repeat("k/", 511) + "k"}
	for _, k := range good {
		if err := checkKey(k); err != nil {
			t.Errorf("%q refused: %v", k, err)
		}
	}
	bad := map[string]string{
		"":                        "empty",
		"a//b":                    "empty path component",
		"/a":                      "starts with",
		"a/":                      "ends with",
		".":                       `"."`,
		"..":                      `".."`,
		"a/../b":                  `".."`,
		"a/./b":                   `"."`,
		"a\x00b":                  "NUL",
		"a\nb":                    "control",
		"\xff\xfe":                "UTF-8",
		strings.Repeat("n", 256):  "path component",
		strings.Repeat("k/", 513): "too long",
		".basalt":                 "reserved",
		"a/.basalt-versions/b":    "reserved",
	}
	for k, why := range bad {
		err := checkKey(k)
		if err == nil {
			t.Errorf("%q accepted", k)
			continue
		}
		var se s3err.S3Error
		if !errors.As(err, &se) {
			t.Errorf("%q: %v is not an S3 error", k, err)
			continue
		}
		msg := strings.ToLower(se.BaseError().Description)
		if !strings.Contains(msg, strings.ToLower(why)) {
			t.Errorf("%q: %v (want a message about %s)", k, err, why)
		}
	}
}

func TestCheckBucketName(t *testing.T) {
	for _, n := range []string{"abc", "a-b.c", "0bucket9", strings.Repeat("a", 63)} {
		if err := checkBucketName(n); err != nil {
			t.Errorf("%q refused: %v", n, err)
		}
	}
	for _, n := range []string{"", "ab", "Abc", "a_b", "-ab", "ab-", "a..b", "192.168.1.1", "a/b", "..", strings.Repeat("a", 64)} {
		if checkBucketName(n) == nil {
			t.Errorf("%q accepted", n)
		}
	}
}

// FuzzKey: checkKey never panics, and an accepted key names exactly one
// path strictly inside the bucket directory, unchanged by cleaning.
func FuzzKey(f *testing.F) {
	for _, s := range []string{"a", "a/b", "a//b", "../x", "a/..", "./a", "a\x00", "\xff", ".basalt", "a/b/", "/", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		if checkKey(key) != nil {
			return
		}
		const dir = "/store/buckets/bkt"
		p := filepath.Join(dir, key)
		if p != dir+"/"+key {
			t.Fatalf("key %q maps to %q (aliased)", key, p)
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel != key || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
			t.Fatalf("key %q leaves the bucket: %q %v", key, rel, err)
		}
		if !filepath.IsLocal(key) {
			t.Fatalf("key %q is not local", key)
		}
	})
}
