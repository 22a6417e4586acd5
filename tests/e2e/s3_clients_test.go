package e2e

// S3 through the clients people use: the aws cli (a 100 MiB multipart
// upload, listings with prefixes and delimiters, presigned URLs fetched by
// plain curl), boto3, rclone sync/check, and aws-sdk-go-v2 for the error
// cases (wrong secret, another user's bucket, keys that must not become
// paths), with the store walked to prove nothing lands outside the bucket.
//
// Each test runs its own node and they run in parallel.

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
)

// EnvVar returns the value of NAME in the user's s3.env.
func (u *S3User) EnvVar(name string) string {
	for _, e := range u.Env {
		if v, ok := strings.CutPrefix(e, name+"="); ok {
			return v
		}
	}
	u.t.Fatalf("s3.env has no %s: %v", name, u.Env)
	return ""
}

// RunWith runs a program with the user's s3.env (and extraEnv, which
// wins) in its environment.
func (u *S3User) RunWith(timeout time.Duration, extraEnv []string, name string, args ...string) ToolResult {
	u.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(append(append(baseEnv(), u.Env...), "AWS_EC2_METADATA_DISABLED=true",
		"AWS_CONFIG_FILE=/nonexistent", "AWS_SHARED_CREDENTIALS_FILE=/nonexistent"), extraEnv...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	start := time.Now()
	err := cmd.Run()
	r := ToolResult{Cmd: shellQuote(name, args...), Stdout: so.String(), Stderr: se.String(), Took: time.Since(start)}
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			u.t.Fatalf("run %s: %v", r.Cmd, err)
		}
		r.Code = ee.ExitCode()
		if ctx.Err() != nil {
			r.Stderr += fmt.Sprintf("\n(killed after the test's timeout of %v)", timeout)
		}
	}
	return r
}

// boundTo is the same user reporting failures to t (a subtest).
func (u *S3User) boundTo(t *testing.T) *S3User {
	v := *u
	v.t = t
	return &v
}

// GoSDK is an aws-sdk-go-v2 client for the user (path-style, plain HTTP, no
// retries so errors surface as they are).
func (u *S3User) GoSDK() *s3.Client {
	return s3.New(s3.Options{
		Region:           "us-east-1",
		BaseEndpoint:     aws.String(u.Endpoint),
		UsePathStyle:     true,
		Credentials:      credentials.NewStaticCredentialsProvider(u.EnvVar("AWS_ACCESS_KEY_ID"), u.EnvVar("AWS_SECRET_ACCESS_KEY"), ""),
		RetryMaxAttempts: 1,
	})
}

// wantS3Error requires err to be an S3 error with the given code and HTTP
// status and a non-empty message, and returns the message.
func wantS3Error(t *testing.T, what string, err error, code string, status int) string {
	t.Helper()
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		t.Fatalf("%s: want S3 error %s, got %v", what, code, err)
	}
	var re *awshttp.ResponseError
	got := 0
	if errors.As(err, &re) {
		got = re.HTTPStatusCode()
	}
	if ae.ErrorCode() != code || got != status || strings.TrimSpace(ae.ErrorMessage()) == "" {
		t.Fatalf("%s: want %d %s with a message, got %d %s %q", what, status, code, got, ae.ErrorCode(), ae.ErrorMessage())
	}
	return ae.ErrorMessage()
}

