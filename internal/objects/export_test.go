package objects

import (
	"bytes"
	"fmt"
	"golang.org/x/sys/unix"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/basalt-storage/basalt/internal/errs"
)

// wantErrCode requires err to be an *errs.Error with code.
func wantErrCode(t *testing.T, err error, code string) {
	t.Helper()
	e, ok := errs.As(err)
	if !ok || e.Code != code {
		t.Fatalf("error %v, want code %s", err, code)
	}
	if e.Message == "" {
		t.Fatalf("error %s without a message", code)
	}
}

// problems renders a report's problems as "key:problem" strings.
func problems(rep VerifyReport) []string {
	var out []string
	for _, p := range rep.Problems {
		key := p.Key
		if p.VersionID != "" {
			key += " (version " + p.VersionID + ")"
		}
		out = append(out, key+":"+p.Problem)
	}
	return out
}

func verify(t *testing.T, e *env, bucket string, opts VerifyOptions, want ...string) VerifyReport {
	t.Helper()
	rep, err := e.be.Verify(ctx, bucket, opts)
	if err != nil {
		t.Fatalf("verify %s: %v", bucket, err)
	}
	if got := problems(rep); !slices.Equal(got, want) {
		t.Fatalf("verify %s %+v: problems %q, want %q (%+v)", bucket, opts, got, want, rep.Problems)
	}
	for _, p := range rep.Problems {
		if p.Detail == "" {
			t.Errorf("problem %+v without detail", p)
		}
	}
	return rep
}

func writeFile(t *testing.T, p, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// rewriteKeepingStat overwrites p's bytes with data of the same length
// in place and restores its mtime: a change only a re-hash sees.
func rewriteKeepingStat(t *testing.T, p string, off int64, data string) {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(data), off); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
}

func TestExport(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		mkBucket(t, e.alice, "exp")
		t.Run("Lifecycle", e.testExportLifecycle)
		t.Run("Errors", e.testExportErrors)
		t.Run("KeepsMetadata", e.testExportKeepsMetadata)
		t.Run("VerifyContent", e.testVerifyContent)
		t.Run("VerifyMultipart", e.testVerifyMultipart)
		t.Run("Missing", e.testExportMissing)
		t.Run("Path", e.testObjectPath)
		t.Run("ForgedRecord", e.testForgedRecord)
		t.Run("VerifyVersions", e.testVerifyVersions)
		noTempLeft(t, e)
	})
}

