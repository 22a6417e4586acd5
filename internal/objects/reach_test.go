package objects

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/versity/versitygw/s3response"
	"golang.org/x/sys/unix"
)

// twoMappedUsers is an env whose alice is mapped to the uid mallory and
// bob to victim, both trusted, with a bucket each: "mine" (mallory's
// directory) and "vic" (the victim's).
func twoMappedUsers(t *testing.T, mallory, victim int) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("files of other uids need root") // CI runs as root
	}
	e := newEnv(t, false)
	a := e.iam["AKALICE"]
	a.UserID, a.GroupID = mallory, mallory
	e.iam["AKALICE"] = a
	b := e.iam["AKBOB"]
	b.UserID, b.GroupID = victim, victim
	e.iam["AKBOB"] = b
	openUp(t, e.root)
	e.be.trustFile = filepath.Join(e.dir, "trust-{uid}")
	for uid, key := range map[int]string{mallory: "AKALICE", victim: "AKBOB"} {
		p := strings.ReplaceAll(e.be.trustFile, "{uid}", strconv.Itoa(uid))
		must(t, os.WriteFile(p, []byte(key+"\n"), 0o600))
		must(t, os.Chown(p, uid, uid))
	}
	mkBucket(t, e.bob, "vic")
	mkBucket(t, e.alice, "mine")
	return e
}

func runAs(t *testing.T, uid int, script string, args ...string) {
	t.Helper()
	if out, err := asUser(uid, uid, script, args...); err != nil {
		t.Fatalf("as uid %d: %v: %s", uid, err, out)
	}
}

// apiMessage is the message of an S3 error answer.
func apiMessage(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorMessage()
	}
	return ""
}

// listed is what the three listings say of one key.
type listed struct {
	etag, class string
	size        int64
	mtime       time.Time
}

func listings(t *testing.T, c *s3.Client, bucket string) map[string][3]listed {
	t.Helper()
	out := map[string][3]listed{}
	set := func(key string, i int, l listed) {
		v := out[key]
		v[i] = l
		out[key] = v
	}
	v2, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: &bucket})
	must(t, err)
	for _, o := range v2.Contents {
		set(*o.Key, 0, listed{aws.ToString(o.ETag), string(o.StorageClass), aws.ToInt64(o.Size), aws.ToTime(o.LastModified)})
	}
	v1, err := c.ListObjects(ctx, &s3.ListObjectsInput{Bucket: &bucket})
	must(t, err)
	for _, o := range v1.Contents {
		set(*o.Key, 1, listed{aws.ToString(o.ETag), string(o.StorageClass), aws.ToInt64(o.Size), aws.ToTime(o.LastModified)})
	}
	vs, err := c.ListObjectVersions(ctx, &s3.ListObjectVersionsInput{Bucket: &bucket})
	must(t, err)
	for _, o := range vs.Versions {
		if aws.ToBool(o.IsLatest) {
			set(*o.Key, 2, listed{aws.ToString(o.ETag), string(o.StorageClass), aws.ToInt64(o.Size), aws.ToTime(o.LastModified)})
		}
	}
	return out
}

// checkDenied: every listing flags key (GET refuses it), showing nothing
// of the file.
func checkDenied(t *testing.T, got map[string][3]listed, key string) {
	t.Helper()
	for i, l := range got[key] {
		what := []string{"ListObjectsV2", "ListObjects", "ListObjectVersions"}[i]
		if l.class != "ACCESS_DENIED" || l.etag != "" || l.size != 0 || !l.mtime.Equal(time.Unix(0, 0)) {
			t.Errorf("%s shows %s, which GET refuses: %+v", what, key, l)
		}
	}
}

func checkListed(t *testing.T, got map[string][3]listed, key, body string) {
	t.Helper()
	for i, l := range got[key] {
		what := []string{"ListObjectsV2", "ListObjects", "ListObjectVersions"}[i]
		if l.class != "STANDARD" || l.etag != `"`+md5hex(body)+`"` || l.size != int64(len(body)) {
			t.Errorf("%s lists %s as %+v", what, key, l)
		}
	}
}