// pathStates maps every path below root (relative, "/" for directories) to
// its size and mtime, skipping the subtrees named in skip.
func pathStates(t *testing.T, root string, skip ...string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() && slices.Contains(skip, rel) {
			return filepath.SkipDir
		}
		if d.IsDir() {
			m[rel+"/"] = ""
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		m[rel] = fmt.Sprint(fi.Size(), fi.ModTime().UnixNano())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// pathStatesDiff lists the paths added, removed or changed between two states.
func pathStatesDiff(before, after map[string]string) []string {
	var d []string
	for p, v := range after {
		if w, ok := before[p]; !ok {
			d = append(d, "+"+p)
		} else if v != w && !strings.HasSuffix(p, "/") {
			d = append(d, "~"+p)
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			d = append(d, "-"+p)
		}
	}
	slices.Sort(d)
	return d
}

// s3MultipartETag is S3's ETag of an object uploaded in parts of partSize.
func s3MultipartETag(data []byte, partSize int) string {
	var sums []byte
	n := 0
	for off := 0; off < len(data); off += partSize {
		s := md5.Sum(data[off:min(off+partSize, len(data))])
		sums = append(sums, s[:]...)
		n++
	}
	s := md5.Sum(sums)
	return fmt.Sprintf(`"%s-%d"`, hex.EncodeToString(s[:]), n)
}

func putLocalFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// awsListV2 is the JSON of `aws s3api list-objects-v2`, the parts we check.
type awsListV2 struct {
	Contents       []struct{ Key string }
	CommonPrefixes []struct{ Prefix string }
}

func (l awsListV2) keys() (keys, prefixes []string) {
	for _, c := range l.Contents {
		keys = append(keys, c.Key)
	}
	for _, p := range l.CommonPrefixes {
		prefixes = append(prefixes, p.Prefix)
	}
	return keys, prefixes
}

// The aws cli: a 100 MiB multipart upload lands as one plain file with
// S3's multipart ETag; listings with prefixes, delimiters and pages; rm;
// presigned URLs work with plain curl until they expire.
func TestS3ClientsAwsCLI(t *testing.T) {
	requireTools(t, "aws", "curl")
	t.Parallel()
	n := StartNode(t, NodeOptions{})
	alice := n.S3User(n.Admin().CreateUser("alice"))
	bucketDir := filepath.Join(n.StoreDir(), "buckets", "big")
	dir := t.TempDir()
	alice.AWSOK("s3", "mb", "s3://big")
	// No parts, upload directories or temp files are left behind (lock
	// files and the layout marker stay: docs/objects.md, "Layout").
	// Checked once the parts below have all ended (a cleanup runs after
	// the subtests, before the node stops): while one part uploads its
	// multipart object, another's PUT may have its temp file in Work/tmp.
	t.Cleanup(func() {
		if left := pathStates(t, filepath.Join(n.StoreDir(), "objects")); slices.ContainsFunc(slices.Collect(maps.Keys(left)),
			func(p string) bool {
				return !strings.HasSuffix(p, "/") && !strings.HasPrefix(p, "locks/") && p != "layout-versions-2"
			}) {
			t.Errorf("files left in the object scratch dir: %v", left)
		}
	})
	// The three parts are independent (their own keys or buckets): in parallel.

	t.Run("multipart100MiB", func(t *testing.T) {
		t.Parallel()
		alice := alice.boundTo(t)
		data := randomBytes(t, 100<<20)
		src := filepath.Join(dir, "big.bin")
		putLocalFile(t, src, data)
		start := time.Now()
		// The cli's defaults: multipart above 8 MiB, in 8 MiB parts: 13 parts.
		alice.AWSOK("s3", "cp", src, "s3://big/blobs/big.bin")
		t.Logf("aws s3 cp of 100 MiB: %v", time.Since(start).Round(time.Millisecond))
		var head struct {
			ETag          string
			ContentLength int64
		}
		if err := json.Unmarshal([]byte(alice.AWSOK("s3api", "head-object", "--bucket", "big", "--key", "blobs/big.bin")), &head); err != nil {
			t.Fatal(err)
		}
		if want := s3MultipartETag(data, 8<<20); head.ETag != want || head.ContentLength != int64(len(data)) {
			t.Fatalf("head: ETag %s size %d, want %s (13 parts of 8 MiB) size %d", head.ETag, head.ContentLength, want, len(data))
		}
		if got := mustRead(t, filepath.Join(bucketDir, "blobs", "big.bin")); !bytes.Equal(got, data) {
			t.Fatalf("the backing file holds %d bytes that differ from the 100 MiB uploaded", len(got))
		}
		// (That no parts or upload directories are left behind is checked
		// once every part of this test has ended: below.)
		// The cli downloads it back in ranged parts.
		back := filepath.Join(dir, "big.back")
		alice.AWSOK("s3", "cp", "s3://big/blobs/big.bin", back)
		if !bytes.Equal(mustRead(t, back), data) {
			t.Fatal("the object read back differs")
		}
		os.Remove(back)
	})

	t.Run("listings", func(t *testing.T) {
		t.Parallel()
		alice := alice.boundTo(t)
		tree := []string{"top.txt", "a/1.txt", "a/2.txt", "a/b/3.txt", "a/b/c/4.txt", "a/bz.txt", "b/5.txt", "c.d/6.txt"}
		local := filepath.Join(dir, "tree")
		for _, k := range tree {
			putLocalFile(t, filepath.Join(local, k), []byte("object "+k))
		}
		alice.AWSOK("s3", "mb", "s3://tree")
		alice.AWSOK("s3", "cp", "--recursive", "--quiet", local, "s3://tree/")
		for _, k := range tree {
			if got := string(mustRead(t, filepath.Join(n.StoreDir(), "buckets", "tree", k))); got != "object "+k {
				t.Fatalf("%s holds %q", k, got)
			}
		}
		cases := []struct {
			args             []string
			keys, prefixesTo []string
		}{
			{[]string{"--delimiter", "/"}, []string{"top.txt"}, []string{"a/", "b/", "c.d/"}},
			{[]string{"--prefix", "a/", "--delimiter", "/"}, []string{"a/1.txt", "a/2.txt", "a/bz.txt"}, []string{"a/b/"}},
			{[]string{"--prefix", "a/b"}, []string{"a/b/3.txt", "a/b/c/4.txt", "a/bz.txt"}, nil},
			{[]string{"--prefix", "a/b", "--delimiter", "/"}, []string{"a/bz.txt"}, []string{"a/b/"}},
			{[]string{"--prefix", "a/b/", "--delimiter", "/"}, []string{"a/b/3.txt"}, []string{"a/b/c/"}},
			{[]string{"--delimiter", "."}, nil, []string{"a/1.", "a/2.", "a/b/3.", "a/b/c/4.", "a/bz.", "b/5.", "c.", "top."}},
			{[]string{"--prefix", "nothing/"}, nil, nil},
			// Pages of two keys: the cli follows the continuation tokens.
			{[]string{"--page-size", "2"}, slices.Sorted(slices.Values(tree)), nil},
			{[]string{"--page-size", "1", "--delimiter", "/"}, []string{"top.txt"}, []string{"a/", "b/", "c.d/"}},
			{[]string{"--start-after", "a/bz.txt"}, []string{"b/5.txt", "c.d/6.txt", "top.txt"}, nil},
		}
		for _, c := range cases {
			out := alice.AWSOK(append([]string{"s3api", "list-objects-v2", "--bucket", "tree"}, c.args...)...)
			var l awsListV2
			if strings.TrimSpace(out) != "" {
				if err := json.Unmarshal([]byte(out), &l); err != nil {
					t.Fatalf("%v: %v in %q", c.args, err, out)
				}
			}
			keys, prefixes := l.keys()
			if !slices.Equal(keys, c.keys) || !slices.Equal(prefixes, c.prefixesTo) {
				t.Errorf("list-objects-v2 %v: keys %q prefixes %q, want %q %q", c.args, keys, prefixes, c.keys, c.prefixesTo)
			}
		}
		ls := alice.AWSOK("s3", "ls", "s3://tree/a/")
		for _, want := range []string{"PRE b/", "1.txt", "2.txt", "bz.txt"} {
			if !strings.Contains(ls, want) {
				t.Errorf("aws s3 ls s3://tree/a/ lacks %q: %q", want, ls)
			}
		}
		if strings.Contains(ls, "3.txt") {
			t.Errorf("aws s3 ls s3://tree/a/ descends: %q", ls)
		}

		// rm: one key, then a whole prefix; the files and emptied dirs go.
		alice.AWSOK("s3", "rm", "s3://tree/top.txt")
		alice.AWSOK("s3", "rm", "--recursive", "--quiet", "s3://tree/a/")
		left := pathStates(t, filepath.Join(n.StoreDir(), "buckets", "tree"))
		if want := []string{"./", "b/", "b/5.txt", "c.d/", "c.d/6.txt"}; !slices.Equal(slices.Sorted(maps.Keys(left)), want) {
			t.Fatalf("after rm, the bucket dir holds %v; want only %v", left, want)
		}
		out := alice.AWSOK("s3api", "list-objects-v2", "--bucket", "tree")
		if !strings.Contains(out, "b/5.txt") || strings.Contains(out, "a/") || strings.Contains(out, "top.txt") {
			t.Fatalf("listing after rm: %s", out)
		}
	})

	t.Run("presign", func(t *testing.T) {
		t.Parallel()
		alice := alice.boundTo(t)
		data := randomBytes(t, 200<<10)
		src := filepath.Join(dir, "shared.bin")
		putLocalFile(t, src, data)
		alice.AWSOK("s3", "cp", src, "s3://big/shared/file.bin")

		url := strings.TrimSpace(alice.AWSOK("s3", "presign", "s3://big/shared/file.bin", "--expires-in", "300"))
		if !strings.HasPrefix(url, alice.Endpoint+"/big/shared/file.bin?") || !strings.Contains(url, "X-Amz-Signature=") {
			t.Fatalf("presigned URL %q: want a path-style SigV4 URL on %s", url, alice.Endpoint)
		}
		out := filepath.Join(dir, "curl.bin")
		toolOK(t, 30*time.Second, "curl", "-sS", "-f", "-o", out, url)
		if !bytes.Equal(mustRead(t, out), data) {
			t.Fatal("curl of the presigned URL returned other bytes")
		}
		// A ranged GET through the same URL (Range is not signed).
		toolOK(t, 30*time.Second, "curl", "-sS", "-f", "-r", "100-199", "-o", out, url)
		if !bytes.Equal(mustRead(t, out), data[100:200]) {
			t.Fatal("ranged curl of the presigned URL returned other bytes")
		}
		// A tampered URL (other key, same signature) is refused.
		bad := strings.Replace(url, "/shared/file.bin?", "/blobs/big.bin?", 1)
		r := tool(t, 30*time.Second, "curl", "-sS", "-o", "-", "-w", "\n%{http_code}", bad)
		if !strings.HasSuffix(strings.TrimSpace(r.Stdout), "403") || !strings.Contains(r.Stdout, "SignatureDoesNotMatch") {
			t.Fatalf("a presigned URL for another key: %s", r)
		}

		expiring := strings.TrimSpace(alice.AWSOK("s3", "presign", "s3://big/shared/file.bin", "--expires-in", "1"))
		time.Sleep(2100 * time.Millisecond)
		r = tool(t, 30*time.Second, "curl", "-sS", "-f", "-o", out, expiring)
		if r.Code != 22 || !strings.Contains(r.Stderr, "403") {
			t.Fatalf("curl -f of an expired presigned URL: want exit 22 (HTTP 403): %s", r)
		}
		r = tool(t, 30*time.Second, "curl", "-sS", "-o", "-", "-w", "\n%{http_code}", expiring)
		body := strings.TrimSpace(r.Stdout)
		if !strings.HasSuffix(body, "\n403") || !strings.Contains(strings.ToLower(body), "expired") {
			t.Fatalf("an expired presigned URL: want 403 and a body naming the expiry: %s", r)
		}
		t.Logf("expired presign answers: %s", strings.ReplaceAll(body, "\n", " "))
	})
}

// boto3Script runs against the endpoint in AWS_ENDPOINT_URL with the keys
// of s3.env. argv: bucket, small file, multipart source, download path.
const boto3Script = `
import sys, boto3, hashlib
from botocore.config import Config
from botocore.exceptions import ClientError
from boto3.s3.transfer import TransferConfig

bucket, small_path, big_path, back_path = sys.argv[1:5]
s3 = boto3.client("s3", config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
s3.create_bucket(Bucket=bucket)
assert bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]]

small = open(small_path, "rb").read()
r = s3.put_object(Bucket=bucket, Key="docs/report.txt", Body=small, ContentType="text/plain; charset=utf-8",
                  Metadata={"colour": "blue", "owner": "alice"}, CacheControl="max-age=60")
assert r["ETag"] == '"%s"' % hashlib.md5(small).hexdigest(), r["ETag"]

h = s3.head_object(Bucket=bucket, Key="docs/report.txt")
assert h["ContentLength"] == len(small), h
assert h["ContentType"] == "text/plain; charset=utf-8", h["ContentType"]
assert h["Metadata"] == {"colour": "blue", "owner": "alice"}, h["Metadata"]
assert h["CacheControl"] == "max-age=60", h.get("CacheControl")
assert h["ETag"] == r["ETag"]

g = s3.get_object(Bucket=bucket, Key="docs/report.txt")
assert g["Body"].read() == small
assert g["ContentType"] == "text/plain; charset=utf-8" and g["Metadata"]["colour"] == "blue"

g = s3.get_object(Bucket=bucket, Key="docs/report.txt", Range="bytes=10-19")
assert g["ResponseMetadata"]["HTTPStatusCode"] == 206
assert g["ContentRange"] == "bytes 10-19/%d" % len(small), g["ContentRange"]
assert g["Body"].read() == small[10:20]
g = s3.get_object(Bucket=bucket, Key="docs/report.txt", Range="bytes=-7")
assert g["Body"].read() == small[-7:]
try:
    s3.get_object(Bucket=bucket, Key="docs/report.txt", Range="bytes=%d-" % (len(small) + 10))
    raise SystemExit("a range past the end was served")
except ClientError as e:
    assert e.response["Error"]["Code"] == "InvalidRange", e.response

for i in range(5):
    s3.put_object(Bucket=bucket, Key="logs/%d.log" % i, Body=b"line %d\n" % i)
keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="logs/")["Contents"]]
assert keys == ["logs/%d.log" % i for i in range(5)], keys
pages = list(s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, PaginationConfig={"PageSize": 2}))
assert len(pages) == 3 and sum(len(p["Contents"]) for p in pages) == 6, pages
top = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["docs/", "logs/"] and "Contents" not in top, top

# upload_file: parts of 5 MiB above a 5 MiB threshold, 3 threads.
cfg = TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20, max_concurrency=3)
s3.upload_file(big_path, bucket, "big/multi.bin", Config=cfg, ExtraArgs={"ContentType": "application/x-test", "Metadata": {"kind": "multipart"}})
h = s3.head_object(Bucket=bucket, Key="big/multi.bin")
big = open(big_path, "rb").read()
parts = [big[i:i + (5 << 20)] for i in range(0, len(big), 5 << 20)]
want = '"%s-%d"' % (hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest(), len(parts))
assert h["ETag"] == want, (h["ETag"], want)
assert h["ContentLength"] == len(big) and h["ContentType"] == "application/x-test" and h["Metadata"] == {"kind": "multipart"}, h
s3.download_file(bucket, "big/multi.bin", back_path, Config=cfg)
assert open(back_path, "rb").read() == big
g = s3.get_object(Bucket=bucket, Key="big/multi.bin", PartNumber=2)
assert g["Body"].read() == parts[1] and g["ResponseMetadata"]["HTTPStatusCode"] == 206

# ListObjects (v1) with a delimiter, and its marker paging.
v1 = s3.list_objects(Bucket=bucket, Prefix="logs/", MaxKeys=2)
assert [o["Key"] for o in v1["Contents"]] == ["logs/0.log", "logs/1.log"] and v1["IsTruncated"], v1
v1 = s3.list_objects(Bucket=bucket, Prefix="logs/", Marker="logs/1.log")
assert [o["Key"] for o in v1["Contents"]] == ["logs/%d.log" % i for i in range(2, 5)] and not v1["IsTruncated"], v1
v1 = s3.list_objects(Bucket=bucket, Delimiter="/")
assert [p["Prefix"] for p in v1["CommonPrefixes"]] == ["big/", "docs/", "logs/"], v1

# A presigned PUT, used by a plain HTTP client. boto3 presigns with SigV2
# unless told otherwise: refused, naming the scheme to use.
import urllib.request, urllib.error
def presigned_put(client, key, data):
    url = client.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=60)
    try:
        return urllib.request.urlopen(urllib.request.Request(url, data=data, method="PUT")).status, b""
    except urllib.error.HTTPError as e:
        return e.code, e.read()
code, body = presigned_put(s3, "docs/v2.txt", b"sigv2")
assert code == 400 and b"AWS4-HMAC-SHA256" in body, (code, body)
v4 = boto3.client("s3", config=Config(s3={"addressing_style": "path"}, signature_version="s3v4"))
code, body = presigned_put(v4, "docs/presigned.txt", b"put through a presigned URL")
assert code == 200, (code, body)
assert s3.get_object(Bucket=bucket, Key="docs/presigned.txt")["Body"].read() == b"put through a presigned URL"
s3.delete_object(Bucket=bucket, Key="docs/presigned.txt")

s3.copy_object(Bucket=bucket, Key="docs/copy.txt", CopySource={"Bucket": bucket, "Key": "docs/report.txt"})
assert s3.get_object(Bucket=bucket, Key="docs/copy.txt")["Body"].read() == small

s3.delete_object(Bucket=bucket, Key="docs/copy.txt")
try:
    s3.get_object(Bucket=bucket, Key="docs/copy.txt")
    raise SystemExit("a deleted object was served")
except ClientError as e:
    assert e.response["Error"]["Code"] == "NoSuchKey", e.response
r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "logs/%d.log" % i} for i in range(5)]})
assert len(r["Deleted"]) == 5 and not r.get("Errors"), r
assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["big/multi.bin", "docs/report.txt"]
print("boto3 %s: all checks passed" % boto3.__version__)
`

// boto3: put/get/head with metadata and content type, ranged GETs,
// listings (v2 and v1) and pagination, upload_file in parts, presigned
// PUTs (SigV2 refused with a clear error, SigV4 works), copy, delete(s).
func TestS3ClientsBoto3(t *testing.T) {
	requireTools(t, "python3")
	if err := exec.Command("python3", "-c", "import boto3").Run(); err != nil {
		t.Fatalf("boto3 is not installed (run make deps): %v", err)
	}
	t.Parallel()
	n := StartNode(t, NodeOptions{})
	alice := n.S3User(n.Admin().CreateUser("alice"))
	dir := t.TempDir()
	script := filepath.Join(dir, "boto3_test.py")
	putLocalFile(t, script, []byte(boto3Script))
	small := randomBytes(t, 1000)
	big := randomBytes(t, 12<<20+4321) // 3 parts of 5 MiB
	putLocalFile(t, filepath.Join(dir, "small"), small)
	putLocalFile(t, filepath.Join(dir, "big"), big)

	r := alice.RunWith(2*time.Minute, nil, "python3", script, "boto", filepath.Join(dir, "small"), filepath.Join(dir, "big"), filepath.Join(dir, "back"))
	if r.Code != 0 {
		t.Fatalf("boto3 script: %s", r)
	}
	t.Logf("%s (%v)", strings.TrimSpace(r.Stdout), r.Took.Round(time.Millisecond))
	root := filepath.Join(n.StoreDir(), "buckets", "boto")
	if !bytes.Equal(mustRead(t, filepath.Join(root, "big", "multi.bin")), big) {
		t.Fatal("the multipart upload's backing file differs from the source")
	}
	if !bytes.Equal(mustRead(t, filepath.Join(root, "docs", "report.txt")), small) {
		t.Fatal("docs/report.txt's backing file differs")
	}
	state := pathStates(t, root)
	if want := []string{"./", "big/", "big/multi.bin", "docs/", "docs/report.txt"}; !slices.Equal(slices.Sorted(maps.Keys(state)), want) {
		t.Fatalf("bucket dir after deletes: %v, want %v", state, want)
	}
}

// rclone: sync a tree of 50 files in nested dirs, check, change the tree
// (content, size, mtime only, added, removed, one file in parts) and sync
// and check again; the bucket directory then equals the local tree.
func TestS3ClientsRclone(t *testing.T) {
	requireTools(t, "rclone")
	t.Parallel()
	n := StartNode(t, NodeOptions{})
	alice := n.S3User(n.Admin().CreateUser("alice"))
	alice.AWSOK("s3", "mb", "s3://sync")
	env := []string{
		"RCLONE_CONFIG=/nonexistent",
		"RCLONE_CONFIG_B_TYPE=s3",
		"RCLONE_CONFIG_B_PROVIDER=Other",
		"RCLONE_CONFIG_B_ENDPOINT=" + alice.Endpoint,
		"RCLONE_CONFIG_B_ACCESS_KEY_ID=" + alice.EnvVar("AWS_ACCESS_KEY_ID"),
		"RCLONE_CONFIG_B_SECRET_ACCESS_KEY=" + alice.EnvVar("AWS_SECRET_ACCESS_KEY"),
		"RCLONE_CONFIG_B_REGION=us-east-1",
		"RCLONE_CONFIG_B_FORCE_PATH_STYLE=true",
		// Files above 6 MiB go in 5 MiB parts.
		"RCLONE_CONFIG_B_UPLOAD_CUTOFF=6Mi",
		"RCLONE_CONFIG_B_CHUNK_SIZE=5Mi",
	}
	// rclone's SDK cannot use a CA bundle from AWS_CA_BUNDLE with its own
	// transport ("LoadCustomCABundleError ... unsupported transport"); the
	// gateway is plain HTTP anyway.
	env = append(env, "AWS_CA_BUNDLE=")
	rclone := func(args ...string) ToolResult {
		t.Helper()
		r := alice.RunWith(2*time.Minute, env, "rclone", args...)
		if r.Code != 0 {
			t.Fatalf("%s", r)
		}
		return r
	}
	local := filepath.Join(t.TempDir(), "tree")
	for i := range 50 {
		p := filepath.Join(local, fmt.Sprintf("d%d", i%4), fmt.Sprintf("e%d", i%3), fmt.Sprintf("f%02d.dat", i))
		if i%10 == 0 {
			p = filepath.Join(local, fmt.Sprintf("top%02d.txt", i))
		}
		putLocalFile(t, p, randomBytes(t, 1+i*997))
	}
	putLocalFile(t, filepath.Join(local, "deep", "a", "b", "c", "d", "e", "f.txt"), []byte("deep"))
	bucket := filepath.Join(n.StoreDir(), "buckets", "sync")
	same := func(what string) {
		t.Helper()
		want, got := readTree(t, local), readTree(t, bucket)
		compareTrees(t, what, got, want)
	}

	r := rclone("sync", local, "B:sync")
	t.Logf("rclone sync of 51 files: %v", r.Took.Round(time.Millisecond))
	rclone("check", local, "B:sync")
	same("after the first sync")

	// Change: same size new bytes (and a new mtime), a new size, mtime only,
	// a new file, a removed file, a big file that goes in parts.
	f1 := filepath.Join(local, "d1", "e1", "f01.dat")
	putLocalFile(t, f1, randomBytes(t, len(mustRead(t, f1))))
	putLocalFile(t, filepath.Join(local, "top20.txt"), []byte("shorter now"))
	touched := filepath.Join(local, "d2", "e0", "f06.dat")
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(touched, later, later); err != nil {
		t.Fatal(err)
	}
	putLocalFile(t, filepath.Join(local, "new", "file.txt"), []byte("new"))
	if err := os.Remove(filepath.Join(local, "d3", "e2", "f11.dat")); err != nil {
		t.Fatal(err)
	}
	putLocalFile(t, filepath.Join(local, "big", "parts.bin"), randomBytes(t, 13<<20))
	r = rclone("sync", "-v", local, "B:sync")
	t.Logf("rclone sync of the changes: %v", r.Took.Round(time.Millisecond))
	rclone("check", local, "B:sync")
	rclone("check", "--download", local, "B:sync")
	same("after the second sync")
	// rclone keeps the mtime in metadata: the touched file's is the new one.
	lsl := rclone("lsl", "B:sync/d2/e0").Stdout
	if !strings.Contains(lsl, later.Local().Format("2006-01-02 15:04:05")) {
		t.Fatalf("rclone lsl after touching f06.dat (mtime %v): %s", later, lsl)
	}
	if _, err := os.Stat(filepath.Join(bucket, "d3", "e2", "f11.dat")); !os.IsNotExist(err) {
		t.Fatalf("a file removed locally is still in the bucket dir: %v", err)
	}
}

// aws-sdk-go-v2: the basic calls, then the refusals: wrong secret, another
// user's bucket, keys that would alias or leave the bucket directory or
// cannot be file names. Each is a clear S3 error, and none writes anything
// anywhere (the store and the data dir are walked before and after).
func TestS3ClientsGoSDK(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	alice := n.S3User(admin.CreateUser("alice"))
	bob := n.S3User(admin.CreateUser("bob"))
	a, b := alice.GoSDK(), bob.GoSDK()
	put := func(c *s3.Client, bucket, key, body string) error {
		_, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: strings.NewReader(body)})
		return err
	}
	get := func(c *s3.Client, bucket, key string) (string, error) {
		out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
		if err != nil {
			return "", err
		}
		defer out.Body.Close()
		body, err := io.ReadAll(out.Body)
		return string(body), err
	}
	list := func(c *s3.Client, bucket, prefix string) ([]string, error) {
		out, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(prefix)})
		if err != nil {
			return nil, err
		}
		var keys []string
		for _, o := range out.Contents {
			keys = append(keys, *o.Key)
		}
		return keys, nil
	}

	if _, err := a.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String("alice-b")}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String("bob-b")}); err != nil {
		t.Fatal(err)
	}
	okKeys := map[string]string{
		"plain":                     "1",
		"dir/sub/file.txt":          "2",
		"unicode/é-ü-日本語.txt":       "3",
		"spaces and+plus=&?#.txt":   "4",
		"dots/..a/a../.hidden/x...": "5",
		"c/" + strings.Repeat("x", 255) + "/" + strings.Repeat("y", 255): "6",
	}
	for k, v := range okKeys {
		if err := put(a, "alice-b", k, v); err != nil {
			t.Fatalf("put %q: %v", k, err)
		}
	}
	for k, v := range okKeys {
		if got, err := get(a, "alice-b", k); err != nil || got != v {
			t.Fatalf("get %q: %q %v", k, got, err)
		}
		if got := string(mustRead(t, filepath.Join(n.StoreDir(), "buckets", "alice-b", filepath.FromSlash(k)))); got != v {
			t.Fatalf("the file of %q holds %q", k, got)
		}
	}
	keys, err := list(a, "alice-b", "")
	if err != nil || len(keys) != len(okKeys) || !slices.IsSorted(keys) {
		t.Fatalf("list: %q %v", keys, err)
	}

	// Snapshot everything basalt keeps on disk (but the embedded etcd's
	// files in DATA/meta, which change on their own).
	storeBefore := pathStates(t, n.StoreDir())
	dataBefore := pathStates(t, n.Data, "meta", filepath.Base(n.StoreDir()))
	// n.Data is TESTTMP/NNN/data: walk TESTTMP, but the data dir itself.
	beside, dataRel := filepath.Dir(filepath.Dir(n.Data)), filepath.Join(filepath.Base(filepath.Dir(n.Data)), filepath.Base(n.Data))
	tmpBefore := pathStates(t, beside, dataRel)

	t.Run("wrongSecret", func(t *testing.T) {
		c := alice.WithSecret("wrong-secret-0000000000000000000000000").GoSDK()
		wantS3Error(t, "put with a wrong secret", put(c, "alice-b", "evil", "x"), "SignatureDoesNotMatch", 403)
		_, err := get(c, "alice-b", "plain")
		wantS3Error(t, "get with a wrong secret", err, "SignatureDoesNotMatch", 403)
		_, err = list(c, "alice-b", "")
		wantS3Error(t, "list with a wrong secret", err, "SignatureDoesNotMatch", 403)
		// An unknown access key.
		u := *alice
		u.Env = slices.Clone(alice.Env)
		for i, e := range u.Env {
			if strings.HasPrefix(e, "AWS_ACCESS_KEY_ID=") {
				u.Env[i] = "AWS_ACCESS_KEY_ID=AKIANOSUCHKEY0000000"
			}
		}
		_, err = list(u.GoSDK(), "alice-b", "")
		wantS3Error(t, "list with an unknown key", err, "InvalidAccessKeyId", 403)
	})

	t.Run("otherUsersBucket", func(t *testing.T) {
		wantS3Error(t, "bob puts into alice's bucket", put(b, "alice-b", "bob.txt", "x"), "AccessDenied", 403)
		_, err := get(b, "alice-b", "plain")
		wantS3Error(t, "bob gets from alice's bucket", err, "AccessDenied", 403)
		_, err = list(b, "alice-b", "")
		wantS3Error(t, "bob lists alice's bucket", err, "AccessDenied", 403)
		_, err = b.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("alice-b"), Key: aws.String("plain")})
		wantS3Error(t, "bob deletes from alice's bucket", err, "AccessDenied", 403)
		_, err = b.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String("alice-b")})
		wantS3Error(t, "bob deletes alice's bucket", err, "AccessDenied", 403)
		_, err = b.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("bob-b"), Key: aws.String("stolen"),
			CopySource: aws.String("alice-b/plain")})
		wantS3Error(t, "bob copies alice's object into his bucket", err, "AccessDenied", 403)
		_, err = b.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String("alice-b")})
		var ae smithy.APIError
		if !errors.As(err, &ae) || (ae.ErrorCode() != "BucketAlreadyExists" && ae.ErrorCode() != "BucketAlreadyOwnedByYou") {
			t.Fatalf("bob creates alice's bucket name: %v", err)
		}
		out, err := b.ListBuckets(ctx, &s3.ListBucketsInput{})
		if err != nil || len(out.Buckets) != 1 || *out.Buckets[0].Name != "bob-b" {
			t.Fatalf("bob's buckets: %v %v", out, err)
		}
	})

	t.Run("badKeys", func(t *testing.T) {
		long := strings.Repeat("k", 300)
		// Keys that clean to "..", ".." + "/..." or "." would be refused
		// by s3api's name check before basalt sees them, as a bare 400
		// "Bad Request" (versitygw v1.8.0, s3api/middlewares/
		// bucket-object-name-validator.go); objects.Middleware answers
		// them first, as InvalidArgument naming the ".." segment.
		const s3apiBare = "InvalidArgument"
		cases := []struct {
			key, code string
		}{
			{"../escape", s3apiBare},
			{"../../escape", s3apiBare},
			{"../../../../../../tmp/escape", s3apiBare},
			{"a/../../escape", s3apiBare},
			{"a/..", s3apiBare},
			{"..", s3apiBare},
			{"a/b/../c", "InvalidArgument"},
			{"a/./b", "InvalidArgument"},
			{"a//b", "InvalidArgument"},
			{"//abs", "InvalidArgument"},
			{"/abs", "InvalidArgument"},
			{"dir/", "InvalidArgument"},
			{long, "KeyTooLongError"},
			{"d/" + long + "/f", "KeyTooLongError"},
			{strings.Repeat("a/", 512) + "b", "KeyTooLongError"},
			{"bad\xff\xfe", "InvalidArgument"},
			{"d/\x80name", "InvalidArgument"},
			{"ctl\x01char", "InvalidArgument"},
			{".basalt-x", "InvalidArgument"},
		}
		for _, c := range cases {
			err := put(a, "alice-b", c.key, "must not be written")
			what := fmt.Sprintf("put %q", c.key)
			if err == nil {
				t.Errorf("%s: accepted", what)
				continue
			}
			var ae smithy.APIError
			var re *awshttp.ResponseError
			if !errors.As(err, &ae) || !errors.As(err, &re) {
				t.Errorf("%s: not an S3 error: %v", what, err)
				continue
			}
			msg := ae.ErrorMessage()
			t.Logf("%-40q -> %d %s: %s", shorten(c.key, 40), re.HTTPStatusCode(), ae.ErrorCode(), msg)
			if re.HTTPStatusCode() != 400 || ae.ErrorCode() != c.code || strings.TrimSpace(msg) == "" {
				t.Errorf("%s: want 400 %s with a message, got %d %s %q", what, c.code, re.HTTPStatusCode(), ae.ErrorCode(), msg)
			}
			// Reads of such keys name no object.
			if _, err := get(a, "alice-b", c.key); err == nil {
				t.Errorf("get %q succeeded", c.key)
			}
		}
		// A copy to a bad key, a multipart upload to one.
		_, err := a.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("alice-b"), Key: aws.String("a/../../copied"),
			CopySource: aws.String("alice-b/plain")})
		if err == nil {
			t.Error("copy to a/../../copied accepted")
		}
		_, err = a.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("alice-b"), Key: aws.String("x//y")})
		if err == nil {
			t.Error("multipart upload to x//y accepted")
		}
		// Bob reaching into alice's bucket through ".." in his own: in a
		// key, in a copy source. None of it answers alice's bytes.
		for _, k := range []string{"../alice-b/plain", "x/../../alice-b/plain", "..%2Falice-b%2Fplain"} {
			if body, err := get(b, "bob-b", k); err == nil {
				t.Errorf("bob gets bob-b/%s: %q", k, body)
			} else {
				t.Logf("bob gets bob-b/%q: %v", k, err)
			}
		}
		for _, src := range []string{"bob-b/../alice-b/plain", "bob-b/x/../../alice-b/plain", "bob-b/..%2Falice-b%2Fplain"} {
			_, err := b.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("bob-b"), Key: aws.String("stolen"), CopySource: aws.String(src)})
			if err == nil {
				t.Errorf("bob copies %s into bob-b/stolen: accepted (holds %q)", src, string(mustRead(t, filepath.Join(n.StoreDir(), "buckets", "bob-b", "stolen"))))
			} else {
				t.Logf("bob copies %q: %v", src, err)
			}
		}
	})

	// Nothing changed anywhere: not in the store (buckets, scratch, other
	// dirs), not in the data dir, not beside it.
	for _, d := range []struct {
		what          string
		before, after map[string]string
	}{
		{"store", storeBefore, pathStates(t, n.StoreDir())},
		{"data dir", dataBefore, pathStates(t, n.Data, "meta", filepath.Base(n.StoreDir()))},
		{"beside the data dir", tmpBefore, pathStates(t, beside, dataRel)},
	} {
		if diff := pathStatesDiff(d.before, d.after); len(diff) > 0 {
			t.Errorf("refused requests changed the %s: %v", d.what, diff)
		}
	}
	if _, err := os.Lstat("/tmp/escape"); !os.IsNotExist(err) {
		t.Errorf("/tmp/escape exists: %v", err)
	}
	// Alice's objects are intact.
	for k, v := range okKeys {
		if got, err := get(a, "alice-b", k); err != nil || got != v {
			t.Fatalf("after the refusals, get %q: %q %v", k, got, err)
		}
	}
	if got, err := http.Get(alice.Endpoint + "/alice-b/plain"); err != nil || got.StatusCode != 403 {
		t.Fatalf("an anonymous GET: %v %v", got, err)
	} else {
		got.Body.Close()
	}
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