// A file written into the bucket directory: invisible, exported, served,
// changed behind S3, reported, re-exported, unexported.
func (e *env) testExportLifecycle(t *testing.T) {
	p := filepath.Join(e.root, "exp", "dir", "f.txt")
	writeFile(t, p, "hello, world")
	_, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("exp"), Key: aws.String("dir/f.txt")})
	wantCode(t, err, "NoSuchKey")
	verify(t, e, "exp", VerifyOptions{})
	rep := verify(t, e, "exp", VerifyOptions{All: true}, "dir/f.txt:unexported")
	if rep.Objects != 0 || rep.Unexported != 1 || rep.Damaged() != 0 {
		t.Fatalf("report %+v", rep)
	}
	// A PUT does not replace the unexported file.
	_, err = e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("exp"), Key: aws.String("dir/f.txt"),
		Body: strings.NewReader("other")})
	wantCode(t, err, "KeyHoldsUnexportedFile")

	oi, err := e.be.Export(ctx, "exp", "dir/f.txt")
	if err != nil {
		t.Fatal(err)
	}
	if oi.ETag != md5hex("hello, world") || oi.Size != 12 || oi.Bucket != "exp" || oi.Key != "dir/f.txt" || oi.Path != p || oi.Inode == 0 {
		t.Fatalf("export: %+v", oi)
	}
	out, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("exp"), Key: aws.String("dir/f.txt")})
	if err != nil {
		t.Fatal(err)
	}
	out.Body.Close()
	if aws.ToString(out.ETag) != `"`+md5hex("hello, world")+`"` || !strings.HasPrefix(aws.ToString(out.ContentType), "text/plain") {
		t.Fatalf("GET after export: etag %s type %s", aws.ToString(out.ETag), aws.ToString(out.ContentType))
	}
	if got := get(t, e.alice, "exp", "dir/f.txt"); got != "hello, world" {
		t.Fatalf("GET: %q", got)
	}
	if ks := keys(t, e.alice, "exp", "", 100); !slices.Equal(ks, []string{"dir/f.txt"}) {
		t.Fatalf("listing: %v", ks)
	}
	if rep := verify(t, e, "exp", VerifyOptions{Content: true, All: true}); rep.Objects != 1 {
		t.Fatalf("report %+v", rep)
	}
	// Exporting again is harmless.
	if oi2, err := e.be.Export(ctx, "exp", "dir/f.txt"); err != nil || oi2.ETag != oi.ETag {
		t.Fatalf("export again: %+v %v", oi2, err)
	}

	// Changed behind S3: refused by GET, reported by verify.
	f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("!")
	f.Close()
	_, err = e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("exp"), Key: aws.String("dir/f.txt")})
	wantCode(t, err, "ObjectModifiedOutsideS3")
	rep = verify(t, e, "exp", VerifyOptions{}, "dir/f.txt:modified")
	if rep.Damaged() != 1 || !strings.Contains(rep.Problems[0].Detail, "size") {
		t.Fatalf("report %+v", rep)
	}

	// Re-exporting accepts the new content.
	oi, err = e.be.Export(ctx, "exp", "dir/f.txt")
	if err != nil || oi.ETag != md5hex("hello, world!") || oi.Size != 13 {
		t.Fatalf("re-export: %+v %v", oi, err)
	}
	if got := get(t, e.alice, "exp", "dir/f.txt"); got != "hello, world!" {
		t.Fatalf("GET after re-export: %q", got)
	}
	verify(t, e, "exp", VerifyOptions{Content: true})

	// An exported object is an object: S3 may overwrite it.
	put(t, e.alice, "exp", "dir/f.txt", "over S3")
	if got := get(t, e.alice, "exp", "dir/f.txt"); got != "over S3" {
		t.Fatalf("GET after PUT: %q", got)
	}

	// Unexport: the file stays, S3 no longer sees it.
	oi, err = e.be.Unexport(ctx, "exp", "dir/f.txt")
	if err != nil || oi.ETag != md5hex("over S3") || oi.Size != 7 {
		t.Fatalf("unexport: %+v %v", oi, err)
	}
	if data, err := os.ReadFile(p); err != nil || string(data) != "over S3" {
		t.Fatalf("file after unexport: %q %v", data, err)
	}
	_, err = e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("exp"), Key: aws.String("dir/f.txt")})
	wantCode(t, err, "NoSuchKey")
	if ks := keys(t, e.alice, "exp", "", 100); len(ks) != 0 {
		t.Fatalf("listing after unexport: %v", ks)
	}
	_, err = e.be.Unexport(ctx, "exp", "dir/f.txt")
	wantErrCode(t, err, CodeNotExported)
	verify(t, e, "exp", VerifyOptions{All: true}, "dir/f.txt:unexported")
	if err := os.RemoveAll(filepath.Join(e.root, "exp", "dir")); err != nil {
		t.Fatal(err)
	}
}

