package objects

// Middleware through s3api and aws-sdk-go-v2, as the gateway mounts it:
// keys s3api refuses itself get basalt's explanation, and GET/HEAD of a
// delete marker answer as AWS does (x-amz-delete-marker, the marker's
// version id and Last-Modified).

import (
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"github.com/versity/versitygw/auth"
	"github.com/versity/versitygw/s3api"
	"github.com/versity/versitygw/s3api/middlewares"
	"github.com/versity/versitygw/s3err"
)

// newMiddlewareEnv is newEnv (plain HTTP, xattr or sidecar as the file
// system allows) with Middleware mounted the way internal/server does.
func newMiddlewareEnv(t *testing.T) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{dir: dir, root: filepath.Join(dir, "buckets"), work: filepath.Join(dir, "work"),
		buckets: &memBuckets{m: map[string]Bucket{}}, aliceKey: "AKALICE"}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	be, err := New(Config{Root: e.root, Work: e.work, Buckets: e.buckets, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	e.be = be
	e.iam = testIAM{
		"AKALICE": {Access: "AKALICE", Secret: "alice-secret", Role: auth.RoleUserPlus, Arn: "user/alice"},
		"AKBOB":   {Access: "AKBOB", Secret: "bob-secret", Role: auth.RoleUserPlus, Arn: "user/bob"},
	}
	addr := freeAddr(t)
	ready := make(chan struct{})
	var once sync.Once
	srv, err := s3api.New(be, middlewares.RootUserConfig{Access: "AKROOT", Secret: "root-secret"}, "us-east-1", e.iam,
		nil, nil, nil, nil,
		s3api.WithConcurrencyLimiter(1000, 1000), s3api.WithKeepAlive(), s3api.WithDisableACL(), s3api.WithQuiet(),
		s3api.WithMiddleware("/", Middleware()),
		s3api.WithOnListen(func() { once.Do(func() { close(ready) }) }))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeMultiPort([]string{addr}) }()
	select {
	case <-ready:
	case err := <-served:
		t.Fatalf("serve: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("server did not start")
	}
	t.Cleanup(func() {
		srv.ShutDown()
		be.Shutdown()
	})
	e.alice = client("http", addr, "AKALICE", "alice-secret")
	e.bob = client("http", addr, "AKBOB", "bob-secret")
	e.admin = client("http", addr, "AKROOT", "root-secret")
	return e
}

// s3Answer is what an S3 error answered: status, code, message, headers.
type s3Answer struct {
	status        int
	code, message string
	header        http.Header
}

func answerOf(t *testing.T, what string, err error) s3Answer {
	t.Helper()
	var re *awshttp.ResponseError
	if err == nil || !errors.As(err, &re) {
		t.Fatalf("%s: want an HTTP error answer, got %v", what, err)
	}
	a := s3Answer{status: re.HTTPStatusCode(), header: re.Response.Header}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		a.code, a.message = ae.ErrorCode(), ae.ErrorMessage()
	}
	return a
}

func TestS3apiKeyError(t *testing.T) {
	for _, k := range []string{"a", "a/b", "a..b", "...", "a/b/../c", "a/./b", "a//b", "dir/", ".basalt"} {
		// s3api lets these through: the backend answers them.
		if err := s3apiKeyError(k); err != nil {
			t.Errorf("%q: %v (s3api accepts it; the backend must answer)", k, err)
		}
	}
	for _, k := range []string{"..", "../x", "a/../../x", "a/..", ".", "./", "/", "//"} {
		err := s3apiKeyError(k)
		if s3code(err) != "InvalidArgument" {
			t.Errorf("%q: %v, want InvalidArgument", k, err)
		}
	}
	for k, seg := range map[string]string{"a/../../x": `".." segment`, "a/../": `".." segment`, "./": `"." segment`, "/": `starts with "/"`} {
		var se s3err.S3Error
		if err := s3apiKeyError(k); !errors.As(err, &se) || !strings.Contains(se.BaseError().Description, seg) {
			t.Errorf("%q: %v does not name the problem (%s)", k, err, seg)
		}
	}
}

