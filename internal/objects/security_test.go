package objects

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/basalt-storage/basalt/internal/errs"
)

// asUser runs the shell script as uid:gid (the arguments are $1, $2...)
// and returns its combined output and error.
func asUser(uid, gid int, script string, args ...string) (string, error) {
	cmd := exec.Command("sh", append([]string{"-c", script, "sh"}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// openUp lets other uids reach the test's directories (t.TempDir makes
// them private to root).
func openUp(t *testing.T, dir string) {
	t.Helper()
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		must(t, os.Chmod(d, 0o755))
	}
}

// A root-owned trust file does not vouch for a uid: the gateway itself
// makes root-owned files with contents its users choose (the objects of
// an untrusted writer, mode 0644), and a user whose bucket directory is
// their own can move such a file wherever they may write on the store's
// file system — here into a shared trust directory (sticky, writable by
// all, the layout a "{uid}" template is for), under a victim's uid. An
// S3 user mapped to that uid, whom the uid never vouched for, then had
// their objects given to it.
func TestTrustFileNotPlantedByAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving files to another uid needs root") // CI runs as root
	}
	e := newEnv(t, false)
	const victim, mallory = 4260, 4261
	// alice's S3 user is mapped to the victim's uid (an admin's mistake,
	// or a mapping asked for under false pretences); bob's is Mallory's own.
	a := e.iam["AKALICE"]
	a.UserID, a.GroupID = victim, victim
	e.iam["AKALICE"] = a
	b := e.iam["AKBOB"]
	b.UserID, b.GroupID = mallory, mallory
	e.iam["AKBOB"] = b
	openUp(t, e.root)
	trustDir := filepath.Join(e.dir, "trust")
	must(t, os.Mkdir(trustDir, 0o755))
	must(t, os.Chmod(trustDir, os.ModeSticky|0o777)) // a shared directory, as /tmp
	e.be.trustFile = filepath.Join(trustDir, "{uid}")

	// Mallory vouches for her own S3 user: her bucket directory is hers.
	own := filepath.Join(trustDir, "4261")
	if out, err := asUser(mallory, mallory, `umask 077; echo AKBOB > "$1"`, own); err != nil {
		t.Fatalf("mallory cannot write her trust file: %v: %s", err, out)
	}
	mkBucket(t, e.bob, "mal")
	if u, _ := owner(t, filepath.Join(e.root, "mal")); u != mallory {
		t.Fatalf("mallory's bucket belongs to uid %d", u)
	}
	// Untrusted for a moment, she has the gateway write a root-owned file
	// holding alice's access key id...
	must(t, os.Remove(own))
	put(t, e.bob, "mal", "plant", "AKALICE\n")
	if u, _ := owner(t, filepath.Join(e.root, "mal", "plant")); u != 0 {
		t.Fatalf("the untrusted object belongs to uid %d", u)
	}
	// ...and moves it, as herself, to the victim's trust file.
	if out, err := asUser(mallory, mallory, `mv "$1" "$2"`,
		filepath.Join(e.root, "mal", "plant"), filepath.Join(trustDir, "4260")); err != nil {
		t.Fatalf("mallory cannot move the file: %v: %s", err, out)
	}

	mkBucket(t, e.alice, "vic")
	put(t, e.alice, "vic", "obj", "given away")
	for _, p := range []string{"vic", "vic/obj"} {
		if u, _ := owner(t, filepath.Join(e.root, p)); u == victim {
			t.Errorf("%s was given to uid %d, which never vouched for the S3 user", p, u)
		}
	}
}