func (e *env) testExportErrors(t *testing.T) {
	dir := filepath.Join(e.root, "exp")
	writeFile(t, filepath.Join(dir, "real", "file"), "x")
	writeFile(t, filepath.Join(dir, ".basalt-reserved"), "x")
	if err := os.Symlink("real/file", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real", filepath.Join(dir, "dirlink")); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(e.dir, "outside")
	writeFile(t, outside, "secret")
	if err := os.Symlink(outside, filepath.Join(dir, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "emptydir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(e.root, "norecord"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ bucket, key, code string }{
		{"nope", "x", CodeNoSuchBucket},
		{"norecord", "x", CodeNoSuchBucket}, // a directory is not a bucket
		{"Bad_Name", "x", CodeInvalidBucketName},
		{"..", "x", CodeInvalidBucketName},
		{"exp", "", CodeInvalidKey},
		{"exp", "a//b", CodeInvalidKey},
		{"exp", "../outside", CodeInvalidKey},
		{"exp", "/abs", CodeInvalidKey},
		{"exp", ".basalt-reserved", CodeInvalidKey},
		{"exp", "real/", CodeInvalidKey},
		{"exp", "missing", CodeNoSuchFile},
		{"exp", "real/file/below", CodeNoSuchFile},
		{"exp", "emptydir", CodeNotARegularFile},
		{"exp", "link", CodeNotARegularFile},
		{"exp", "dirlink/file", CodeNotARegularFile},
		{"exp", "escape", CodeNotARegularFile},
	} {
		_, err := e.be.Export(ctx, c.bucket, c.key)
		wantErrCode(t, err, c.code)
		_, err = e.be.Unexport(ctx, c.bucket, c.key)
		if c.code == CodeNoSuchFile && e.be.MetadataKind() == "sidecar" {
			wantErrCode(t, err, CodeNoSuchFile)
		} else {
			wantErrCode(t, err, c.code)
		}
	}
	_, err := e.be.Verify(ctx, "nope", VerifyOptions{})
	wantErrCode(t, err, CodeNoSuchBucket)
	_, err = e.be.ObjectPath(ctx, "exp", "a//b")
	wantErrCode(t, err, CodeInvalidKey)
	// Hard links: someone else's file linked into the bucket (the server
	// reads it with its own rights), and a file with two names in it.
	if err := os.Link(outside, filepath.Join(dir, "hard")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "two1"), "x")
	if err := os.Link(filepath.Join(dir, "two1"), filepath.Join(dir, "two2")); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"hard", "two1", "two2"} {
		_, err := e.be.Export(ctx, "exp", key)
		wantErrCode(t, err, CodeHardLinked)
		_, err = e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("exp"), Key: aws.String(key)})
		wantCode(t, err, "NoSuchKey")
	}
	// Nothing was recorded: neither the files nor the links' targets
	// are objects, and nothing was written outside the bucket.
	verify(t, e, "exp", VerifyOptions{All: true}, "hard:unexported", "real/file:unexported", "two1:unexported",
		"two2:unexported")
	if data, err := os.ReadFile(outside); err != nil || string(data) != "secret" {
		t.Fatalf("outside file: %q %v", data, err)
	}
	if e.be.MetadataKind() == "xattr" {
		f, _ := os.Open(outside)
		if _, err := fgetxattr(f, xattrName); err != errNoMeta {
			t.Fatalf("outside file has a record: %v", err)
		}
		f.Close()
	}
	for _, p := range []string{"real", ".basalt-reserved", "link", "dirlink", "escape", "emptydir", "hard", "two1", "two2"} {
		os.RemoveAll(filepath.Join(dir, p))
	}
	os.Remove(filepath.Join(e.root, "norecord"))
}

// Re-exporting keeps the content type and user metadata, and drops the
// checksum (no longer true). A file replaced by another (new inode) keeps
// them only with a sidecar: an xattr record went with the old inode.
func (e *env) testExportKeepsMetadata(t *testing.T) {
	_, err := e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("exp"), Key: aws.String("m.json"),
		Body: strings.NewReader("first"), ContentType: aws.String("application/x-mine"),
		Metadata: map[string]string{"colour": "blue"}, ChecksumAlgorithm: types.ChecksumAlgorithmCrc32})
	if err != nil {
		t.Fatal(err)
	}
	head := func(wantType, wantColour, wantBody string) {
		t.Helper()
		h, err := e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("exp"), Key: aws.String("m.json"),
			ChecksumMode: types.ChecksumModeEnabled})
		if err != nil {
			t.Fatal(err)
		}
		if aws.ToString(h.ContentType) != wantType || h.Metadata["colour"] != wantColour || h.ChecksumCRC32 != nil ||
			aws.ToString(h.ETag) != `"`+md5hex(wantBody)+`"` {
			t.Errorf("after re-export: type %s meta %v checksum %v etag %s; want %s %q, no checksum, md5 of %q",
				aws.ToString(h.ContentType), h.Metadata, aws.ToString(h.ChecksumCRC32), aws.ToString(h.ETag),
				wantType, wantColour, wantBody)
		}
	}
	// Changed in place.
	p := filepath.Join(e.root, "exp", "m.json")
	f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("+")
	f.Close()
	_, err = e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("exp"), Key: aws.String("m.json")})
	wantCode(t, err, "ObjectModifiedOutsideS3")
	if _, err := e.be.Export(ctx, "exp", "m.json"); err != nil {
		t.Fatal(err)
	}
	head("application/x-mine", "blue", "first+")

	// Replaced by another file.
	tmp := filepath.Join(e.root, "exp", "m.tmp")
	writeFile(t, tmp, "second")
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	_, err = e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("exp"), Key: aws.String("m.json")})
	if e.be.MetadataKind() == "xattr" {
		wantCode(t, err, "NoSuchKey")
	} else {
		wantCode(t, err, "ObjectModifiedOutsideS3")
	}
	if _, err := e.be.Export(ctx, "exp", "m.json"); err != nil {
		t.Fatal(err)
	}
	if e.be.MetadataKind() == "xattr" {
		head("application/json", "", "second") // a new object: the type guessed from ".json"
	} else {
		head("application/x-mine", "blue", "second")
	}
	if _, err := e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("exp"), Key: aws.String("m.json")}); err != nil {
		t.Fatal(err)
	}
}

