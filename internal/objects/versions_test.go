package objects

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
)

func TestVersioning(t *testing.T) {
	inBothModes(t, func(t *testing.T, e *env, mode string) {
		t.Run("Enabled", e.testVersionsEnabled)
		t.Run("Suspended", e.testVersionsSuspended)
		t.Run("Unversioned", e.testVersionsOff)
		t.Run("CopyMultipart", e.testVersionsCopyMultipart)
		t.Run("ListPages", e.testVersionsList)
		t.Run("Changed", e.testVersionsChanged)
		t.Run("Forged", e.testVersionsForged)
		t.Run("Concurrent", e.testVersionsConcurrent)
		t.Run("MarkerGone", e.testVersionsMarkerGone)
		t.Run("FailAfterChange", e.testVersionsFailAfterChange)
		t.Run("KeyBelowVersions", e.testVersionsKeyBelow)
		t.Run("Exported", e.testVersionsExported)
		t.Run("RestoreBlocked", e.testVersionsRestoreBlocked)
		t.Run("OldLayout", e.testVersionsOldLayout)
		noTempLeft(t, e)
	})
}

func setVersioning(t *testing.T, c *s3.Client, bucket string, st types.BucketVersioningStatus) {
	t.Helper()
	_, err := c.PutBucketVersioning(ctx, &s3.PutBucketVersioningInput{Bucket: &bucket,
		VersioningConfiguration: &types.VersioningConfiguration{Status: st}})
	if err != nil {
		t.Fatal(err)
	}
}

func getVersion(t *testing.T, c *s3.Client, bucket, key, vid string) (string, error) {
	t.Helper()
	out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: &bucket, Key: &key, VersionId: &vid})
	if err != nil {
		return "", err
	}
	defer out.Body.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(out.Body); err != nil {
		t.Fatal(err)
	}
	if aws.ToString(out.VersionId) != vid && !(vid == "null" && out.VersionId == nil) {
		t.Errorf("get %s?versionId=%s answered version %q", key, vid, aws.ToString(out.VersionId))
	}
	return buf.String(), nil
}

func delVersion(t *testing.T, c *s3.Client, bucket, key, vid string) *s3.DeleteObjectOutput {
	t.Helper()
	in := &s3.DeleteObjectInput{Bucket: &bucket, Key: &key}
	if vid != "" {
		in.VersionId = &vid
	}
	out, err := c.DeleteObject(ctx, in)
	if err != nil {
		t.Fatalf("delete %s?versionId=%s: %v", key, vid, err)
	}
	return out
}