// Listings show nothing of a file GET refuses (ownerMayRead): a private
// object of another user moved into the bucket keeps its name in the
// listing, flagged ACCESS_DENIED, with no ETag, size 0 and the epoch for
// Last-Modified — also when it was changed behind S3, which is otherwise
// flagged with the file's size and mtime, and for a version file.
func TestListingsFlagRefusedFiles(t *testing.T) {
	const mallory, victim = 4310, 4311
	e := twoMappedUsers(t, mallory, victim)
	vic, mine := filepath.Join(e.root, "vic"), filepath.Join(e.root, "mine")
	runAs(t, victim, `mkdir "$1/team" && chmod 777 "$1/team"`, vic)
	put(t, e.bob, "vic", "team/secret", "the victim's secret")
	put(t, e.bob, "vic", "team/touched", "another secret")
	put(t, e.bob, "vic", "team/public", "anyone may read this")
	runAs(t, victim, `chmod 600 "$1/team/secret" "$1/team/touched"`, vic)
	runAs(t, mallory, `set -e
mv "$1/team/secret" "$2/stolen"
mkdir "$2/d"
mv "$1/team/touched" "$2/d/touched"
mv "$1/team/public" "$2/d/public"`, vic, mine)
	// A change behind S3 (by its owner, say).
	then := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	must(t, os.Chtimes(filepath.Join(mine, "d", "touched"), then, then))
	put(t, e.alice, "mine", "own", "mine")
	runAs(t, mallory, `chmod 600 "$1/own"`, mine)

	got := listings(t, e.alice, "mine")
	checkDenied(t, got, "stolen")
	// Refused before it is found changed: the listing shows neither its
	// size nor its mtime, nor does GET's answer.
	checkDenied(t, got, "d/touched")
	checkListed(t, got, "d/public", "anyone may read this")
	checkListed(t, got, "own", "mine")
	_, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("mine"), Key: aws.String("d/touched")})
	if code(err) != "AccessDenied" {
		t.Errorf("GET of another user's changed private file: %v, want AccessDenied", err)
	}
	if m := apiMessage(err); strings.Contains(m, "2001") || strings.Contains(m, "size") {
		t.Errorf("GET's refusal tells how the file changed: %s", m)
	}

	// A version file GET refuses is flagged too.
	mkBucket(t, e.alice, "ver")
	setVersioning(t, e.alice, "ver", types.BucketVersioningStatusEnabled)
	old := put(t, e.alice, "ver", "k", "old")
	put(t, e.alice, "ver", "k", "new")
	vf := filepath.Join(e.root, "ver", versionFile("k", *old.VersionId))
	must(t, os.Chmod(vf, 0o600))
	must(t, os.Chown(vf, victim, victim))
	if _, err := getVersion(t, e.alice, "ver", "k", *old.VersionId); code(err) != "AccessDenied" {
		t.Errorf("GET of a refused version: %v, want AccessDenied", err)
	}
	vs, err := e.alice.ListObjectVersions(ctx, &s3.ListObjectVersionsInput{Bucket: aws.String("ver")})
	must(t, err)
	if len(vs.Versions) != 2 {
		t.Fatalf("versions: %+v", vs.Versions)
	}
	for _, v := range vs.Versions {
		refused := aws.ToString(v.VersionId) == *old.VersionId
		if refused != (v.StorageClass == "ACCESS_DENIED") || refused && (v.ETag != nil || aws.ToInt64(v.Size) != 0) {
			t.Errorf("version %s listed as %s, etag %s, size %d", aws.ToString(v.VersionId), v.StorageClass,
				aws.ToString(v.ETag), aws.ToInt64(v.Size))
		}
	}
}

