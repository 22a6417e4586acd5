package e2e

// pWalrus direct access through the CLI: `basalt object path|export|
// unexport|verify` against files written straight into a bucket
// directory, checked with the aws cli.

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// objPath is `basalt object path -o json`.
type objPath struct {
	Bucket   string `json:"bucket"`
	Key      string `json:"key"`
	Path     string `json:"path"`
	Exists   bool   `json:"exists"`
	Exported bool   `json:"exported"`
	Modified string `json:"modified"`
}

// objResult is one entry of `basalt object export|unexport -o json`.
type objResult struct {
	Bucket string `json:"bucket"`
	Key    string `json:"key"`
	Path   string `json:"path"`
	ETag   string `json:"etag"`
	Size   *int64 `json:"size"`
	Err    *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// objProblem is one entry of `basalt object verify -o json`.
type objProblem struct {
	Key     string `json:"key"`
	Problem string `json:"problem"`
	Detail  string `json:"detail"`
}

// objRunIn runs `basalt ARGS -o json` as c in directory dir.
func objRunIn(c *Client, dir string, args ...string) Result {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	full := append(append([]string{}, args...), "-o", "json")
	cmd := exec.CommandContext(ctx, basaltBin, full...)
	cmd.Dir = dir
	cmd.Env = append(baseEnv(), "BASALT_ENDPOINT="+c.Endpoint, "BASALT_IDENTITY="+c.Identity)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	start := time.Now()
	err := cmd.Run()
	r := Result{Args: full, Stdout: so.String(), Stderr: se.String(), Took: time.Since(start)}
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			c.t.Fatalf("run basalt %v: %v", full, err)
		}
		r.Code = ee.ExitCode()
	}
	return r
}

// objDecode decodes r's stdout (exactly one JSON value) into out.
func objDecode(t *testing.T, r Result, out any) {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(r.Stdout))
	if err := d.Decode(out); err != nil {
		t.Fatalf("decode JSON of %s: %v", r, err)
	}
	if d.More() {
		t.Fatalf("more than one JSON value on stdout: %s", r)
	}
}

// objExport runs export (or unexport) of paths in dir and requires success.
func objExport(t *testing.T, c *Client, dir, verb string, paths ...string) []objResult {
	t.Helper()
	r := objRunIn(c, dir, append([]string{"object", verb}, paths...)...)
	if r.Code != 0 {
		t.Fatalf("expected success: %s", r)
	}
	var res []objResult
	objDecode(t, r, &res)
	if len(res) == 0 {
		t.Fatalf("no results: %s", r)
	}
	for _, x := range res {
		if x.Err != nil || x.Size == nil || x.ETag == "" {
			t.Fatalf("result %+v: %s", x, r)
		}
	}
	return res
}

// objVerify runs verify and returns its problems and exit code.
func objVerify(t *testing.T, c *Client, bucket string, flags ...string) ([]objProblem, Result) {
	t.Helper()
	r := c.Run(append([]string{"object", "verify", bucket}, flags...)...)
	var ps []objProblem
	objDecode(t, r, &ps)
	damaged := false
	for _, p := range ps {
		if p.Detail == "" {
			t.Errorf("problem without detail: %+v", p)
		}
		damaged = damaged || p.Problem != "unexported"
	}
	switch {
	case damaged && (r.Code != 1 || !strings.Contains(r.Stderr, "ObjectsDamaged")):
		t.Fatalf("verify found damage but did not fail with ObjectsDamaged: %s", r)
	case !damaged && r.Code != 0:
		t.Fatalf("verify found no damage but failed: %s", r)
	}
	return ps, r
}

func md5Of(b []byte) string {
	s := md5.Sum(b)
	return hex.EncodeToString(s[:])
}

// awsGetETag GETs bucket/key with the aws cli into a file and returns the
// bytes and the ETag (unquoted).
func awsGetETag(t *testing.T, u *S3User, bucket, key string) ([]byte, string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "get.bin")
	var meta struct{ ETag string }
	if err := json.Unmarshal([]byte(u.AWSOK("s3api", "get-object", "--bucket", bucket, "--key", key, out)), &meta); err != nil {
		t.Fatal(err)
	}
	return mustRead(t, out), strings.Trim(meta.ETag, `"`)
}