// versions lists the versions of bucket as "key@id[*]" (* = IsLatest,
// "key@id!" for delete markers) in the listing's order (keys ascending,
// newest first within a key).
func versions(t *testing.T, c *s3.Client, bucket, prefix string, max int32) []string {
	t.Helper()
	var out []string
	in := &s3.ListObjectVersionsInput{Bucket: &bucket, Prefix: &prefix, MaxKeys: &max}
	for pages := 0; ; pages++ {
		if pages > 100 {
			t.Fatal("ListObjectVersions does not end")
		}
		page, err := c.ListObjectVersions(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		type ent struct {
			key, s string
		}
		var ents []ent
		for _, v := range page.Versions {
			s := *v.Key + "@" + *v.VersionId
			if aws.ToBool(v.IsLatest) {
				s += "*"
			}
			ents = append(ents, ent{*v.Key, s})
		}
		for _, m := range page.DeleteMarkers {
			s := *m.Key + "@" + *m.VersionId + "!"
			if aws.ToBool(m.IsLatest) {
				s += "*"
			}
			ents = append(ents, ent{*m.Key, s})
		}
		if int32(len(ents)) > max {
			t.Fatalf("page of %d entries, max %d", len(ents), max)
		}
		// Versions and markers come in separate lists: order by key,
		// then by id descending (ids are chronological).
		slices.SortStableFunc(ents, func(a, b ent) int {
			if a.key != b.key {
				return strings.Compare(a.key, b.key)
			}
			ia := strings.TrimRight(a.s[len(a.key)+1:], "*!")
			ib := strings.TrimRight(b.s[len(b.key)+1:], "*!")
			return strings.Compare(ib, ia)
		})
		for _, e := range ents {
			out = append(out, e.s)
		}
		if !aws.ToBool(page.IsTruncated) {
			return out
		}
		in.KeyMarker, in.VersionIdMarker = page.NextKeyMarker, page.NextVersionIdMarker
	}
}

func (e *env) testVersionsEnabled(t *testing.T) {
	c, bk := e.alice, "ver-on"
	mkBucket(t, c, bk)
	setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
	v1 := aws.ToString(put(t, c, bk, "dir/k", "one").VersionId)
	v2 := aws.ToString(put(t, c, bk, "dir/k", "two").VersionId)
	if !validVersionID(v1) || !validVersionID(v2) || v1 == "null" || v2 <= v1 {
		t.Fatalf("version ids %q %q", v1, v2)
	}
	if got := get(t, c, bk, "dir/k"); got != "two" {
		t.Fatalf("current %q", got)
	}
	for vid, want := range map[string]string{v1: "one", v2: "two"} {
		if got, err := getVersion(t, c, bk, "dir/k", vid); err != nil || got != want {
			t.Fatalf("version %s: %q %v", vid, got, err)
		}
	}
	h, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bk), Key: aws.String("dir/k"), VersionId: &v1})
	if err != nil || aws.ToInt64(h.ContentLength) != 3 || aws.ToString(h.VersionId) != v1 {
		t.Fatalf("head v1: %+v %v", h, err)
	}
	// The old version is an ordinary file with the old bytes.
	vfile := filepath.Join(e.root, bk, ".basalt-versions", "dir/k", ".basalt-version."+v1)
	if b, err := os.ReadFile(vfile); err != nil || string(b) != "one" {
		t.Fatalf("version file: %q %v", b, err)
	}
	if got := keys(t, c, bk, "", 1000); !slices.Equal(got, []string{"dir/k"}) {
		t.Fatalf("list %v", got)
	}
	lo, err := c.ListObjects(ctx, &s3.ListObjectsInput{Bucket: aws.String(bk), Delimiter: aws.String("/")})
	if err != nil || len(lo.Contents) != 0 || len(lo.CommonPrefixes) != 1 || *lo.CommonPrefixes[0].Prefix != "dir/" {
		t.Fatalf("list with delimiter: %+v %v", lo, err)
	}
	_, err = c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bk), Key: aws.String(".basalt-versions/dir/k/" + v1)})
	wantCode(t, err, "NoSuchKey")
	if got := versions(t, c, bk, "", 1000); !slices.Equal(got, []string{"dir/k@" + v2 + "*", "dir/k@" + v1}) {
		t.Fatalf("versions %v", got)
	}
	// DELETE: a delete marker.
	d := delVersion(t, c, bk, "dir/k", "")
	if !aws.ToBool(d.DeleteMarker) || !validVersionID(aws.ToString(d.VersionId)) {
		t.Fatalf("delete: %+v", d)
	}
	m := *d.VersionId
	if _, err := os.Stat(filepath.Join(e.root, bk, ".basalt-versions", "dir/k", ".basalt-version."+m+".delete-marker")); err != nil {
		t.Fatal(err)
	}
	_, err = c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bk), Key: aws.String("dir/k")})
	wantCode(t, err, "NoSuchKey")
	_, err = getVersion(t, c, bk, "dir/k", m)
	wantCode(t, err, "MethodNotAllowed")
	if got := keys(t, c, bk, "", 1000); len(got) != 0 {
		t.Fatalf("list after delete %v", got)
	}
	if got := versions(t, c, bk, "", 1000); !slices.Equal(got, []string{"dir/k@" + m + "!*", "dir/k@" + v2, "dir/k@" + v1}) {
		t.Fatalf("versions %v", got)
	}
	// Old versions still readable; a bucket with versions is not empty.
	if got, err := getVersion(t, c, bk, "dir/k", v2); err != nil || got != "two" {
		t.Fatalf("v2 after delete: %q %v", got, err)
	}
	_, err = c.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(bk)})
	wantCode(t, err, "BucketNotEmpty")
	// Removing the marker brings v2 back.
	d = delVersion(t, c, bk, "dir/k", m)
	if !aws.ToBool(d.DeleteMarker) || aws.ToString(d.VersionId) != m {
		t.Fatalf("delete marker: %+v", d)
	}
	if got := get(t, c, bk, "dir/k"); got != "two" {
		t.Fatalf("after removing the marker %q", got)
	}
	// Removing the current version promotes the previous one.
	delVersion(t, c, bk, "dir/k", v2)
	if got := get(t, c, bk, "dir/k"); got != "one" {
		t.Fatalf("after removing v2 %q", got)
	}
	if got := versions(t, c, bk, "", 1000); !slices.Equal(got, []string{"dir/k@" + v1 + "*"}) {
		t.Fatalf("versions %v", got)
	}
	_, err = getVersion(t, c, bk, "dir/k", v2)
	wantCode(t, err, "NoSuchVersion")
	_, err = getVersion(t, c, bk, "dir/k", "bogus")
	wantCode(t, err, "InvalidArgument")
	delVersion(t, c, bk, "dir/k", v1)
	if got := versions(t, c, bk, "", 1000); len(got) != 0 {
		t.Fatalf("versions %v", got)
	}
	if left := files(t, filepath.Join(e.root, bk)); len(left) != 0 {
		t.Fatalf("files left: %v", left)
	}
	if _, err := os.Stat(filepath.Join(e.root, bk, ".basalt-versions")); !os.IsNotExist(err) {
		t.Fatalf(".basalt-versions not pruned: %v", err)
	}
	if sc := filepath.Join(e.work, "sidecar", bk); e.be.MetadataKind() == "sidecar" {
		if left := files(t, sc); len(left) != 0 {
			t.Fatalf("sidecar records left: %v", left)
		}
	}
	// DeleteObjects: without a version id a marker, with one that version.
	v3 := aws.ToString(put(t, c, bk, "x", "three").VersionId)
	put(t, c, bk, "x", "four")
	dr, err := c.DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: aws.String(bk), Delete: &types.Delete{
		Objects: []types.ObjectIdentifier{{Key: aws.String("x"), VersionId: &v3}, {Key: aws.String("x")}}}})
	if err != nil || len(dr.Errors) != 0 || len(dr.Deleted) != 2 {
		t.Fatalf("delete objects: %+v %v", dr, err)
	}
	if got := versions(t, c, bk, "", 1000); len(got) != 2 || !strings.HasSuffix(got[0], "!*") {
		t.Fatalf("versions %v", got)
	}
	_, err = c.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(bk)})
	wantCode(t, err, "BucketNotEmpty")
}

func (e *env) testVersionsSuspended(t *testing.T) {
	c, bk := e.alice, "ver-susp"
	mkBucket(t, c, bk)
	// Written before versioning: the null version, kept when enabled.
	put(t, c, bk, "k", "null-1")
	setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
	v1 := aws.ToString(put(t, c, bk, "k", "v1").VersionId)
	if got, err := getVersion(t, c, bk, "k", "null"); err != nil || got != "null-1" {
		t.Fatalf("null version: %q %v", got, err)
	}
	setVersioning(t, c, bk, types.BucketVersioningStatusSuspended)
	if vid := aws.ToString(put(t, c, bk, "k", "null-2").VersionId); vid != "null" {
		t.Fatalf("suspended put: version %q", vid)
	}
	// The new null version replaced the old one; v1 was kept.
	if got, err := getVersion(t, c, bk, "k", "null"); err != nil || got != "null-2" {
		t.Fatalf("null version: %q %v", got, err)
	}
	if got, err := getVersion(t, c, bk, "k", v1); err != nil || got != "v1" {
		t.Fatalf("v1: %q %v", got, err)
	}
	put(t, c, bk, "k", "null-3")
	if got := versions(t, c, bk, "", 1000); !slices.Equal(got, []string{"k@" + v1, "k@null*"}) {
		// null sorts by time, not by id: check the set and IsLatest.
		if len(got) != 2 || !slices.Contains(got, "k@null*") || !slices.Contains(got, "k@"+v1) {
			t.Fatalf("versions %v", got)
		}
	}
	// Suspended DELETE: a null delete marker replaces the null version.
	d := delVersion(t, c, bk, "k", "")
	if !aws.ToBool(d.DeleteMarker) || aws.ToString(d.VersionId) != "null" {
		t.Fatalf("delete: %+v", d)
	}
	_, err := getVersion(t, c, bk, "k", "null")
	wantCode(t, err, "MethodNotAllowed")
	if got, err := getVersion(t, c, bk, "k", v1); err != nil || got != "v1" {
		t.Fatalf("v1: %q %v", got, err)
	}
	// Removing the null marker promotes v1.
	delVersion(t, c, bk, "k", "null")
	if got := get(t, c, bk, "k"); got != "v1" {
		t.Fatalf("after removing the null marker %q", got)
	}
}