// TestKeyMiddleware: keys s3api refuses before the backend sees them
// answer InvalidArgument with a message naming the ".." segment, on
// every object operation; nothing is written.
func TestKeyMiddleware(t *testing.T) {
	e := newMiddlewareEnv(t)
	c := e.alice
	mkBucket(t, c, "keys")
	bk := "keys"
	for _, k := range []string{"../escape", "a/../../escape", "..", "a/..", "x/../../../../tmp/escape"} {
		_, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: &bk, Key: aws.String(k), Body: strings.NewReader("no")})
		a := answerOf(t, "put "+k, err)
		if a.status != 400 || a.code != "InvalidArgument" || !strings.Contains(a.message, `".." segment`) {
			t.Errorf("put %q: %d %s %q, want 400 InvalidArgument naming the \"..\" segment", k, a.status, a.code, a.message)
		}
		_, err = c.GetObject(ctx, &s3.GetObjectInput{Bucket: &bk, Key: aws.String(k)})
		if a := answerOf(t, "get "+k, err); a.status != 400 || a.code != "InvalidArgument" {
			t.Errorf("get %q: %d %s %q", k, a.status, a.code, a.message)
		}
		_, err = c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: &bk, Key: aws.String(k)})
		if a := answerOf(t, "create upload "+k, err); a.status != 400 || a.code != "InvalidArgument" {
			t.Errorf("create upload %q: %d %s %q", k, a.status, a.code, a.message)
		}
	}
	// Keys s3api lets through are the backend's to answer, as before.
	_, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: &bk, Key: aws.String("a/b/../c"), Body: strings.NewReader("no")})
	if a := answerOf(t, "put a/b/../c", err); a.code != "InvalidArgument" || !strings.Contains(a.message, `".." segment`) {
		t.Errorf("put a/b/../c: %d %s %q", a.status, a.code, a.message)
	}
	// An invalid bucket name is still s3api's answer.
	_, err = c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("Bad_Bucket"), Key: aws.String("../x")})
	if a := answerOf(t, "get Bad_Bucket/../x", err); a.code != "InvalidBucketName" {
		t.Errorf("get Bad_Bucket/../x: %d %s %q", a.status, a.code, a.message)
	}
	// Unsigned requests get the same answer s3api's own check gave: the
	// key is refused before authentication, as before.
	resp, err := http.Get("http://" + strings.TrimPrefix(aws.ToString(c.Options().BaseEndpoint), "http://") + "/keys/..%2F..%2Fx")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 || resp.Header.Get("x-amz-request-id") == "" {
		t.Errorf("unsigned GET /keys/..%%2F..%%2Fx: %s, request id %q", resp.Status, resp.Header.Get("x-amz-request-id"))
	}
	if left := files(t, e.root); len(left) != 0 {
		t.Errorf("files written: %v", left)
	}
	// A normal key still works through the middleware.
	put(t, c, bk, "fine/key", "ok")
	if got := get(t, c, bk, "fine/key"); got != "ok" {
		t.Fatalf("get fine/key: %q", got)
	}
}