// Edits keeping size, mtime and inode are found by re-hashing only.
func (e *env) testVerifyContent(t *testing.T) {
	put(t, e.alice, "exp", "c/one", "0123456789")
	put(t, e.alice, "exp", "c/two", "abcdefghij")
	verify(t, e, "exp", VerifyOptions{Content: true})
	p := filepath.Join(e.root, "exp", "c", "two")
	rewriteKeepingStat(t, p, 3, "XYZ")
	if got := get(t, e.alice, "exp", "c/two"); got != "abcXYZghij" {
		t.Fatalf("GET: %q (a same-stat edit is not detected without reading)", got)
	}
	verify(t, e, "exp", VerifyOptions{})
	rep := verify(t, e, "exp", VerifyOptions{Content: true}, "c/two:content")
	if rep.Objects != 2 || !strings.Contains(rep.Problems[0].Detail, md5hex("abcdefghij")) {
		t.Fatalf("report %+v", rep)
	}
	if _, err := e.be.Export(ctx, "exp", "c/two"); err != nil {
		t.Fatal(err)
	}
	verify(t, e, "exp", VerifyOptions{Content: true})
	for _, k := range []string{"c/one", "c/two"} {
		e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("exp"), Key: aws.String(k)})
	}
}

// A multipart object's ETag is recomputed from its part layout.
func (e *env) testVerifyMultipart(t *testing.T) {
	const mib = 1 << 20
	p1, p2 := bytes.Repeat([]byte("a"), 5*mib), []byte("tail")
	up, err := e.alice.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("exp"), Key: aws.String("mp")})
	if err != nil {
		t.Fatal(err)
	}
	var done []types.CompletedPart
	for i, p := range [][]byte{p1, p2} {
		out, err := e.alice.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("exp"), Key: aws.String("mp"),
			UploadId: up.UploadId, PartNumber: aws.Int32(int32(i + 1)), Body: bytes.NewReader(p)})
		if err != nil {
			t.Fatal(err)
		}
		done = append(done, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(int32(i + 1))})
	}
	c, err := e.alice.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String("exp"),
		Key: aws.String("mp"), UploadId: up.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: done}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(aws.ToString(c.ETag), `-2"`) {
		t.Fatalf("multipart ETag %s", aws.ToString(c.ETag))
	}
	verify(t, e, "exp", VerifyOptions{Content: true})
	rewriteKeepingStat(t, filepath.Join(e.root, "exp", "mp"), 5*mib+1, "A")
	verify(t, e, "exp", VerifyOptions{Content: true}, "mp:content")
	// Re-export: a plain MD5 ETag, and GET ?partNumber no longer splits.
	oi, err := e.be.Export(ctx, "exp", "mp")
	whole := append(slices.Clone(p1), []byte("tAil")...)
	if err != nil || oi.ETag != md5hex(string(whole)) {
		t.Fatalf("re-export: %+v %v", oi, err)
	}
	verify(t, e, "exp", VerifyOptions{Content: true})
	e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("exp"), Key: aws.String("mp")})
}

