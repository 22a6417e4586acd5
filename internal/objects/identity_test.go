package objects

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// owner is the uid and gid of a file.
func owner(t *testing.T, path string) (int, int) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return int(st.Uid), int(st.Gid)
}

// A mapped user's objects belong to their uid only while the uid's trust
// file holds their access key and nobody else can write it.
func TestObjectsGoToTheTrustedUID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving files to another uid needs root") // CI runs as root
	}
	e := newEnv(t, false)
	const uid, gid = 4242, 4343
	a := e.iam["AKALICE"]
	a.UserID, a.GroupID = uid, gid
	e.iam["AKALICE"] = a
	e.be.trustFile = filepath.Join(e.dir, "trust-{uid}")
	trust := filepath.Join(e.dir, "trust-4242")
	if _, err := e.alice.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String("mine")}); err != nil {
		t.Fatal(err)
	}
	file := func(key string) string { return filepath.Join(e.root, "mine", key) }

	cases := []struct {
		name    string
		setup   func()
		trusted bool
	}{
		{"no trust file", func() {}, false},
		{"trust file with the key", func() {
			must(t, os.WriteFile(trust, []byte("# basalt\n  AKALICE \n"), 0o600))
			must(t, os.Chown(trust, uid, gid))
		}, true},
		{"writable by the group", func() { must(t, os.Chmod(trust, 0o620)) }, false},
		{"owned by another uid", func() {
			must(t, os.Chmod(trust, 0o600))
			must(t, os.Chown(trust, 5555, gid))
		}, false},
		// Root's files are no proof: see TestTrustFileNotPlantedByAnotherUser.
		{"owned by root", func() { must(t, os.Chown(trust, 0, 0)) }, false},
		{"without the key", func() {
			must(t, os.WriteFile(trust, []byte("AKBOB\n"), 0o600))
			must(t, os.Chown(trust, uid, gid))
		}, false},
		{"a symlink to a good file", func() {
			good := filepath.Join(e.dir, "good")
			must(t, os.WriteFile(good, []byte("AKALICE\n"), 0o600))
			must(t, os.Remove(trust))
			must(t, os.Symlink(good, trust))
		}, false},
	}
	for i, c := range cases {
		c.setup()
		key := "obj" + string(rune('a'+i))
		put(t, e.alice, "mine", key, c.name)
		u, g := owner(t, file(key))
		if c.trusted && (u != uid || g != gid) || !c.trusted && u != 0 {
			t.Errorf("%s: object owned by %d:%d (trusted=%v)", c.name, u, g, c.trusted)
		}
	}

	// Copies and completed multipart uploads are writes too.
	must(t, os.Remove(trust))
	must(t, os.WriteFile(trust, []byte("AKALICE\n"), 0o600))
	must(t, os.Chown(trust, uid, gid))
	if _, err := e.alice.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("mine"), Key: aws.String("copy"),
		CopySource: aws.String("mine/obja")}); err != nil {
		t.Fatal(err)
	}
	if u, g := owner(t, file("copy")); u != uid || g != gid {
		t.Errorf("copy owned by %d:%d", u, g)
	}
	up, err := e.alice.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("mine"), Key: aws.String("mp")})
	if err != nil {
		t.Fatal(err)
	}
	part, err := e.alice.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("mine"), Key: aws.String("mp"),
		UploadId: up.UploadId, PartNumber: aws.Int32(1), Body: strings.NewReader("only part")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.alice.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String("mine"),
		Key: aws.String("mp"), UploadId: up.UploadId, MultipartUpload: &types.CompletedMultipartUpload{
			Parts: []types.CompletedPart{{ETag: part.ETag, PartNumber: aws.Int32(1)}}}}); err != nil {
		t.Fatal(err)
	}
	if u, g := owner(t, file("mp")); u != uid || g != gid {
		t.Errorf("multipart object owned by %d:%d", u, g)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A trusted mapped user owns the directories the gateway makes for them —
// their bucket's, and those made for their objects' keys — so they can
// write files into the bucket directly (to export them later), as
// themselves; an untrusted mapping leaves the directories the gateway's.
func TestMappedUserWritesTheirBucket(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving files to another uid needs root") // CI runs as root
	}
	e := newEnv(t, false)
	const uid, gid = 4244, 4345
	a := e.iam["AKALICE"]
	a.UserID, a.GroupID = uid, gid
	e.iam["AKALICE"] = a
	e.be.trustFile = filepath.Join(e.dir, "trust-{uid}")
	// The user must be able to reach the store (test directories are
	// private to root).
	for d := e.root; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		must(t, os.Chmod(d, 0o755))
	}

	// Not trusted yet: the bucket directory stays the gateway's.
	mkBucket(t, e.alice, "early")
	if u, _ := owner(t, filepath.Join(e.root, "early")); u != 0 {
		t.Errorf("a bucket made under an untrusted mapping belongs to uid %d", u)
	}

	trust := filepath.Join(e.dir, "trust-4244")
	must(t, os.WriteFile(trust, []byte("AKALICE\n"), 0o600))
	must(t, os.Chown(trust, uid, gid))
	mkBucket(t, e.alice, "mine")
	put(t, e.alice, "mine", "d1/d2/k", "through S3")
	for _, dir := range []string{"mine", "mine/d1", "mine/d1/d2"} {
		if u, g := owner(t, filepath.Join(e.root, dir)); u != uid || g != gid {
			t.Errorf("%s belongs to %d:%d, want %d:%d", dir, u, g, uid, gid)
		}
	}
	// As the user: a new file, a new directory, a rename.
	script := `set -e; cd "$1"; echo direct > direct.txt; mkdir sub; echo x > sub/y; mv d1/d2/k d1/d2/k.moved; mv d1/d2/k.moved d1/d2/k`
	cmd := exec.Command("sh", "-c", script, "sh", filepath.Join(e.root, "mine"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the user cannot write their bucket directly: %v: %s", err, out)
	}
	// Directories made for keys of a user whose mapping is not trusted
	// stay the gateway's.
	must(t, os.Remove(trust))
	put(t, e.alice, "mine", "d3/k", "untrusted now")
	if u, _ := owner(t, filepath.Join(e.root, "mine", "d3")); u != 0 {
		t.Errorf("d3, made for an untrusted writer, belongs to uid %d", u)
	}
}