func (e *env) testVersionsOff(t *testing.T) {
	c, bk := e.alice, "ver-off"
	mkBucket(t, c, bk)
	if vid := put(t, c, bk, "k", "a").VersionId; vid != nil {
		t.Fatalf("unversioned put answered version %q", *vid)
	}
	if got, err := getVersion(t, c, bk, "k", "null"); err != nil || got != "a" {
		t.Fatalf("null version: %q %v", got, err)
	}
	_, err := getVersion(t, c, bk, "k", newVersionID())
	wantCode(t, err, "NoSuchVersion")
	put(t, c, bk, "k", "b")
	if _, err := os.Stat(filepath.Join(e.root, bk, ".basalt-versions")); !os.IsNotExist(err) {
		t.Fatalf("unversioned bucket keeps versions: %v", err)
	}
	if got := versions(t, c, bk, "", 1000); !slices.Equal(got, []string{"k@null*"}) {
		t.Fatalf("versions %v", got)
	}
	d := delVersion(t, c, bk, "k", "")
	if d.DeleteMarker != nil {
		t.Fatalf("unversioned delete made a marker: %+v", d)
	}
	if got := versions(t, c, bk, "", 1000); len(got) != 0 {
		t.Fatalf("versions %v", got)
	}
	if _, err := c.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(bk)}); err != nil {
		t.Fatal(err)
	}
}

func (e *env) testVersionsCopyMultipart(t *testing.T) {
	c, bk := e.alice, "ver-copy"
	mkBucket(t, c, bk)
	setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
	v1 := aws.ToString(put(t, c, bk, "k", "old").VersionId)
	put(t, c, bk, "k", "new")
	// Restore v1 by copying it onto the key.
	cp, err := c.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String(bk), Key: aws.String("k"),
		CopySource: aws.String(bk + "/k?versionId=" + v1)})
	if err != nil {
		t.Fatal(err)
	}
	if got := get(t, c, bk, "k"); got != "old" {
		t.Fatalf("after copy %q", got)
	}
	if n := len(versions(t, c, bk, "k", 1000)); n != 3 {
		t.Fatalf("%d versions after copy, want 3", n)
	}
	if aws.ToString(cp.VersionId) == "" || aws.ToString(cp.VersionId) == v1 {
		t.Fatalf("copy version %q", aws.ToString(cp.VersionId))
	}
	// A completed multipart upload keeps the previous version too.
	up, err := c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String(bk), Key: aws.String("k")})
	if err != nil {
		t.Fatal(err)
	}
	pt, err := c.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String(bk), Key: aws.String("k"), UploadId: up.UploadId,
		PartNumber: aws.Int32(1), Body: strings.NewReader("multi")})
	if err != nil {
		t.Fatal(err)
	}
	done, err := c.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String(bk),
		Key: aws.String("k"), UploadId: up.UploadId, MultipartUpload: &types.CompletedMultipartUpload{
			Parts: []types.CompletedPart{{PartNumber: aws.Int32(1), ETag: pt.ETag}}}})
	if err != nil {
		t.Fatal(err)
	}
	if !validVersionID(aws.ToString(done.VersionId)) {
		t.Fatalf("multipart version %q", aws.ToString(done.VersionId))
	}
	if got := get(t, c, bk, "k"); got != "multi" {
		t.Fatalf("after multipart %q", got)
	}
	if got, err := getVersion(t, c, bk, "k", *cp.VersionId); err != nil || got != "old" {
		t.Fatalf("copy version: %q %v", got, err)
	}
	if n := len(versions(t, c, bk, "k", 1000)); n != 4 {
		t.Fatalf("%d versions after multipart, want 4", n)
	}
}

func (e *env) testVersionsList(t *testing.T) {
	c, bk := e.alice, "ver-list"
	mkBucket(t, c, bk)
	setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
	for _, k := range []string{"a", "b/1", "b/2", "c"} {
		put(t, c, bk, k, k+"-1")
		put(t, c, bk, k, k+"-2")
	}
	delVersion(t, c, bk, "c", "")
	all := versions(t, c, bk, "", 1000)
	if len(all) != 9 {
		t.Fatalf("versions %v", all)
	}
	for _, max := range []int32{1, 2, 4} {
		if got := versions(t, c, bk, "", max); !slices.Equal(got, all) {
			t.Fatalf("pages of %d: %v, want %v", max, got, all)
		}
	}
	if got := versions(t, c, bk, "b/", 1000); len(got) != 4 || !strings.HasPrefix(got[0], "b/1@") {
		t.Fatalf("prefix b/: %v", got)
	}
	out, err := c.ListObjectVersions(ctx, &s3.ListObjectVersionsInput{Bucket: aws.String(bk), Delimiter: aws.String("/")})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.CommonPrefixes) != 1 || *out.CommonPrefixes[0].Prefix != "b/" || len(out.Versions) != 4 ||
		len(out.DeleteMarkers) != 1 {
		t.Fatalf("delimiter: %d prefixes, %d versions, %d markers", len(out.CommonPrefixes), len(out.Versions),
			len(out.DeleteMarkers))
	}
	// Paging with a delimiter: a, b/, c.
	var seen []string
	in := &s3.ListObjectVersionsInput{Bucket: aws.String(bk), Delimiter: aws.String("/"), MaxKeys: aws.Int32(1)}
	for range 20 {
		p, err := c.ListObjectVersions(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		for _, cp := range p.CommonPrefixes {
			seen = append(seen, *cp.Prefix)
		}
		for _, v := range p.Versions {
			seen = append(seen, *v.Key)
		}
		for _, m := range p.DeleteMarkers {
			seen = append(seen, *m.Key+"!")
		}
		if !aws.ToBool(p.IsTruncated) {
			break
		}
		in.KeyMarker, in.VersionIdMarker = p.NextKeyMarker, p.NextVersionIdMarker
	}
	if want := []string{"a", "a", "b/", "c!", "c", "c"}; !slices.Equal(seen, want) {
		t.Fatalf("paged with delimiter: %v, want %v", seen, want)
	}
}

