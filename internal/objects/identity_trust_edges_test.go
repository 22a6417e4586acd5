package objects

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/versity/versitygw/auth"
)

// trustEdgesBackend is a backend whose trust files are dir/trust-{uid},
// dir being private to root, as t.TempDir makes it.
func trustEdgesBackend(t *testing.T) (*Backend, string) {
	t.Helper()
	dir := t.TempDir()
	be, err := New(Config{Root: filepath.Join(dir, "buckets"), Work: filepath.Join(dir, "work"),
		Buckets: &memBuckets{m: map[string]Bucket{}}})
	if err != nil {
		t.Fatal(err)
	}
	be.trustFile = filepath.Join(dir, "trust-{uid}")
	return be, dir
}

// An account without an access key id (a record without S3 keys) is
// vouched for by no trust file: a blank line, which almost every text
// file has, is not its key. It used to be: the line, trimmed, equalled
// the empty key, and the account's objects were given to the uid.
func TestTrustFileBlankLineVouchesForNoKey(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("files of another uid need root") // CI runs as root
	}
	be, dir := trustEdgesBackend(t)
	const uid = 4290
	trust := filepath.Join(dir, "trust-4290")
	must(t, os.WriteFile(trust, []byte("# my keys\n\nAKALICE\n"), 0o600))
	must(t, os.Chown(trust, uid, uid))
	if ok, why := be.trusted(auth.Account{Access: "AKALICE", UserID: uid}); !ok {
		t.Fatalf("the key on a line of its own is not trusted: %s", why)
	}
	for _, access := range []string{"", " ", "\t"} {
		if ok, _ := be.trusted(auth.Account{Access: access, UserID: uid}); ok {
			t.Errorf("access key id %q is vouched for by a blank line", access)
		}
		if _, _, ok := be.ownerFor(auth.Account{Access: access, UserID: uid, GroupID: uid}, "object"); ok {
			t.Errorf("access key id %q: objects would be given to uid %d", access, uid)
		}
	}
	// A key must be a line of its own: not a part of one.
	must(t, os.WriteFile(trust, []byte("AKALICEX\nxAKALICE\nAWS_ACCESS_KEY_ID=AKALICE\n"), 0o600))
	if ok, _ := be.trusted(auth.Account{Access: "AKALICE", UserID: uid}); ok {
		t.Error("a line that only contains the key vouches for it")
	}
}

// What sits at the trust file's path is opened without blocking and
// refused unless it is a regular file: a FIFO (which any uid can make,
// and which would hang an open for reading until a writer came) and a
// directory vouch for nothing.
func TestTrustFileNotARegularFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("files of another uid need root") // CI runs as root
	}
	be, dir := trustEdgesBackend(t)
	const uid = 4291
	trust := filepath.Join(dir, "trust-4291")
	acct := auth.Account{Access: "AKALICE", UserID: uid}
	check := func(what string) {
		t.Helper()
		done := make(chan bool, 1)
		go func() { ok, _ := be.trusted(acct); done <- ok }()
		select {
		case ok := <-done:
			if ok {
				t.Errorf("%s at the trust file's path is trusted", what)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("the trust check hangs on %s", what)
		}
	}
	must(t, syscall.Mkfifo(trust, 0o600))
	must(t, os.Chown(trust, uid, uid))
	check("a FIFO")
	must(t, os.Remove(trust))
	must(t, os.Mkdir(trust, 0o700))
	must(t, os.Chown(trust, uid, uid))
	check("a directory")
}

// Root is never given files, whatever vouches: an account mapped to uid 0
// (a record older than the refusal of such mappings) with a perfect trust
// file of root's keeps the gateway's ownership, as does a uid without a
// home directory when the template needs one.
func TestTrustNeverRootNorHomeless(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("files of another uid need root") // CI runs as root
	}
	be, dir := trustEdgesBackend(t)
	trust := filepath.Join(dir, "trust-0")
	must(t, os.WriteFile(trust, []byte("AKROOTMAP\n"), 0o600))
	for _, uid := range []int{0, -1} {
		if _, _, ok := be.ownerFor(auth.Account{Access: "AKROOTMAP", UserID: uid, GroupID: 0}, "object"); ok {
			t.Errorf("uid %d: objects would be given away", uid)
		}
	}
	be.trustFile = "{home}/.basalt-s3"
	const homeless = 2147480001 // in no passwd database
	if ok, why := be.trusted(auth.Account{Access: "AKALICE", UserID: homeless}); ok {
		t.Errorf("a uid without a home directory is trusted: %s", why)
	}
}

// Two users mapped to one uid (an admin's mistake, or a uid with two S3
// identities): the uid vouches for each by its key, so the one whose key
// its trust file lacks gets nothing of the uid's.
func TestTrustUIDSharedByTwoUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("files of another uid need root") // CI runs as root
	}
	be, dir := trustEdgesBackend(t)
	const uid = 4292
	trust := filepath.Join(dir, "trust-4292")
	alice := auth.Account{Access: "AKALICE", UserID: uid, GroupID: uid}
	bob := auth.Account{Access: "AKBOB", UserID: uid, GroupID: uid}
	must(t, os.WriteFile(trust, []byte("AKALICE\n"), 0o600))
	must(t, os.Chown(trust, uid, uid))
	if _, _, ok := be.ownerFor(alice, "object"); !ok {
		t.Error("alice, vouched for, is not trusted")
	}
	if _, _, ok := be.ownerFor(bob, "object"); ok {
		t.Error("bob, mapped to the same uid but not vouched for, is trusted")
	}
	must(t, os.WriteFile(trust, []byte("AKALICE\nAKBOB\n"), 0o600))
	for _, a := range []auth.Account{alice, bob} {
		if _, _, ok := be.ownerFor(a, "object"); !ok {
			t.Errorf("%s, vouched for, is not trusted", a.Access)
		}
	}
}
