package objects

import (
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// TestKeyNoncharacterRefused: U+FFFE and U+FFFF are valid UTF-8 but no
// characters XML can carry; the listing's encoder writes U+FFFD in their
// place, so a listing showed the key "c\uFFFF" as "c\uFFFD" — another
// key, which GET answers NoSuchKey. Such keys are refused, as control
// characters are; the characters beside them in Unicode are fine.
func TestKeyNoncharacterRefused(t *testing.T) {
	for _, k := range []string{"c\uffff", "\ufffe", "a/b\uffffc/d"} {
		if err := checkKey(k); err == nil || !strings.Contains(err.Error(), "noncharacter") {
			t.Errorf("checkKey(%+q) = %v, want a noncharacter refusal", k, err)
		}
	}
	for _, k := range []string{"c\ufffd", "\ufeff", "x\U0010fffd", "\U0001f600"} {
		if err := checkKey(k); err != nil {
			t.Errorf("checkKey(%+q) = %v, want ok", k, err)
		}
	}
	e := newEnv(t, false)
	mkBucket(t, e.alice, "nonchar")
	_, err := e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("nonchar"), Key: aws.String("c\uffff"),
		Body: strings.NewReader("x")})
	wantCode(t, err, "InvalidArgument")
}