// Export serves only files the bucket's owner could read themselves. A
// user who may write into the bucket directory can move in (rename) a
// file of someone else's from any directory they may write on the same
// file system — a project's shared directory, say — as a hard link would
// bring it in: the server, which reads with its own rights, must not
// make a file its owner keeps private an object of the bucket.
func TestExportRefusesAnotherUsersPrivateFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("files of other uids need root") // CI runs as root
	}
	for _, mode := range []string{"xattr", "sidecar"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t, mode == "sidecar")
			const uid, other = 4270, 4271
			a := e.iam["AKALICE"]
			a.UserID, a.GroupID = uid, uid
			e.iam["AKALICE"] = a
			openUp(t, e.root)
			e.be.trustFile = filepath.Join(e.dir, "trust-{uid}")
			trust := filepath.Join(e.dir, "trust-4270")

			// A bucket made before the mapping was trusted: its directory is
			// the gateway's, those made for later writes are alice's.
			mkBucket(t, e.alice, "early")
			must(t, os.WriteFile(trust, []byte("AKALICE\n"), 0o600))
			must(t, os.Chown(trust, uid, uid))
			mkBucket(t, e.alice, "mine")
			put(t, e.alice, "early", "d/k", "through S3")

			// Another user's private files in a directory alice may write.
			shared := filepath.Join(e.dir, "shared")
			must(t, os.Mkdir(shared, 0o755))
			must(t, os.Chmod(shared, 0o777))
			secret := func(p string) {
				must(t, os.WriteFile(p, []byte("the other user's secret"), 0o600))
				must(t, os.Chown(p, other, other))
			}
			secret(filepath.Join(shared, "secret.txt"))
			proj := filepath.Join(shared, "proj")
			if out, err := asUser(uid, uid, `mkdir "$1"`, proj); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			must(t, os.Mkdir(filepath.Join(proj, "theirs"), 0o755))
			must(t, os.Chown(filepath.Join(proj, "theirs"), other, other))
			secret(filepath.Join(proj, "theirs", "secret.txt"))
			// A file anyone may read, in a directory only its owner may enter.
			closed := filepath.Join(proj, "closed")
			must(t, os.Mkdir(closed, 0o700))
			must(t, os.Chown(closed, other, other))
			must(t, os.WriteFile(filepath.Join(closed, "secret.txt"), []byte("the other user's secret"), 0o644))
			must(t, os.Chown(filepath.Join(closed, "secret.txt"), other, other))

			script := `set -e
cat "$1/secret.txt" 2>/dev/null && { echo "alice can read it"; exit 1; }
mv "$1/secret.txt" "$2/secret.txt"
mv "$1/proj" "$2/proj"
umask 077
echo mine > "$2/own.txt"
echo mine too > "$3/d/own.txt"`
			if out, err := asUser(uid, uid, script, shared, filepath.Join(e.root, "mine"),
				filepath.Join(e.root, "early")); err != nil {
				t.Fatalf("as alice: %v: %s", err, out)
			}

			for _, key := range []string{"secret.txt", "proj/theirs/secret.txt", "proj/closed/secret.txt"} {
				if _, err := e.be.Export(ctx, "mine", key); !errs.IsCode(err, CodeFileAccess) {
					t.Errorf("export of another user's private file %s: %v, want %s", key, err, CodeFileAccess)
				}
				out, gerr := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("mine"), Key: aws.String(key)})
				if gerr == nil {
					body, _ := io.ReadAll(out.Body)
					out.Body.Close()
					t.Errorf("GET of %s served another user's private file: %q", key, body)
				}
			}
			// Alice's own files, private or not, are hers to export.
			for _, o := range []struct{ bucket, key, body string }{{"mine", "own.txt", "mine\n"},
				{"early", "d/own.txt", "mine too\n"}} {
				if _, err := e.be.Export(ctx, o.bucket, o.key); err != nil {
					t.Fatalf("export %s/%s: %v", o.bucket, o.key, err)
				}
				if got := get(t, e.alice, o.bucket, o.key); got != o.body {
					t.Errorf("%s/%s = %q", o.bucket, o.key, got)
				}
			}
			// A file anyone may read can be exported whoever owns it.
			pub := filepath.Join(e.root, "mine", "public.txt")
			must(t, os.WriteFile(pub, []byte("public"), 0o644))
			must(t, os.Chown(pub, other, other))
			if _, err := e.be.Export(ctx, "mine", "public.txt"); err != nil {
				t.Fatalf("export of a world-readable file: %v", err)
			}
			if !strings.Contains(get(t, e.alice, "mine", "public.txt"), "public") {
				t.Error("the world-readable file is not served")
			}
		})
	}
}

// What a user stores through S3 stays as private as their bucket
// directory while it is on its way there: a mapped user may close their
// bucket to others (chmod 700: it is theirs), and the gateway must not
// leave the same bytes readable meanwhile in Work — multipart parts,
// which wait there for days, and the temp files of a PUT or of a
// snapshot export (a volume's plaintext, for an encrypted one).
func TestWorkFilesNotReadableByOthers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("files of other uids need root") // CI runs as root
	}
	e := newEnv(t, false)
	const uid, other = 4280, 4281
	a := e.iam["AKALICE"]
	a.UserID, a.GroupID = uid, uid
	e.iam["AKALICE"] = a
	openUp(t, e.root)
	e.be.trustFile = filepath.Join(e.dir, "trust-{uid}")
	trust := filepath.Join(e.dir, "trust-4280")
	must(t, os.WriteFile(trust, []byte("AKALICE\n"), 0o600))
	must(t, os.Chown(trust, uid, uid))
	mkBucket(t, e.alice, "priv")
	if out, err := asUser(uid, uid, `chmod 700 "$1"`, filepath.Join(e.root, "priv")); err != nil {
		t.Fatalf("alice cannot close her bucket: %v: %s", err, out)
	}
	put(t, e.alice, "priv", "done", "the secret, stored")
	// Others can see neither the bucket's files...
	if out, err := asUser(other, other, `cat "$1"`, filepath.Join(e.root, "priv", "done")); err == nil {
		t.Fatalf("another user reads the closed bucket: %s", out)
	}
	// ...nor what is on its way into it.
	readAll := `for f in $(find "$1" -type f); do cat "$f"; done 2>/dev/null`
	up, err := e.alice.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("priv"), Key: aws.String("mp")})
	must(t, err)
	_, err = e.alice.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("priv"), Key: aws.String("mp"),
		UploadId: up.UploadId, PartNumber: aws.Int32(1), Body: strings.NewReader("the secret, in a part")})
	must(t, err)
	if out, _ := asUser(other, other, readAll, e.work); strings.Contains(out, "the secret") {
		t.Errorf("another user reads a pending part in Work: %q", out)
	}
	_, err = e.be.PutImage(ctx, ImageInput{Bucket: "priv", Key: "image", Writer: a,
		Fill: func(f *os.File) error {
			if _, err := f.WriteString("the secret, being exported"); err != nil {
				return err
			}
			if out, _ := asUser(other, other, readAll, e.work); strings.Contains(out, "the secret") {
				t.Errorf("another user reads an object being written in Work: %q", out)
			}
			return f.Sync()
		}})
	must(t, err)
}