// A file deleted behind S3: with a sidecar its record is left, reported
// as missing and removed by unexport.
func (e *env) testExportMissing(t *testing.T) {
	put(t, e.alice, "exp", "gone/file", "data")
	if err := os.RemoveAll(filepath.Join(e.root, "exp", "gone")); err != nil {
		t.Fatal(err)
	}
	_, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("exp"), Key: aws.String("gone/file")})
	wantCode(t, err, "NoSuchKey")
	if e.be.MetadataKind() == "xattr" {
		verify(t, e, "exp", VerifyOptions{All: true})
		_, err := e.be.Unexport(ctx, "exp", "gone/file")
		wantErrCode(t, err, CodeNoSuchFile)
		return
	}
	verify(t, e, "exp", VerifyOptions{All: true}, "gone/file:missing")
	oi, err := e.be.Unexport(ctx, "exp", "gone/file")
	if err != nil || oi.ETag != md5hex("data") {
		t.Fatalf("unexport of a missing file: %+v %v", oi, err)
	}
	verify(t, e, "exp", VerifyOptions{All: true})
	_, err = e.be.Unexport(ctx, "exp", "gone/file")
	wantErrCode(t, err, CodeNoSuchFile)

	// A forged record of a file that is gone is removed too.
	put(t, e.alice, "exp", "gone/forged", "data")
	forgeRecord(t, e, "exp", "gone/forged")
	if err := os.RemoveAll(filepath.Join(e.root, "exp", "gone")); err != nil {
		t.Fatal(err)
	}
	verify(t, e, "exp", VerifyOptions{All: true}, "gone/forged:missing")
	if oi, err := e.be.Unexport(ctx, "exp", "gone/forged"); err != nil || oi.ETag != "" {
		t.Fatalf("unexport of a forged record of a missing file: %+v %v", oi, err)
	}
	verify(t, e, "exp", VerifyOptions{All: true})

	// So is the record of a file replaced by a symbolic link (verify
	// reports it missing); the link's target keeps its own.
	put(t, e.alice, "exp", "sym/target", "target")
	put(t, e.alice, "exp", "sym/k", "k")
	link := filepath.Join(e.root, "exp", "sym", "k")
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("target", link); err != nil {
		t.Fatal(err)
	}
	verify(t, e, "exp", VerifyOptions{All: true}, "sym/k:missing")
	if oi, err := e.be.Unexport(ctx, "exp", "sym/k"); err != nil || oi.ETag != md5hex("k") {
		t.Fatalf("unexport of a record whose file is a symbolic link now: %+v %v", oi, err)
	}
	verify(t, e, "exp", VerifyOptions{All: true})
	_, err = e.be.Unexport(ctx, "exp", "sym/k")
	wantErrCode(t, err, CodeNotARegularFile)
	if got := get(t, e.alice, "exp", "sym/target"); got != "target" {
		t.Fatalf("link target: %q", got)
	}
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if _, err := e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("exp"), Key: aws.String("sym/target")}); err != nil {
		t.Fatal(err)
	}
}

func (e *env) testObjectPath(t *testing.T) {
	want := filepath.Join(e.root, "exp", "p", "q.txt")
	pi, err := e.be.ObjectPath(ctx, "exp", "p/q.txt")
	if err != nil || pi.Path != want || pi.Exists || pi.Exported {
		t.Fatalf("path of nothing: %+v %v", pi, err)
	}
	writeFile(t, want, "q")
	if pi, err = e.be.ObjectPath(ctx, "exp", "p/q.txt"); err != nil || !pi.Exists || pi.Exported {
		t.Fatalf("path of a file: %+v %v", pi, err)
	}
	if _, err := e.be.Export(ctx, "exp", "p/q.txt"); err != nil {
		t.Fatal(err)
	}
	if pi, err = e.be.ObjectPath(ctx, "exp", "p/q.txt"); err != nil || !pi.Exists || !pi.Exported || pi.Modified != "" {
		t.Fatalf("path of an object: %+v %v", pi, err)
	}
	later := time.Now().Add(time.Hour)
	os.Chtimes(want, later, later)
	if pi, err = e.be.ObjectPath(ctx, "exp", "p/q.txt"); err != nil || !pi.Exported || !strings.Contains(pi.Modified, "modified") {
		t.Fatalf("path of a modified object: %+v %v", pi, err)
	}
	if filepath.Dir(filepath.Dir(filepath.Dir(pi.Path))) != e.be.Root() {
		t.Fatalf("path %s not under root %s", pi.Path, e.be.Root())
	}
	if _, err := e.be.Unexport(ctx, "exp", "p/q.txt"); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(e.root, "exp", "p"))
}