// A world-readable file kept in a directory that others may not enter
// (and that is not the file owner's bucket) is no more served than a
// private one: the bucket's owner could not read it directly, and export
// refuses it.
func TestGetRefusesFileInClosedDirectory(t *testing.T) {
	const mallory, victim = 4320, 4321
	e := twoMappedUsers(t, mallory, victim)
	vic, mine := filepath.Join(e.root, "vic"), filepath.Join(e.root, "mine")
	// Mallory shares a project directory; the victim keeps an object there
	// in a directory of their own that others may not enter.
	runAs(t, mallory, `mkdir "$1/proj" && chmod 777 "$1/proj"`, mine)
	put(t, e.bob, "vic", "pub", "the victim's, behind a closed door")
	runAs(t, victim, `set -e
mkdir -m 700 "$2/proj/closed"
mv "$1/pub" "$2/proj/closed/pub"`, vic, mine)
	if out, err := asUser(mallory, mallory, `cat "$1/proj/closed/pub"`, mine); err == nil {
		t.Fatalf("mallory reads the file directly: %s", out)
	}
	const key = "proj/closed/pub"

	if o, ok := e.be.quickOpen("mine", key); ok {
		o.f.Close()
		t.Error("quickOpen took a file in a directory others may not enter")
	}
	g, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("mine"), Key: aws.String(key)})
	if err == nil {
		body, _ := io.ReadAll(g.Body)
		g.Body.Close()
		t.Errorf("GET served a file behind another user's closed directory: %q", body)
	} else if code(err) != "AccessDenied" || !strings.Contains(apiMessage(err), "mine/proj/closed") {
		t.Errorf("GET of a file behind a closed directory: %v, want AccessDenied naming mine/proj/closed", err)
	}
	_, err = e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("mine"), Key: aws.String(key)})
	if httpStatus(err) != 403 {
		t.Errorf("HEAD of a file behind a closed directory: %v, want 403", err)
	}
	_, err = e.alice.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("mine"), Key: aws.String("copy"),
		CopySource: aws.String("mine/" + key)})
	if code(err) != "AccessDenied" {
		t.Errorf("copy of a file behind a closed directory: %v, want AccessDenied", err)
	}
	if _, err := e.be.Export(ctx, "mine", key); !errs.IsCode(err, CodeFileAccess) {
		t.Errorf("export of a file behind a closed directory: %v, want %s", err, CodeFileAccess)
	}
	checkDenied(t, listings(t, e.alice, "mine"), key)

	// Nor through a symbolic link, at the key or on its way: the
	// directories the file is in count, not those of its key.
	runAs(t, mallory, `ln -s proj/closed/pub "$1/alias" && ln -s proj/closed "$1/l"`, mine)
	for _, k := range []string{"alias", "l/pub"} {
		_, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("mine"), Key: aws.String(k)})
		if code(err) != "AccessDenied" {
			t.Errorf("GET %s, a link to a file behind a closed directory: %v, want AccessDenied", k, err)
		}
	}

	// A closed directory of the file's owner is theirs: served (by the
	// general path, which judges what the fast path leaves to it).
	put(t, e.alice, "mine", "own/obj", "mine")
	runAs(t, mallory, `chmod 700 "$1/own"`, mine)
	if got := get(t, e.alice, "mine", "own/obj"); got != "mine" {
		t.Errorf("the owner's object in their closed directory: %q", got)
	}
	checkListed(t, listings(t, e.alice, "mine"), "own/obj", "mine")
}

// The bucket's own directory decides who else may enter the bucket, not
// what its owner may read: a world-readable file directly in a closed
// bucket directory is served (at no cost: a key without "/" has no other
// directory to check), and export takes it alike.
func TestClosedBucketDirectory(t *testing.T) {
	const mallory, victim = 4330, 4331
	e := twoMappedUsers(t, mallory, victim)
	vic, mine := filepath.Join(e.root, "vic"), filepath.Join(e.root, "mine")
	runAs(t, victim, `mkdir "$1/team" && chmod 777 "$1/team"`, vic)
	put(t, e.bob, "vic", "team/top", "world-readable")
	runAs(t, mallory, `mv "$1/team/top" "$2/top" && chmod 700 "$2"`, vic, mine)
	if o, ok := e.be.quickOpen("mine", "top"); !ok {
		t.Error("quickOpen refused a world-readable object in a closed bucket directory")
	} else {
		o.f.Close()
	}
	if got := get(t, e.alice, "mine", "top"); got != "world-readable" {
		t.Errorf("GET: %q", got)
	}
	if _, err := e.be.Export(ctx, "mine", "top"); err != nil {
		t.Errorf("export of what GET serves: %v", err)
	}
	checkListed(t, listings(t, e.alice, "mine"), "top", "world-readable")
}

// benchBucket is a Backend (no server) with a bucket "bench" holding the
// objects keys, each of a few bytes, written through PutObject (0644, in
// directories 0755).
func benchBucket(b *testing.B, keys []string) *Backend {
	b.Helper()
	dir := b.TempDir()
	bk := &memBuckets{m: map[string]Bucket{"bench": {Name: "bench"}}}
	be, err := New(Config{Root: filepath.Join(dir, "buckets"), Work: filepath.Join(dir, "work"), Buckets: bk})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(be.Shutdown)
	if err := os.Mkdir(filepath.Join(dir, "buckets", "bench"), 0o755); err != nil {
		b.Fatal(err)
	}
	for _, k := range keys {
		n := int64(len(k))
		if _, err := be.PutObject(ctx, s3response.PutObjectInput{Bucket: aws.String("bench"), Key: aws.String(k),
			Body: strings.NewReader(k), ContentLength: &n}); err != nil {
			b.Fatal(err)
		}
	}
	return be
}