func TestObjectCLI(t *testing.T) {
	requireTools(t, "aws")
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	aliceC, bobC := admin.CreateUser("alice"), admin.CreateUser("bob")
	alice, bob := n.S3User(aliceC), n.S3User(bobC)
	alice.AWSOK("s3", "mb", "s3://alice-pw")
	bob.AWSOK("s3", "mb", "s3://bob-pw")
	buckets := filepath.Join(n.StoreDir(), "buckets")
	realBuckets, err := filepath.EvalSymlinks(buckets)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(buckets, "alice-pw", "data")
	file := filepath.Join(dir, "report.csv")
	realFile := filepath.Join(realBuckets, "alice-pw", "data", "report.csv")

	// Written directly into the bucket directory: invisible over S3.
	data := randomBytes(t, 200<<10+7)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	alice.AWSFail("NoSuchKey", "s3api", "get-object", "--bucket", "alice-pw", "--key", "data/report.csv", filepath.Join(t.TempDir(), "x"))
	if ls := alice.AWSOK("s3", "ls", "--recursive", "s3://alice-pw"); strings.Contains(ls, "report.csv") {
		t.Fatalf("an unexported file is listed: %q", ls)
	}

	// object path: the file's path, not yet an object.
	var p objPath
	aliceC.OK(&p, "object", "path", "s3://alice-pw/data/report.csv")
	if p.Path != realFile && p.Path != file || p.Bucket != "alice-pw" || p.Key != "data/report.csv" || !p.Exists || p.Exported {
		t.Fatalf("object path: %+v (file %s)", p, file)
	}
	if r := aliceC.runRaw("object", "path", "s3://alice-pw/data/report.csv"); r.Code != 0 || strings.TrimSpace(r.Stdout) != p.Path {
		t.Fatalf("object path (table) must print only the path: %s", r)
	}

	// Export, by a path relative to the working directory.
	res := objExport(t, aliceC, dir, "export", "report.csv")
	if len(res) != 1 || res[0].Bucket != "alice-pw" || res[0].Key != "data/report.csv" || res[0].ETag != md5Of(data) ||
		*res[0].Size != int64(len(data)) {
		t.Fatalf("export: %+v", res)
	}
	got, etag := awsGetETag(t, alice, "alice-pw", "data/report.csv")
	if !bytes.Equal(got, data) || etag != md5Of(data) {
		t.Fatalf("GET after export: %d bytes, ETag %s, want %s", len(got), etag, md5Of(data))
	}
	if ls := alice.AWSOK("s3", "ls", "--recursive", "s3://alice-pw"); !strings.Contains(ls, "data/report.csv") {
		t.Fatalf("exported file not listed: %q", ls)
	}
	aliceC.OK(&p, "object", "path", "s3://alice-pw/data/report.csv")
	if !p.Exported || p.Modified != "" {
		t.Fatalf("object path after export: %+v", p)
	}
	if ps, _ := objVerify(t, aliceC, "alice-pw", "--content"); len(ps) != 0 {
		t.Fatalf("verify of a clean bucket: %+v", ps)
	}

	// Changed behind S3: GET refuses it, verify reports it and fails.
	f, err := os.OpenFile(file, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("appended behind S3's back"))
	f.Close()
	data = mustRead(t, file)
	alice.AWSFail("ObjectModifiedOutsideS3", "s3api", "get-object", "--bucket", "alice-pw", "--key", "data/report.csv",
		filepath.Join(t.TempDir(), "x"))
	ps, _ := objVerify(t, aliceC, "alice-pw")
	if len(ps) != 1 || ps[0].Key != "data/report.csv" || ps[0].Problem != "modified" {
		t.Fatalf("verify after a change: %+v", ps)
	}
	if r := aliceC.runRaw("object", "verify", "alice-pw"); r.Code != 1 || !strings.Contains(r.Stdout, "data/report.csv") ||
		!strings.Contains(r.Stdout, "modified") || !strings.Contains(r.Stderr, "do not match their records") {
		t.Fatalf("verify (table) after a change: %s", r)
	}
	aliceC.OK(&p, "object", "path", "s3://alice-pw/data/report.csv")
	if !p.Exported || !strings.Contains(p.Modified, "size") {
		t.Fatalf("object path of a modified object: %+v", p)
	}

	// Re-export, through a symbolic link outside the store: the link is
	// resolved, the new content accepted and served again.
	link := filepath.Join(t.TempDir(), "link-to-report")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	res = objExport(t, aliceC, t.TempDir(), "export", link)
	if res[0].Key != "data/report.csv" || res[0].ETag != md5Of(data) {
		t.Fatalf("re-export: %+v", res)
	}
	if got, etag := awsGetETag(t, alice, "alice-pw", "data/report.csv"); !bytes.Equal(got, data) || etag != md5Of(data) {
		t.Fatalf("GET after re-export: %d bytes, ETag %s", len(got), etag)
	}
	if ps, _ := objVerify(t, aliceC, "alice-pw", "--content"); len(ps) != 0 {
		t.Fatalf("verify after re-export: %+v", ps)
	}

	// Unexport: NoSuchKey over S3, the file stays.
	res = objExport(t, aliceC, "/", "unexport", file)
	if res[0].ETag != md5Of(data) {
		t.Fatalf("unexport: %+v", res)
	}
	alice.AWSFail("NoSuchKey", "s3api", "get-object", "--bucket", "alice-pw", "--key", "data/report.csv", filepath.Join(t.TempDir(), "x"))
	if !bytes.Equal(mustRead(t, file), data) {
		t.Fatal("unexport changed the file")
	}
	if ps, _ := objVerify(t, aliceC, "alice-pw"); len(ps) != 0 {
		t.Fatalf("verify lists unexported files without --all: %+v", ps)
	}
	if ps, _ := objVerify(t, aliceC, "alice-pw", "--all"); len(ps) != 1 || ps[0].Problem != "unexported" {
		t.Fatalf("verify --all: %+v", ps)
	}
	if r := objRunIn(aliceC, "/", "object", "unexport", file); r.Code != 1 || !strings.Contains(r.Stdout, "NotExported") {
		t.Fatalf("unexport of a file that is no object: %s", r)
	}

	// Recursively, a directory of files.
	for _, name := range []string{"set/a.txt", "set/b.txt", "set/sub/c.txt"} {
		putLocal(t, filepath.Join(buckets, "alice-pw", name), []byte(name))
	}
	res = objExport(t, aliceC, "/", "export", "-r", filepath.Join(buckets, "alice-pw", "set"))
	var keys []string
	for _, x := range res {
		keys = append(keys, x.Key)
	}
	if !slices.Equal(keys, []string{"set/a.txt", "set/b.txt", "set/sub/c.txt"}) {
		t.Fatalf("recursive export: %v", keys)
	}
	if got, _ := awsGetETag(t, alice, "alice-pw", "set/sub/c.txt"); string(got) != "set/sub/c.txt" {
		t.Fatalf("GET of a recursively exported file: %q", got)
	}

	// Another user's bucket: refused, nothing recorded.
	other := filepath.Join(buckets, "alice-pw", "other.txt")
	putLocal(t, other, []byte("alice's"))
	r := objRunIn(bobC, "/", "object", "export", other)
	var bres []objResult
	objDecode(t, r, &bres)
	if r.Code != 1 || len(bres) != 1 || bres[0].Err == nil || bres[0].Err.Code != "AccessDenied" || !strings.Contains(r.Stderr, "AccessDenied") {
		t.Fatalf("bob exports in alice's bucket: %s", r)
	}
	bobC.Fail("AccessDenied", "object", "path", "s3://alice-pw/other.txt")
	bobC.Fail("AccessDenied", "object", "verify", "alice-pw")
	alice.AWSFail("NoSuchKey", "s3api", "get-object", "--bucket", "alice-pw", "--key", "other.txt", filepath.Join(t.TempDir(), "x"))
	admin.OK(&p, "object", "path", "s3://alice-pw/other.txt") // administrators: any bucket
	if !p.Exists || p.Exported {
		t.Fatalf("admin's object path: %+v", p)
	}
	// Alice cannot reach bob's bucket either.
	putLocal(t, filepath.Join(buckets, "bob-pw", "b.txt"), []byte("bob's"))
	if r := objRunIn(aliceC, "/", "object", "export", filepath.Join(buckets, "bob-pw", "b.txt")); r.Code != 1 || !strings.Contains(r.Stdout, "AccessDenied") {
		t.Fatalf("alice exports in bob's bucket: %s", r)
	}

	// Paths outside the buckets directory: refused before anything is
	// sent, even with valid paths beside them; nothing recorded.
	outside := filepath.Join(t.TempDir(), "outside.txt")
	putLocal(t, outside, []byte("not in a bucket"))
	escape := filepath.Join(buckets, "alice-pw", "escape")
	if err := os.Symlink(outside, escape); err != nil {
		t.Fatal(err)
	}
	up, err := filepath.Rel(filepath.Join(buckets, "alice-pw"), outside)
	if err != nil {
		t.Fatal(err)
	}
	before := objTreeState(t, n.StoreDir())
	for _, args := range [][]string{
		{outside},
		{escape}, // a link inside a bucket leading out
		{filepath.Join(buckets, "alice-pw") + "/" + up}, // ".." out of the bucket
		{other, outside},                     // one bad path fails them all
		{filepath.Join(buckets, "alice-pw")}, // a bucket directory is not a file
		{buckets},
	} {
		aliceC.Fail("PathOutsideBuckets", append([]string{"object", "export"}, args...)...)
	}
	if after := objTreeState(t, n.StoreDir()); !maps.Equal(before, after) {
		t.Fatalf("refused exports changed the store:\nbefore %v\nafter  %v", before, after)
	}
	if _, err := unix.Getxattr(outside, "user.basalt.object", make([]byte, 4096)); !errors.Is(err, unix.ENODATA) && !errors.Is(err, unix.ENOTSUP) {
		t.Fatalf("the outside file got a record: %v", err)
	}
	alice.AWSFail("NoSuchKey", "s3api", "get-object", "--bucket", "alice-pw", "--key", "other.txt", filepath.Join(t.TempDir(), "x"))

	// Bad arguments.
	aliceC.Fail("InvalidURI", "object", "path", "alice-pw/other.txt")
	aliceC.Fail("InvalidURI", "object", "path", "s3://alice-pw")
	aliceC.Fail("InvalidKey", "object", "path", "s3://alice-pw/a//b")
	aliceC.Fail("InvalidKey", "object", "path", "s3://alice-pw/.basalt-x")
	aliceC.Fail("NoSuchBucket", "object", "path", "s3://no-such-bucket/k")
	aliceC.Fail("InvalidBucketName", "object", "path", "s3://Bad_Bucket/k")
	aliceC.Fail("NoSuchBucket", "object", "verify", "no-such-bucket")
	if r := objRunIn(aliceC, "/", "object", "export", filepath.Join(buckets, "alice-pw", "missing.txt")); r.Code != 1 || !strings.Contains(r.Stdout, "NoSuchFile") {
		t.Fatalf("export of a missing file: %s", r)
	}
}

// putLocal writes a file, creating its directories.
func putLocal(t *testing.T, p string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// objTreeState maps every entry under dir to its type, size, mtime and
// basalt xattr: any write, record included, changes it.
func objTreeState(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		x := make([]byte, 64<<10)
		n, _ := unix.Lgetxattr(p, "user.basalt.object", x)
		out[p] = fmt.Sprintf("%v %d %d %q", fi.Mode(), fi.Size(), fi.ModTime().UnixNano(), x[:max(n, 0)])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