// forgeRecord gives bucket/key (a file, maybe a version file) a record
// the gateway never writes: part ends going backwards, as a user with
// direct access could set the xattr or write the sidecar.
func forgeRecord(t *testing.T, e *env, bucket, key string) {
	t.Helper()
	const forged = `{"etag":"\"x-2\"","size":12,"parts":[10,4,12],"key":%q}`
	switch m := e.be.meta.(type) {
	case xattrMeta:
		if err := unix.Setxattr(filepath.Join(e.root, bucket, key), xattrName, fmt.Appendf(nil, forged, ""), 0); err != nil {
			t.Fatal(err)
		}
	case *sidecarMeta:
		if err := os.WriteFile(m.path(bucket, key), fmt.Appendf(nil, forged, key), 0o644); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("metadata kind %T", m)
	}
}

// A record written behind S3 that is not one the gateway writes is
// reported as a modification — by GET, verify and the path's status — not
// served and not an internal error; exporting again replaces it, and S3
// overwrites and deletes such an object like any object changed behind S3.
func (e *env) testForgedRecord(t *testing.T) {
	p := filepath.Join(e.root, "exp", "forged.txt")
	writeFile(t, p, "twelve bytes")
	if _, err := e.be.Export(ctx, "exp", "forged.txt"); err != nil {
		t.Fatal(err)
	}
	forgeRecord(t, e, "exp", "forged.txt")
	_, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("exp"), Key: aws.String("forged.txt"),
		PartNumber: aws.Int32(2)})
	wantCode(t, err, "ObjectModifiedOutsideS3")
	if !strings.Contains(err.Error(), "invalid record") {
		t.Fatalf("GET of a forged record: %v", err)
	}
	verify(t, e, "exp", VerifyOptions{}, "forged.txt:modified")
	// Unexport removes it; its answer describes the file (the record
	// says nothing true).
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	oi, err := e.be.Unexport(ctx, "exp", "forged.txt")
	if err != nil || oi.ETag != "" || oi.Size != 12 || !oi.Mtime.Equal(fi.ModTime()) {
		t.Fatalf("unexport of a forged record: %+v %v (file mtime %v)", oi, err, fi.ModTime())
	}
	_, err = e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("exp"), Key: aws.String("forged.txt")})
	wantCode(t, err, "NoSuchKey")
	verify(t, e, "exp", VerifyOptions{All: true}, "forged.txt:unexported")
	if _, err := e.be.Export(ctx, "exp", "forged.txt"); err != nil {
		t.Fatal(err)
	}
	out, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("exp"), Key: aws.String("forged.txt")})
	if err != nil {
		t.Fatalf("GET after export: %v", err)
	}
	out.Body.Close()

	// PUT, CopyObject and CompleteMultipartUpload replace it.
	forgeRecord(t, e, "exp", "forged.txt")
	put(t, e.alice, "exp", "forged.txt", "put over it")
	if got := get(t, e.alice, "exp", "forged.txt"); got != "put over it" {
		t.Fatalf("GET after PUT over a forged record: %q", got)
	}
	forgeRecord(t, e, "exp", "forged.txt")
	put(t, e.alice, "exp", "src", "copied over it")
	if _, err := e.alice.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("exp"), Key: aws.String("forged.txt"),
		CopySource: aws.String("exp/src")}); err != nil {
		t.Fatalf("copy onto a forged record: %v", err)
	}
	if got := get(t, e.alice, "exp", "forged.txt"); got != "copied over it" {
		t.Fatalf("GET after copy over a forged record: %q", got)
	}
	forgeRecord(t, e, "exp", "forged.txt")
	completeUpload(t, e.alice, "exp", "forged.txt", "uploaded over it")
	if got := get(t, e.alice, "exp", "forged.txt"); got != "uploaded over it" {
		t.Fatalf("GET after multipart upload over a forged record: %q", got)
	}
	// DeleteObjects (and DeleteObject) remove it.
	forgeRecord(t, e, "exp", "forged.txt")
	deleteAll(t, e.alice, "exp", "forged.txt", "src")
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("forged object after delete: %v", err)
	}
}