// GET's fast path (quickOpen) for a key without directory components
// (the one openat2 it always was) and for one with three (an openat,
// fstat and close more per directory). Count system calls with
// strace -c -f on the test binary: wall-clock times on a shared machine
// vary more than these differ.
func BenchmarkQuickOpen(b *testing.B) {
	for _, key := range []string{"obj", "a/b/c/obj"} {
		b.Run(fmt.Sprintf("dirs=%d", strings.Count(key, "/")), func(b *testing.B) {
			be := benchBucket(b, []string{key})
			for b.Loop() {
				o, ok := be.quickOpen("bench", key)
				if !ok {
					b.Fatal("quickOpen refused")
				}
				o.f.Close()
			}
		})
	}
}

// A listing page of 1000 objects, flat (the same system calls per object
// as before the directory checks) and in 10 directories of 100 (an openat
// and fstat per directory, and each object opened in its directory
// rather than by a walk of its path).
func BenchmarkListObjects(b *testing.B) {
	for _, dirs := range []int{0, 10} {
		b.Run(fmt.Sprintf("dirs=%d", dirs), func(b *testing.B) {
			var keys []string
			for i := range 1000 {
				k := fmt.Sprintf("obj%04d", i)
				if dirs > 0 {
					k = fmt.Sprintf("d%02d/%s", i%dirs, k)
				}
				keys = append(keys, k)
			}
			be := benchBucket(b, keys)
			for b.Loop() {
				res, err := be.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("bench")})
				if err != nil || len(res.Contents) != 1000 {
					b.Fatal(err, len(res.Contents))
				}
			}
		})
	}
}

// The directories judged are those the file is opened in, not those at
// its path a moment later: the bucket's owner may swap two directories of
// theirs (one rename, RENAME_EXCHANGE) as fast as they like, here the
// victim's closed directory and an open one of their own, while GETs and
// listings run. The victim's file must never be served or shown.
func TestDirectorySwapRace(t *testing.T) {
	const mallory, victim = 4340, 4341
	e := twoMappedUsers(t, mallory, victim)
	vic, mine := filepath.Join(e.root, "vic"), filepath.Join(e.root, "mine")
	runAs(t, mallory, `mkdir "$1/proj" && chmod 777 "$1/proj"`, mine)
	const secret = "the victim's, behind a closed door"
	put(t, e.bob, "vic", "pub", secret)
	runAs(t, victim, `mkdir -m 700 "$2/proj/closed" && mv "$1/pub" "$2/proj/closed/pub"`, vic, mine)
	put(t, e.alice, "mine", "proj/open/pub", "a decoy")

	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		a, b := filepath.Join(mine, "proj/closed"), filepath.Join(mine, "proj/open")
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE); err != nil {
				done <- err
				return
			}
		}
	}()
	defer func() {
		close(stop)
		must(t, <-done)
	}()
	served := func(o *object) bool {
		defer o.f.Close()
		body, err := io.ReadAll(o.f)
		must(t, err)
		return string(body) == secret
	}
	const key = "proj/closed/pub"
	for i := range 3000 {
		if o, ok := e.be.quickOpen("mine", key); ok && served(o) {
			t.Fatalf("quickOpen served the victim's file (try %d)", i)
		}
		if o, _, err := e.be.openRequested(ctx, "mine", key, "", "GET"); err == nil && served(o) {
			t.Fatalf("GET served the victim's file (try %d)", i)
		}
		if i%30 == 0 {
			res, err := e.be.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("mine")})
			must(t, err)
			for _, o := range res.Contents {
				if aws.ToString(o.ETag) == `"`+md5hex(secret)+`"` {
					t.Fatalf("a listing showed the victim's file as %s (try %d)", *o.Key, i)
				}
			}
		}
	}
}