func (e *env) testVersionsChanged(t *testing.T) {
	c, bk := e.alice, "ver-changed"
	mkBucket(t, c, bk)
	setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
	v1 := aws.ToString(put(t, c, bk, "k", "original").VersionId)
	put(t, c, bk, "k", "second")
	vfile := filepath.Join(e.root, bk, ".basalt-versions", "k", ".basalt-version."+v1)
	f, err := os.OpenFile(vfile, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("!")
	f.Close()
	_, err = getVersion(t, c, bk, "k", v1)
	wantCode(t, err, "ObjectModifiedOutsideS3")
	out, err := c.ListObjectVersions(ctx, &s3.ListObjectVersionsInput{Bucket: aws.String(bk)})
	if err != nil {
		t.Fatal(err)
	}
	flagged := false
	for _, v := range out.Versions {
		if *v.VersionId == v1 {
			flagged = string(v.StorageClass) == string(storageClassModified) && v.ETag == nil
		}
	}
	if !flagged {
		t.Fatalf("changed version not flagged: %+v", out.Versions)
	}
	// The current one is unaffected, and the changed version can be deleted.
	if got := get(t, c, bk, "k"); got != "second" {
		t.Fatalf("current %q", got)
	}
	delVersion(t, c, bk, "k", v1)
	if _, err := os.Stat(vfile); !os.IsNotExist(err) {
		t.Fatalf("version file still there: %v", err)
	}
}

// lostID is the version id a file whose record is invalid goes by.
func (e *env) lostID(t *testing.T, bucket, p string) string {
	t.Helper()
	fi, err := os.Stat(filepath.Join(e.root, bucket, p))
	if err != nil {
		t.Fatal(err)
	}
	return lostVersionID(statOf(fi))
}

// sameSet: got and want hold the same strings, in any order. (A lost
// version id's time is the file's mtime, which the kernel takes from a
// coarse clock: it may sort before a version id drawn a moment earlier.)
func sameSet(got, want []string) bool {
	got, want = slices.Clone(got), slices.Clone(want)
	slices.Sort(got)
	slices.Sort(want)
	return slices.Equal(got, want)
}

// modifiedVersions lists the versions of bucket flagged as modified
// outside S3 (no ETag, storage class MODIFIED_OUTSIDE_S3), as "key@id".
func modifiedVersions(t *testing.T, c *s3.Client, bucket string) []string {
	t.Helper()
	out, err := c.ListObjectVersions(ctx, &s3.ListObjectVersionsInput{Bucket: &bucket})
	if err != nil {
		t.Fatal(err)
	}
	var mod []string
	for _, v := range out.Versions {
		if string(v.StorageClass) == string(storageClassModified) && v.ETag == nil {
			mod = append(mod, *v.Key+"@"+*v.VersionId)
		}
	}
	return mod
}

// An object whose record is invalid (forged behind S3) has lost its
// version id: it is listed as the latest version under lostVersionID,
// flagged modified; PUT, CopyObject, CompleteMultipartUpload and DELETE
// keep it as that version (its record marking it modified), and it can
// be deleted by that id. A version file with an invalid record is
// restored as the current object, still modified.
func (e *env) testVersionsForged(t *testing.T) {
	c, bk := e.alice, "ver-forged"
	mkBucket(t, c, bk)
	setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
	v0 := aws.ToString(put(t, c, bk, "k", "zero").VersionId)
	put(t, c, bk, "k", "one")
	forgeRecord(t, e, bk, "k")
	lost := e.lostID(t, bk, "k")
	if got := versions(t, c, bk, "", 1000); !sameSet(got, []string{"k@" + lost + "*", "k@" + v0}) {
		t.Fatalf("versions with a forged current record: %v", got)
	}
	if got := modifiedVersions(t, c, bk); !slices.Equal(got, []string{"k@" + lost}) {
		t.Fatalf("modified versions %v", got)
	}
	_, err := getVersion(t, c, bk, "k", lost)
	wantCode(t, err, "ObjectModifiedOutsideS3")

	// PUT keeps it as version lost, still modified.
	v2 := aws.ToString(put(t, c, bk, "k", "two").VersionId)
	if got := versions(t, c, bk, "", 1000); !sameSet(got, []string{"k@" + v2 + "*", "k@" + lost, "k@" + v0}) {
		t.Fatalf("versions after PUT over a forged record: %v", got)
	}
	_, err = getVersion(t, c, bk, "k", lost)
	wantCode(t, err, "ObjectModifiedOutsideS3")
	if b, err := os.ReadFile(filepath.Join(e.root, bk, versionFile("k", lost))); err != nil || string(b) != "one" {
		t.Fatalf("kept version file: %q %v", b, err)
	}
	if got := get(t, c, bk, "k"); got != "two" {
		t.Fatalf("current %q", got)
	}

	// CopyObject and CompleteMultipartUpload keep it too.
	put(t, c, bk, "src", "copied")
	forgeRecord(t, e, bk, "k")
	lostCopy := e.lostID(t, bk, "k")
	if _, err := c.CopyObject(ctx, &s3.CopyObjectInput{Bucket: &bk, Key: aws.String("k"), CopySource: aws.String(bk + "/src")}); err != nil {
		t.Fatalf("copy onto a forged record: %v", err)
	}
	forgeRecord(t, e, bk, "k")
	lostUpload := e.lostID(t, bk, "k")
	completeUpload(t, c, bk, "k", "uploaded")
	for vid, want := range map[string]string{lostCopy: "two", lostUpload: "copied"} {
		if b, err := os.ReadFile(filepath.Join(e.root, bk, versionFile("k", vid))); err != nil || string(b) != want {
			t.Fatalf("version %s: %q %v", vid, b, err)
		}
		_, err = getVersion(t, c, bk, "k", vid)
		wantCode(t, err, "ObjectModifiedOutsideS3")
	}

	// DELETE keeps it and adds a delete marker; DeleteObjects alike.
	forgeRecord(t, e, bk, "k")
	lostDel := e.lostID(t, bk, "k")
	if d := delVersion(t, c, bk, "k", ""); !aws.ToBool(d.DeleteMarker) {
		t.Fatalf("delete: %+v", d)
	}
	put(t, c, bk, "multi", "m")
	forgeRecord(t, e, bk, "multi")
	lostMulti := e.lostID(t, bk, "multi")
	deleteAll(t, c, bk, "multi")
	for _, kv := range [][2]string{{"k", lostDel}, {"multi", lostMulti}} {
		_, err = getVersion(t, c, bk, kv[0], kv[1])
		wantCode(t, err, "ObjectModifiedOutsideS3")
	}
	if got := modifiedVersions(t, c, bk); !sameSet(got, []string{"k@" + lostDel, "k@" + lostUpload, "k@" + lostCopy,
		"k@" + lost, "multi@" + lostMulti}) {
		t.Fatalf("modified versions %v", got)
	}
	// ... and it is deleted by its id.
	for _, vid := range []string{lostDel, lostUpload, lostCopy, lost} {
		delVersion(t, c, bk, "k", vid)
		if _, err := os.Stat(filepath.Join(e.root, bk, versionFile("k", vid))); !os.IsNotExist(err) {
			t.Fatalf("version %s after delete: %v", vid, err)
		}
	}

	// A forged current object is deleted by its id, and the version
	// below it (forged too) is restored: current, and still modified.
	p1 := aws.ToString(put(t, c, bk, "p", "first").VersionId)
	put(t, c, bk, "p", "second")
	forgeRecord(t, e, bk, versionFile("p", p1))
	forgeRecord(t, e, bk, "p")
	delVersion(t, c, bk, "p", e.lostID(t, bk, "p"))
	if b, err := os.ReadFile(filepath.Join(e.root, bk, "p")); err != nil || string(b) != "first" {
		t.Fatalf("restored version: %q %v", b, err)
	}
	_, err = c.GetObject(ctx, &s3.GetObjectInput{Bucket: &bk, Key: aws.String("p")})
	wantCode(t, err, "ObjectModifiedOutsideS3")
	if got := versions(t, c, bk, "p", 1000); !slices.Equal(got, []string{"p@" + p1 + "*"}) {
		t.Fatalf("versions after restoring a forged version: %v", got)
	}
	delVersion(t, c, bk, "p", p1)

	// Suspended: a forged current object is no null version to replace.
	put(t, c, bk, "susp", "kept")
	forgeRecord(t, e, bk, "susp")
	lostS := e.lostID(t, bk, "susp")
	setVersioning(t, c, bk, types.BucketVersioningStatusSuspended)
	put(t, c, bk, "susp", "null")
	if got := versions(t, c, bk, "susp", 1000); !sameSet(got, []string{"susp@null*", "susp@" + lostS}) {
		t.Fatalf("versions after a suspended PUT over a forged record: %v", got)
	}
}

// Concurrent versioned PUTs of one key: every write is kept as a version.
func (e *env) testVersionsConcurrent(t *testing.T) {
	c, bk := e.alice, "ver-conc"
	mkBucket(t, c, bk)
	setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
	const n = 16
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			out, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bk), Key: aws.String("k"),
				Body: strings.NewReader(fmt.Sprint("body-", i))})
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = aws.ToString(out.VersionId)
		})
	}
	wg.Wait()
	for i, vid := range ids {
		if got, err := getVersion(t, c, bk, "k", vid); err != nil || got != fmt.Sprint("body-", i) {
			t.Errorf("version %d (%s): %q %v", i, vid, got, err)
		}
	}
	if got := versions(t, c, bk, "", 1000); len(got) != n {
		t.Fatalf("%d versions, want %d: %v", len(got), n, got)
	}
}