// completeUpload writes bucket/key as a one-part multipart upload.
func completeUpload(t *testing.T, c *s3.Client, bucket, key, body string) *s3.CompleteMultipartUploadOutput {
	t.Helper()
	up, err := c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: &bucket, Key: &key})
	if err != nil {
		t.Fatal(err)
	}
	part, err := c.UploadPart(ctx, &s3.UploadPartInput{Bucket: &bucket, Key: &key, UploadId: up.UploadId,
		PartNumber: aws.Int32(1), Body: strings.NewReader(body)})
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: &bucket, Key: &key,
		UploadId: up.UploadId, MultipartUpload: &types.CompletedMultipartUpload{
			Parts: []types.CompletedPart{{ETag: part.ETag, PartNumber: aws.Int32(1)}}}})
	if err != nil {
		t.Fatalf("complete upload of %s/%s: %v", bucket, key, err)
	}
	return out
}

// deleteAll deletes keys with one DeleteObjects and requires each to succeed.
func deleteAll(t *testing.T, c *s3.Client, bucket string, keys ...string) *s3.DeleteObjectsOutput {
	t.Helper()
	var ids []types.ObjectIdentifier
	for _, k := range keys {
		ids = append(ids, types.ObjectIdentifier{Key: aws.String(k)})
	}
	out, err := c.DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: &bucket, Delete: &types.Delete{Objects: ids}})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range out.Errors {
		t.Errorf("DeleteObjects %s/%s: %s %s", bucket, aws.ToString(e.Key), aws.ToString(e.Code), aws.ToString(e.Message))
	}
	if len(out.Deleted) != len(keys) {
		t.Fatalf("DeleteObjects deleted %d of %d keys", len(out.Deleted), len(keys))
	}
	return out
}

// Verify checks the non-current versions too, and reports them as
// "KEY (version ID)"; delete markers carry no record and are not checked.
func (e *env) testVerifyVersions(t *testing.T) {
	c, bk := e.alice, "exp-ver"
	mkBucket(t, c, bk)
	setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
	v1 := aws.ToString(put(t, c, bk, "d/a", "one").VersionId)
	v2 := aws.ToString(put(t, c, bk, "d/a", "two").VersionId)
	put(t, c, bk, "d/a", "three")
	put(t, c, bk, "b", "b")
	delVersion(t, c, bk, "b", "")
	if rep := verify(t, e, bk, VerifyOptions{Content: true, All: true}); rep.Objects != 4 {
		t.Fatalf("report %+v", rep)
	}
	f, err := os.OpenFile(filepath.Join(e.root, bk, versionFile("d/a", v1)), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("!")
	f.Close()
	rewriteKeepingStat(t, filepath.Join(e.root, bk, versionFile("d/a", v2)), 0, "T")
	verify(t, e, bk, VerifyOptions{}, "d/a (version "+v1+"):modified")
	rep := verify(t, e, bk, VerifyOptions{Content: true}, "d/a (version "+v1+"):modified", "d/a (version "+v2+"):content")
	if rep.Problems[0].Key != "d/a" || rep.Problems[0].VersionID != v1 {
		t.Fatalf("report %+v", rep)
	}
	// A version file deleted behind S3: with a sidecar its record is
	// left, reported missing and removed by DELETE ?versionId=.
	if err := os.Remove(filepath.Join(e.root, bk, versionFile("d/a", v2))); err != nil {
		t.Fatal(err)
	}
	if e.be.MetadataKind() == "sidecar" {
		verify(t, e, bk, VerifyOptions{}, "d/a (version "+v1+"):modified", "d/a (version "+v2+"):missing")
		delVersion(t, c, bk, "d/a", v2)
	}
	verify(t, e, bk, VerifyOptions{}, "d/a (version "+v1+"):modified")
}