// A dirChain moves up and down a tree keeping what it holds already,
// describes what it holds, refuses a symbolic link on the way and closes
// everything it opened.
func TestDirChain(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"a/b/c", "a/d"} {
		must(t, os.MkdirAll(filepath.Join(dir, d), 0o755))
	}
	must(t, os.Chmod(filepath.Join(dir, "a/d"), 0o700))
	must(t, os.WriteFile(filepath.Join(dir, "a/d/f"), []byte("f"), 0o644))
	must(t, os.Symlink("b", filepath.Join(dir, "a/l")))
	r, err := os.OpenRoot(dir)
	must(t, err)
	defer r.Close()
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		must(t, err)
		return len(ents)
	}
	before := fds()
	c, err := openChain(r)
	must(t, err)
	for _, step := range []struct {
		dir  string
		held []string
		open bool
	}{
		{"a/b/c", []string{"a", "a/b", "a/b/c"}, true},
		{"a/b", []string{"a", "a/b"}, true},
		{"a/d", []string{"a", "a/d"}, false},
		{".", []string{}, true},
		{"a/b/c", []string{"a", "a/b", "a/b/c"}, true},
	} {
		must(t, c.cd(step.dir))
		if strings.Join(c.dirs, " ") != strings.Join(step.held, " ") || c.open() != step.open {
			t.Errorf("cd %s: holds %q (open %v), want %q (%v)", step.dir, c.dirs, c.open(), step.held, step.open)
		}
	}
	if di, err := c.stat("a/b"); err != nil || di.mode&0o777 != 0o755 {
		t.Errorf("stat a/b: %o %v", di.mode, err)
	}
	if err := c.cd("a/l/c"); err == nil {
		t.Error("cd followed a symbolic link")
	}
	f, err := c.OpenFile("a/d/f", os.O_RDONLY, 0)
	must(t, err)
	f.Close()
	if _, err := c.OpenFile("a/l", os.O_RDONLY, 0); !errors.Is(err, syscall.ELOOP) {
		t.Errorf("OpenFile of a symbolic link: %v", err)
	}
	c.close()
	if after := fds(); after != before {
		t.Errorf("%d descriptors open after close, %d before", after, before)
	}
}

// A file GET refuses is not laundered through versioning: a versioned PUT
// or DELETE over it would keep it as a version, in the gateway's own
// directories, where the rule would serve it. Both are refused, and the
// file stays where it is.
func TestVersioningKeepsNoRefusedFile(t *testing.T) {
	const mallory, victim = 4340, 4341
	e := twoMappedUsers(t, mallory, victim)
	vic, ver := filepath.Join(e.root, "vic"), filepath.Join(e.root, "ver")
	mkBucket(t, e.alice, "ver")
	// A bucket directory of the gateway's, and a directory of mallory's in it.
	must(t, os.Chown(ver, 0, 0))
	must(t, os.Chmod(ver, 0o755))
	must(t, os.Mkdir(filepath.Join(ver, "d"), 0o755))
	must(t, os.Chown(filepath.Join(ver, "d"), mallory, mallory))
	runAs(t, victim, `mkdir "$1/team" && chmod 777 "$1/team"`, vic)
	put(t, e.bob, "vic", "team/secret", "the victim's secret")
	runAs(t, victim, `chmod 600 "$1/team/secret"`, vic)
	runAs(t, mallory, `mv "$1/team/secret" "$2/d/stolen"`, vic, ver)
	setVersioning(t, e.alice, "ver", types.BucketVersioningStatusEnabled)

	_, err := e.alice.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("ver"), Key: aws.String("d/stolen"),
		Body: strings.NewReader("over it")})
	if code(err) != "AccessDenied" {
		t.Errorf("versioned PUT over a refused file: %v, want AccessDenied", err)
	}
	_, err = e.alice.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String("ver"), Key: aws.String("d/stolen")})
	if code(err) != "AccessDenied" {
		t.Errorf("versioned DELETE of a refused file: %v, want AccessDenied", err)
	}
	if got, err := getVersion(t, e.alice, "ver", "d/stolen", "null"); err == nil || strings.Contains(got, "secret") {
		t.Errorf("GET ?versionId=null: %q, %v; want a refusal", got, err)
	}
	if b, err := os.ReadFile(filepath.Join(ver, "d", "stolen")); err != nil || string(b) != "the victim's secret" {
		t.Errorf("the refused file: %q, %v; want it left in place", b, err)
	}
	vs, err := e.alice.ListObjectVersions(ctx, &s3.ListObjectVersionsInput{Bucket: aws.String("ver")})
	must(t, err)
	for _, v := range vs.Versions {
		if v.StorageClass != "ACCESS_DENIED" {
			t.Errorf("a version kept: %s %s (%s)", aws.ToString(v.Key), aws.ToString(v.VersionId), v.StorageClass)
		}
	}
}