// A page ends at a version that is deleted before the next page is asked
// for: the next page goes on from where that version was in the listing's
// order (key, then newest first), skipping nothing. max-keys 0 answers an
// empty page that is not truncated (a truncated one with no next marker
// made paginators loop forever).
func (e *env) testVersionsMarkerGone(t *testing.T) {
	c, bk := e.alice, "ver-marker"
	mkBucket(t, c, bk)
	setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
	var ids []string
	for i := range 4 {
		ids = append(ids, aws.ToString(put(t, c, bk, "k", fmt.Sprint("k-", i)).VersionId))
	}
	m := aws.ToString(delVersion(t, c, bk, "m", "").VersionId) // a delete marker, the only entry of m
	l := aws.ToString(put(t, c, bk, "l", "l").VersionId)
	z := aws.ToString(put(t, c, bk, "z", "z").VersionId)
	// from lists the versions after the marker, as versions() does.
	from := func(key, vid string) []string {
		t.Helper()
		out, err := c.ListObjectVersions(ctx, &s3.ListObjectVersionsInput{Bucket: aws.String(bk),
			KeyMarker: aws.String(key), VersionIdMarker: aws.String(vid)})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, v := range out.Versions {
			s := *v.Key + "@" + *v.VersionId
			if aws.ToBool(v.IsLatest) {
				s += "*"
			}
			got = append(got, s)
		}
		for _, dm := range out.DeleteMarkers {
			got = append(got, *dm.Key+"@"+*dm.VersionId+"!")
		}
		return got
	}
	page, err := c.ListObjectVersions(ctx, &s3.ListObjectVersionsInput{Bucket: aws.String(bk), MaxKeys: aws.Int32(1)})
	if err != nil {
		t.Fatal(err)
	}
	if aws.ToString(page.NextKeyMarker) != "k" || aws.ToString(page.NextVersionIdMarker) != ids[3] {
		t.Fatalf("first page ends at %s@%s, want k@%s", aws.ToString(page.NextKeyMarker),
			aws.ToString(page.NextVersionIdMarker), ids[3])
	}
	// The marker, the current version, is deleted: the next newest
	// becomes current and comes next.
	delVersion(t, c, bk, "k", ids[3])
	want := []string{"k@" + ids[2] + "*", "k@" + ids[1], "k@" + ids[0], "l@" + l + "*", "z@" + z + "*", "m@" + m + "!"}
	if got := from("k", ids[3]); !slices.Equal(got, want) {
		t.Fatalf("after a deleted current version: %v, want %v", got, want)
	}
	// A non-current marker deleted.
	delVersion(t, c, bk, "k", ids[1])
	want = []string{"k@" + ids[0], "l@" + l + "*", "z@" + z + "*", "m@" + m + "!"}
	if got := from("k", ids[1]); !slices.Equal(got, want) {
		t.Fatalf("after a deleted non-current version: %v, want %v", got, want)
	}
	// A marker that still exists is skipped up to and including itself.
	want = []string{"k@" + ids[0], "l@" + l + "*", "z@" + z + "*", "m@" + m + "!"}
	if got := from("k", ids[2]); !slices.Equal(got, want) {
		t.Fatalf("after an existing version: %v, want %v", got, want)
	}
	// A deleted delete marker, all of its key gone.
	delVersion(t, c, bk, "m", m)
	want = []string{"z@" + z + "*"}
	if got := from("m", m); !slices.Equal(got, want) {
		t.Fatalf("after a deleted delete marker: %v, want %v", got, want)
	}
	// max-keys 0.
	out, err := c.ListObjectVersions(ctx, &s3.ListObjectVersionsInput{Bucket: aws.String(bk), MaxKeys: aws.Int32(0)})
	if err != nil {
		t.Fatal(err)
	}
	if aws.ToBool(out.IsTruncated) || len(out.Versions)+len(out.DeleteMarkers)+len(out.CommonPrefixes) != 0 {
		t.Fatalf("max-keys 0: truncated %v, %d versions, %d markers, %d prefixes (next %q)", aws.ToBool(out.IsTruncated),
			len(out.Versions), len(out.DeleteMarkers), len(out.CommonPrefixes), aws.ToString(out.NextKeyMarker))
	}
}

