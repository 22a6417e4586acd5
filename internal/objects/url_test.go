package objects

import (
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
)

func TestParseURL(t *testing.T) {
	for u, want := range map[string]string{
		"s3://bucket/key":        "",
		"s3://bucket/dir/a.raw":  "",
		"http://bucket/key":      errs.CodeInvalidRequest,
		"s3://bucket":            CodeInvalidKey,
		"s3://bucket/":           CodeInvalidKey,
		"s3://B/key":             CodeInvalidBucketName,
		"s3://bucket/a/../../x":  CodeInvalidKey,
		"s3:///key":              CodeInvalidBucketName,
		"s3://bucket/" + "\x00x": CodeInvalidKey,
	} {
		b, k, err := ParseURL(u)
		switch {
		case want == "" && err != nil:
			t.Errorf("%q: %v", u, err)
		case want == "" && "s3://"+b+"/"+k != u:
			t.Errorf("%q parsed as %q %q", u, b, k)
		case want != "" && !errs.IsCode(err, want):
			t.Errorf("%q: error %v, want %s", u, err, want)
		}
	}
}

// FuzzParseURL: a URL parses into a bucket and key that rebuild it, or
// fails with a typed error; nothing panics.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"s3://bucket/key", "s3://b/../x", "s3://", "", "s3://bucket//k"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, u string) {
		b, k, err := ParseURL(u)
		if err != nil {
			if _, ok := errs.As(err); !ok {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if "s3://"+b+"/"+k != u || strings.Contains(b, "/") {
			t.Fatalf("%q parsed as %q %q", u, b, k)
		}
	})
}