// The trust file counts only when nobody but root and the uid could have
// put it where it is: a directory on its path (or on the way through a
// symbolic link), or a link, that another uid owns or may write lets that
// uid swap in another home, or another of the uid's files that happens
// to hold the key id, as the trust file; so does a second name (a hard
// link) of the file.
func TestTrustFileDirectoriesOthersCannotChange(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("files of another uid need root") // CI runs as root
	}
	e := newEnv(t, false)
	const uid, other = 4270, 4271
	acct := e.iam["AKALICE"]
	acct.UserID, acct.GroupID = uid, uid
	home := filepath.Join(e.dir, "homes", "alice")
	must(t, os.MkdirAll(home, 0o755))
	must(t, os.Chown(home, uid, uid))
	trust := filepath.Join(home, ".basalt-s3")
	must(t, os.WriteFile(trust, []byte("AKALICE\n"), 0o600))
	must(t, os.Chown(trust, uid, uid))
	e.be.trustFile = filepath.Join(e.dir, "homes", "{uid}", ".basalt-s3")
	must(t, os.Symlink("alice", filepath.Join(e.dir, "homes", "4270")))
	homes := filepath.Join(e.dir, "homes")

	check := func(name string, want bool) {
		t.Helper()
		if ok, why := e.be.trusted(acct); ok != want {
			t.Errorf("%s: trusted %v (%s), want %v", name, ok, why, want)
		}
	}
	check("home and its parents the uid's or root's", true)
	must(t, os.Chmod(home, 0o775))
	check("home writable by its group", false)
	must(t, os.Chmod(home, os.ModeSticky|0o777))
	check("home writable by all, sticky", true)
	must(t, os.Chmod(home, 0o755))
	must(t, os.Chown(homes, other, other))
	check("a parent (holding the link) owned by another uid", false)
	must(t, os.Chown(homes, 0, 0))
	must(t, os.Chmod(homes, 0o777))
	check("a parent (holding the link) writable by all, not sticky", false)
	must(t, os.Chmod(homes, 0o755))
	check("parents fixed", true)
	must(t, os.Lchown(filepath.Join(homes, "4270"), other, other))
	check("the link to the home another uid's (made in a sticky directory, say)", false)
	must(t, os.Lchown(filepath.Join(homes, "4270"), 0, 0))
	check("the link root's", true)
	elsewhereLink := filepath.Join(e.dir, "linked-trust")
	must(t, os.Link(trust, elsewhereLink))
	check("the trust file with a second name", false)
	must(t, os.Remove(elsewhereLink))
	check("one name again", true)

	// The link's target is looked up too: a home reached through a
	// directory another uid owns is theirs to swap.
	elsewhere := filepath.Join(e.dir, "elsewhere")
	must(t, os.Mkdir(elsewhere, 0o755))
	must(t, os.Chown(elsewhere, other, other))
	must(t, os.Rename(home, filepath.Join(elsewhere, "alice")))
	must(t, os.Remove(filepath.Join(homes, "4270")))
	must(t, os.Symlink(filepath.Join(elsewhere, "alice"), filepath.Join(homes, "4270")))
	check("home inside another uid's directory, through a link", false)
	must(t, os.Chown(elsewhere, 0, 0))
	check("that directory root's", true)
}