// A PUT whose publish fails after its rename (the directory's fsync), or
// a DELETE that fails after its unlink, keeps the version it had kept of
// the object it replaced or removed: by then the version file is that
// object's only link, and undoing the keeping would destroy it.
func (e *env) testVersionsFailAfterChange(t *testing.T) {
	c, bk := e.alice, "ver-fail"
	mkBucket(t, c, bk)
	setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
	v1 := aws.ToString(put(t, c, bk, "k", "one").VersionId)
	failAt := func(op string) {
		f := func(o, _ string) error {
			if o == op {
				return errors.New("injected failure at " + op)
			}
			return nil
		}
		fsFault.Store(&f)
	}
	t.Cleanup(func() { fsFault.Store(nil) })
	failAt("sync dir")
	_, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bk), Key: aws.String("k"), Body: strings.NewReader("two")})
	fsFault.Store(nil)
	if err == nil {
		t.Fatal("PUT with a failing directory sync succeeded")
	}
	if got, err := getVersion(t, c, bk, "k", v1); err != nil || got != "one" {
		t.Fatalf("version 1 after a PUT that failed after its rename: %q %v", got, err)
	}
	head, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bk), Key: aws.String("k")})
	if err != nil {
		t.Fatal(err)
	}
	v2 := aws.ToString(head.VersionId)
	if got := get(t, c, bk, "k"); got != "two" {
		t.Fatalf("current object after a PUT that failed after its rename: %q", got)
	}
	failAt("delete sync dir")
	_, err = c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(bk), Key: aws.String("k")})
	fsFault.Store(nil)
	if err == nil {
		t.Fatal("DELETE with a failing directory sync succeeded")
	}
	for vid, want := range map[string]string{v1: "one", v2: "two"} {
		if got, err := getVersion(t, c, bk, "k", vid); err != nil || got != want {
			t.Fatalf("version %s after a DELETE that failed after its unlink: %q %v", vid, got, err)
		}
	}
	// A DELETE that fails before its unlink (a precondition) undoes the
	// keeping: the object stays current, and no version is added.
	put(t, c, bk, "p", "current")
	_, err = c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(bk), Key: aws.String("p"), IfMatch: aws.String(`"nope"`)})
	if err == nil {
		t.Fatal("DELETE with a failing If-Match succeeded")
	}
	if got := versions(t, c, bk, "p", 1000); len(got) != 1 {
		t.Fatalf("versions of p after a refused DELETE: %v", got)
	}
	if got := get(t, c, bk, "p"); got != "current" {
		t.Fatalf("p after a refused DELETE: %q", got)
	}
}

// testVersionsKeyBelow: key "a" keeps versions (its null version among
// them) while keys below it, named like those versions, keep their own.
func (e *env) testVersionsKeyBelow(t *testing.T) {
	c, bk := e.alice, "ver-below"
	mkBucket(t, c, bk)
	put(t, c, bk, "a", "a-null")
	setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
	va := aws.ToString(put(t, c, bk, "a", "a-1").VersionId)
	ma := aws.ToString(delVersion(t, c, bk, "a", "").VersionId)
	// "a" is no current object now, so keys below it can be written;
	// each is written twice, so its first version is kept too.
	below := map[string][]string{}
	for _, k := range []string{"a/null", "a/" + va, "a/" + ma + ".delete-marker"} {
		for i := 0; i < 2; i++ {
			vid := aws.ToString(put(t, c, bk, k, fmt.Sprintf("%s-%d", k, i)).VersionId)
			below[k] = append(below[k], vid)
		}
	}
	if got, err := getVersion(t, c, bk, "a", "null"); err != nil || got != "a-null" {
		t.Fatalf("a@null: %q %v", got, err)
	}
	if got, err := getVersion(t, c, bk, "a", va); err != nil || got != "a-1" {
		t.Fatalf("a@%s: %q %v", va, got, err)
	}
	want := []string{"a@" + ma + "!*", "a@" + va, "a@null"}
	for k, vids := range below {
		if got, err := getVersion(t, c, bk, k, vids[0]); err != nil || got != k+"-0" {
			t.Fatalf("%s@%s: %q %v", k, vids[0], got, err)
		}
		want = append(want, k+"@"+vids[1]+"*", k+"@"+vids[0])
	}
	if got := versions(t, c, bk, "", 1000); !sameSet(got, want) {
		t.Fatalf("versions %v, want %v", got, want)
	}
}