// TestGetRefusesMovedInPrivateFile: GET, HEAD and copies serve only
// files the bucket's owner could read themselves, as `object export`
// exports only those (readableByOwner). A record in an xattr travels with
// its file: a user who may write into a directory holding another user's
// object (a bucket directory its owner shares with a team, g+w or o+w
// without the sticky bit) can move that object into a bucket of their own
// with a valid record — after its owner made it private (chmod 600 keeps
// size, mtime and inode, so the record still matches). The gateway, which
// reads with its own rights, must not serve it for them. Files anyone may
// read stay served, as are the owner's own private files.
func TestGetRefusesMovedInPrivateFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("files of other uids need root") // CI runs as root
	}
	e := newEnv(t, false)
	const mallory, victim = 4300, 4301
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
	vic, mine := filepath.Join(e.root, "vic"), filepath.Join(e.root, "mine")
	// The victim opens a directory of their bucket to others, stores two
	// objects there and makes one private.
	if out, err := asUser(victim, victim, `mkdir "$1/team" && chmod 777 "$1/team"`, vic); err != nil {
		t.Fatalf("as the victim: %v: %s", err, out)
	}
	put(t, e.bob, "vic", "team/secret", "the victim's secret")
	put(t, e.bob, "vic", "team/public", "anyone may read this")
	if out, err := asUser(victim, victim, `chmod 600 "$1/team/secret"`, vic); err != nil {
		t.Fatalf("as the victim: %v: %s", err, out)
	}
	if got := get(t, e.bob, "vic", "team/secret"); got != "the victim's secret" {
		t.Fatalf("the victim's private object: %q", got)
	}
	// Mallory cannot read the private one, but can move both into her bucket.
	script := `cat "$1/team/secret" 2>/dev/null && { echo "mallory can read it"; exit 1; }
set -e
mv "$1/team/secret" "$2/stolen"
mkdir "$2/d"
mv "$1/team/public" "$2/d/public"`
	if out, err := asUser(mallory, mallory, script, vic, mine); err != nil {
		t.Fatalf("as mallory: %v: %s", err, out)
	}

	if o, ok := e.be.quickOpen("mine", "stolen"); ok {
		o.f.Close()
		t.Error("quickOpen took a file not everyone may read")
	}
	g, err := e.alice.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("mine"), Key: aws.String("stolen")})
	if err == nil {
		body, _ := io.ReadAll(g.Body)
		g.Body.Close()
		t.Errorf("GET served another user's private file: %q", body)
	} else if code(err) != "AccessDenied" {
		t.Errorf("GET of another user's private file: %v, want AccessDenied", err)
	}
	_, err = e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("mine"), Key: aws.String("stolen")})
	if httpStatus(err) != 403 {
		t.Errorf("HEAD of another user's private file: %v, want 403", err)
	}
	_, err = e.alice.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("mine"), Key: aws.String("copy"),
		CopySource: aws.String("mine/stolen")})
	if code(err) != "AccessDenied" {
		t.Errorf("copy of another user's private file: %v, want AccessDenied", err)
	}
	if f, _, err := e.be.OpenImage(ctx, "mine", "stolen"); err == nil {
		f.Close()
		t.Error("OpenImage opened another user's private file")
	} else if !errs.IsCode(err, CodeFileAccess) {
		t.Errorf("OpenImage of another user's private file: %v, want %s", err, CodeFileAccess)
	}

	// A file anyone may read is served, whoever brought it in.
	if got := get(t, e.alice, "mine", "d/public"); got != "anyone may read this" {
		t.Errorf("moved-in world-readable object: %q", got)
	}
	// Mallory's own private object is hers.
	put(t, e.alice, "mine", "own", "mine")
	if out, err := asUser(mallory, mallory, `chmod 600 "$1/own"`, mine); err != nil {
		t.Fatalf("as mallory: %v: %s", err, out)
	}
	if got := get(t, e.alice, "mine", "own"); got != "mine" {
		t.Errorf("the owner's own private object: %q", got)
	}
}