// TestDeleteMarkerAnswers: GET/HEAD of a key whose current version is a
// delete marker answer 404 NoSuchKey with x-amz-delete-marker: true, the
// marker's version id and Last-Modified; GET/HEAD ?versionId=<marker>
// answer 405 MethodNotAllowed with the same headers (AWS's behaviour).
func TestDeleteMarkerAnswers(t *testing.T) {
	e := newMiddlewareEnv(t)
	c, bk := e.alice, "markers"
	mkBucket(t, c, bk)
	setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
	v1 := aws.ToString(put(t, c, bk, "k", "one").VersionId)
	del := delVersion(t, c, bk, "k", "")
	marker := aws.ToString(del.VersionId)
	if !aws.ToBool(del.DeleteMarker) || !validVersionID(marker) {
		t.Fatalf("delete: marker %v id %q", del.DeleteMarker, marker)
	}

	check := func(what string, err error, status int, code, vid string) {
		t.Helper()
		a := answerOf(t, what, err)
		if a.status != status || code != "" && a.code != code {
			t.Errorf("%s: %d %s %q, want %d %s", what, a.status, a.code, a.message, status, code)
		}
		if got := a.header.Get("x-amz-delete-marker"); got != "true" {
			t.Errorf("%s: x-amz-delete-marker %q, want true", what, got)
		}
		if got := a.header.Get("x-amz-version-id"); got != vid {
			t.Errorf("%s: x-amz-version-id %q, want %q", what, got, vid)
		}
		if lm, err := http.ParseTime(a.header.Get("Last-Modified")); err != nil || time.Since(lm) > time.Minute {
			t.Errorf("%s: Last-Modified %q (%v)", what, a.header.Get("Last-Modified"), err)
		}
	}
	_, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: &bk, Key: aws.String("k")})
	check("get k (current: marker)", err, 404, "NoSuchKey", marker)
	_, err = c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &bk, Key: aws.String("k")})
	check("head k (current: marker)", err, 404, "", marker)
	_, err = c.GetObject(ctx, &s3.GetObjectInput{Bucket: &bk, Key: aws.String("k"), VersionId: &marker})
	check("get k?versionId=marker", err, 405, "MethodNotAllowed", marker)
	if a := answerOf(t, "get marker", err); a.header.Get("Allow") != "DELETE" {
		t.Errorf("get k?versionId=marker: Allow %q, want DELETE", a.header.Get("Allow"))
	}
	_, err = c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &bk, Key: aws.String("k"), VersionId: &marker})
	check("head k?versionId=marker", err, 405, "", marker)

	// The old version is still served, without marker headers.
	if got, err := getVersion(t, c, bk, "k", v1); err != nil || got != "one" {
		t.Fatalf("get k?versionId=%s: %q %v", v1, got, err)
	}
	// A key that never existed, and a key in an unversioned bucket: a
	// plain NoSuchKey.
	mkBucket(t, c, "plain")
	for _, in := range []*s3.GetObjectInput{{Bucket: &bk, Key: aws.String("never")}, {Bucket: aws.String("plain"), Key: aws.String("k")}} {
		_, err := c.GetObject(ctx, in)
		a := answerOf(t, "get "+*in.Bucket+"/"+*in.Key, err)
		if a.status != 404 || a.code != "NoSuchKey" || a.header.Get("x-amz-delete-marker") != "" || a.header.Get("x-amz-version-id") != "" {
			t.Errorf("get %s/%s: %d %s, delete marker %q, version %q", *in.Bucket, *in.Key, a.status, a.code,
				a.header.Get("x-amz-delete-marker"), a.header.Get("x-amz-version-id"))
		}
	}

	// Suspended: DELETE makes the null marker; GET answers with its id "null".
	setVersioning(t, c, bk, types.BucketVersioningStatusSuspended)
	put(t, c, bk, "n", "null one")
	delVersion(t, c, bk, "n", "")
	_, err = c.GetObject(ctx, &s3.GetObjectInput{Bucket: &bk, Key: aws.String("n")})
	check("get n (current: null marker)", err, 404, "NoSuchKey", "null")
	_, err = c.GetObject(ctx, &s3.GetObjectInput{Bucket: &bk, Key: aws.String("n"), VersionId: aws.String("null")})
	check("get n?versionId=null (the null marker)", err, 405, "MethodNotAllowed", "null")

	// Deleting the marker undeletes: GET serves the object again.
	delVersion(t, c, bk, "k", marker)
	if got := get(t, c, bk, "k"); got != "one" {
		t.Fatalf("after removing the marker: %q", got)
	}
}