// testVersionsExported: an export is one of the key's writes. Exporting
// an object again keeps its version id (it once made the object the null
// version, and the next PUT then replaced the key's real null version);
// a file exported new becomes a version as a PUT's object would.
func (e *env) testVersionsExported(t *testing.T) {
	c, bk := e.alice, "ver-export"
	mkBucket(t, c, bk)
	put(t, c, bk, "k", "k-null")
	setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
	v1 := aws.ToString(put(t, c, bk, "k", "k-1").VersionId)
	if _, err := e.be.Export(ctx, bk, "k"); err != nil {
		t.Fatal(err)
	}
	if got, err := getVersion(t, c, bk, "k", v1); err != nil || got != "k-1" {
		t.Fatalf("k@%s after its export: %q %v", v1, got, err)
	}
	v2 := aws.ToString(put(t, c, bk, "k", "k-2").VersionId)
	want := []string{"k@" + v2 + "*", "k@" + v1, "k@null"}
	if got := versions(t, c, bk, "k", 1000); !sameSet(got, want) {
		t.Fatalf("versions %v, want %v", got, want)
	}
	if got, err := getVersion(t, c, bk, "k", "null"); err != nil || got != "k-null" {
		t.Fatalf("k@null: %q %v", got, err)
	}

	// A file written directly where the key has only old versions and a
	// delete marker: exported, it is a new version.
	m := aws.ToString(delVersion(t, c, bk, "k", "").VersionId)
	writeFile(t, filepath.Join(e.root, bk, "k"), "k-direct")
	if _, err := e.be.Export(ctx, bk, "k"); err != nil {
		t.Fatal(err)
	}
	v3 := aws.ToString(put(t, c, bk, "k", "k-3").VersionId)
	got := versions(t, c, bk, "k", 1000)
	known := []string{"k@" + v3 + "*", "k@" + m + "!", "k@" + v2, "k@" + v1, "k@null"}
	direct := slices.DeleteFunc(slices.Clone(got), func(v string) bool { return slices.Contains(known, v) })
	if len(got) != 6 || len(direct) != 1 {
		t.Fatalf("versions %v: want the exported file's beside %v", got, known)
	}
	id := strings.TrimPrefix(direct[0], "k@")
	if d, err := getVersion(t, c, bk, "k", id); err != nil || d != "k-direct" || !validVersionID(id) || id == nullVersion {
		t.Fatalf("the exported file's version %q: %q %v", id, d, err)
	}

	// Suspended: an object keeps its id; a new file is the null version
	// and replaces the non-current one, as a PUT does.
	setVersioning(t, c, bk, types.BucketVersioningStatusSuspended)
	put(t, c, bk, "s", "s-null")
	setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
	vs := aws.ToString(put(t, c, bk, "s", "s-1").VersionId)
	setVersioning(t, c, bk, types.BucketVersioningStatusSuspended)
	if _, err := e.be.Export(ctx, bk, "s"); err != nil {
		t.Fatal(err)
	}
	put(t, c, bk, "s", "s-2")
	if got, err := getVersion(t, c, bk, "s", vs); err != nil || got != "s-1" {
		t.Fatalf("s@%s after its export with versioning suspended: %q %v", vs, got, err)
	}
	// Key t: a non-current null version, then a delete marker.
	put(t, c, bk, "t", "t-null")
	setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
	vt := aws.ToString(put(t, c, bk, "t", "t-1").VersionId)
	mt := aws.ToString(delVersion(t, c, bk, "t", "").VersionId)
	setVersioning(t, c, bk, types.BucketVersioningStatusSuspended)
	writeFile(t, filepath.Join(e.root, bk, "t"), "t-direct")
	if _, err := e.be.Export(ctx, bk, "t"); err != nil {
		t.Fatal(err)
	}
	want = []string{"t@null*", "t@" + mt + "!", "t@" + vt}
	if got := versions(t, c, bk, "t", 1000); !sameSet(got, want) {
		t.Fatalf("versions %v, want %v", got, want)
	}
	if got, err := getVersion(t, c, bk, "t", "null"); err != nil || got != "t-direct" {
		t.Fatalf("t@null: %q %v", got, err)
	}
}

// testVersionsRestoreBlocked: deleting a key's newest delete marker
// restores the version below it as the current object; where the key's
// path is taken meanwhile (a directory of longer keys, a file written
// directly, a file where its directory would be), the DELETE is refused
// and changes nothing, as a PUT of the key would be.
func (e *env) testVersionsRestoreBlocked(t *testing.T) {
	c, bk := e.alice, "ver-restore"
	mkBucket(t, c, bk)
	setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
	refused := func(key, vid, code string) {
		t.Helper()
		before := versions(t, c, bk, "", 1000)
		_, err := c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bk, Key: &key, VersionId: &vid})
		var ae smithy.APIError
		if !errors.As(err, &ae) || ae.ErrorCode() != code {
			t.Fatalf("delete %s?versionId=%s: %v, want %s", key, vid, err, code)
		}
		if after := versions(t, c, bk, "", 1000); !slices.Equal(after, before) {
			t.Fatalf("the refused delete changed the versions: %v, then %v", before, after)
		}
	}
	va := aws.ToString(put(t, c, bk, "a", "a-1").VersionId)
	ma := aws.ToString(delVersion(t, c, bk, "a", "").VersionId)
	put(t, c, bk, "a/b", "ab")
	refused("a", ma, "ExistingObjectIsDirectory")

	vy := aws.ToString(put(t, c, bk, "x/y", "xy-1").VersionId)
	my := aws.ToString(delVersion(t, c, bk, "x/y", "").VersionId)
	put(t, c, bk, "x", "x")
	refused("x/y", my, "ObjectParentIsFile")

	vf := aws.ToString(put(t, c, bk, "f", "f-1").VersionId)
	mf := aws.ToString(delVersion(t, c, bk, "f", "").VersionId)
	writeFile(t, filepath.Join(e.root, bk, "f"), "f-direct")
	refused("f", mf, "KeyHoldsUnexportedFile")
	// Nor can a delete marker be a copy's source.
	_, err := c.CopyObject(ctx, &s3.CopyObjectInput{Bucket: &bk, Key: aws.String("g"), CopySource: aws.String(bk + "/f?versionId=" + mf)})
	var ae smithy.APIError
	if !errors.As(err, &ae) || ae.ErrorCode() != "InvalidRequest" || !strings.Contains(ae.ErrorMessage(), "delete marker") {
		t.Fatalf("copy of a delete marker: %v, want InvalidRequest naming it", err)
	}

	// Taken between the DELETE's check and its restore: a PUT of a longer
	// key (under a lock of its own) makes the key's path a directory.
	vr := aws.ToString(put(t, c, bk, "r", "r-1").VersionId)
	mr := aws.ToString(delVersion(t, c, bk, "r", "").VersionId)
	restoreChecked = func(_, key string) {
		if key == "r" {
			if err := os.Mkdir(filepath.Join(e.root, bk, "r"), 0o755); err != nil {
				t.Error(err)
			}
		}
	}
	refused("r", mr, "ExistingObjectIsDirectory")
	restoreChecked = nil
	if err := os.Remove(filepath.Join(e.root, bk, "r")); err != nil {
		t.Fatal(err)
	}

	// Once the path is free, the same deletes restore the versions.
	for _, k := range []string{"a/b", "x"} {
		for _, v := range versions(t, c, bk, k, 1000) {
			if key, id, _ := strings.Cut(strings.TrimRight(v, "*!"), "@"); key == k {
				delVersion(t, c, bk, k, id)
			}
		}
	}
	if err := os.Remove(filepath.Join(e.root, bk, "f")); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ key, marker, vid, data string }{{"a", ma, va, "a-1"}, {"x/y", my, vy, "xy-1"}, {"f", mf, vf, "f-1"}, {"r", mr, vr, "r-1"}} {
		delVersion(t, c, bk, r.key, r.marker)
		if got, err := getVersion(t, c, bk, r.key, r.vid); err != nil || got != r.data {
			t.Fatalf("%s@%s restored: %q %v", r.key, r.vid, got, err)
		}
		out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: &bk, Key: &r.key})
		if err != nil {
			t.Fatalf("GET %s after its marker's delete: %v", r.key, err)
		}
		out.Body.Close()
	}
}

// testVersionsOldLayout: versions kept under the names of the first
// layout (.basalt-versions/<key>/<id>) are renamed when a gateway starts
// and then listed, served and deleted as before, records and all.
func (e *env) testVersionsOldLayout(t *testing.T) {
	c, bk := e.alice, "ver-old"
	mkBucket(t, c, bk)
	put(t, c, bk, "d/k", "null-0")
	setVersioning(t, c, bk, types.BucketVersioningStatusEnabled)
	v1 := aws.ToString(put(t, c, bk, "d/k", "one").VersionId)
	put(t, c, bk, "d/k", "two")
	m := aws.ToString(delVersion(t, c, bk, "d/k", "").VersionId)
	before := versions(t, c, bk, "", 1000)
	if len(before) != 4 {
		t.Fatalf("versions %v", before)
	}
	// Back to the first layout: each file under its old name, a sidecar
	// record under its old pseudo-key.
	dir := filepath.Join(e.root, bk, ".basalt-versions", "d", "k")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, ent := range ents {
		name, ok := strings.CutPrefix(ent.Name(), versionPrefix)
		if !ok {
			t.Fatalf("unexpected file %s", ent.Name())
		}
		if err := os.Rename(filepath.Join(dir, ent.Name()), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
		if sc, ok := e.be.meta.(*sidecarMeta); ok && !strings.HasSuffix(name, markerSuffix) {
			newKey, oldKey := ".basalt-versions/d/k/"+ent.Name(), ".basalt-versions/d/k/"+name
			rec, err := sc.read(nil, bk, newKey)
			if err != nil {
				t.Fatal(err)
			}
			if err := sc.commit(bk, oldKey, rec, func() error { return nil }); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(sc.path(bk, newKey)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.Remove(filepath.Join(e.work, layoutDone)); err != nil {
		t.Fatal(err)
	}
	if got := versions(t, c, bk, "", 1000); len(got) != 0 {
		t.Fatalf("old-layout names listed before the migration: %v", got)
	}
	// A gateway starting over the same store migrates them.
	b, err := New(Config{Root: e.root, Work: e.work, Buckets: e.buckets, Sidecar: e.be.MetadataKind() == "sidecar"})
	if err != nil {
		t.Fatal(err)
	}
	b.Shutdown()
	if _, err := os.Stat(filepath.Join(e.work, layoutDone)); err != nil {
		t.Fatalf("migration not recorded: %v", err)
	}
	if got := versions(t, c, bk, "", 1000); !slices.Equal(got, before) {
		t.Fatalf("versions after the migration %v, want %v", got, before)
	}
	if got, err := getVersion(t, c, bk, "d/k", v1); err != nil || got != "one" {
		t.Fatalf("v1: %q %v", got, err)
	}
	if got, err := getVersion(t, c, bk, "d/k", "null"); err != nil || got != "null-0" {
		t.Fatalf("null: %q %v", got, err)
	}
	rep, err := e.be.Verify(ctx, bk, VerifyOptions{Content: true, All: true})
	if err != nil || len(rep.Problems) != 0 {
		t.Fatalf("verify after the migration: %+v %v", rep, err)
	}
	// Deleting the marker brings "two" back.
	delVersion(t, c, bk, "d/k", m)
	if got := get(t, c, bk, "d/k"); got != "two" {
		t.Fatalf("current %q", got)
	}
	if sc, ok := e.be.meta.(*sidecarMeta); ok {
		if _, err := os.Stat(sc.path(bk, ".basalt-versions/d/k/"+v1)); !os.IsNotExist(err) {
			t.Fatalf("old-layout record left: %v", err)
		}
	}
}
