package objects

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/versity/versitygw/auth"
)

// Cluster identity (pWalrus): an admin may map a basalt user to a uid and
// gid (`basalt user create --uid --gid`), and the objects that user writes
// over S3 then belong to that uid on the file system, as if they had
// written them directly. An admin's word is not enough, though: the
// mapping is trusted only while the uid itself vouches for it, with a
// trust file of its own that holds the user's access key id and that
// nobody else can write. Whoever controls the uid's files agrees to
// receive that S3 user's objects; nobody else can make the gateway give
// files to a uid.

// DefaultTrustFile is the trust file's path template: "{home}" is the
// uid's home directory (from the passwd database), "{uid}" the number.
const DefaultTrustFile = "{home}/.basalt-s3"

// maxTrustFile bounds how much of a trust file is read.
const maxTrustFile = 64 << 10

// trustPath is the trust file of uid, or "" if its template names a home
// directory the uid does not have.
func (b *Backend) trustPath(uid int) string {
	p := strings.ReplaceAll(b.trustFile, "{uid}", strconv.Itoa(uid))
	if strings.Contains(p, "{home}") {
		u, err := user.LookupId(strconv.Itoa(uid))
		if err != nil || u.HomeDir == "" {
			return ""
		}
		p = strings.ReplaceAll(p, "{home}", u.HomeDir)
	}
	return p
}

// trusted reports whether acct's uid mapping may be used now, and if not,
// why (for the log).
func (b *Backend) trusted(acct auth.Account) (bool, string) {
	uid := acct.UserID
	if strings.TrimSpace(acct.Access) == "" {
		// Only a key vouches: an empty one would match any blank line
		// of the trust file (the account of a user record without S3
		// keys, which a snapshot export would give its object to).
		return false, "the account has no access key id"
	}
	path := b.trustPath(uid)
	if path == "" {
		return false, fmt.Sprintf("uid %d has no home directory for %s", uid, b.trustFile)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return false, fmt.Sprintf("no trust file: %v", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false, err.Error()
	}
	st := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return false, path + " is not a regular file"
	case int(st.Uid) != uid:
		// Not root's either: the gateway itself makes root-owned files
		// with contents its users choose (an untrusted writer's objects),
		// which a user who owns the bucket directory can move wherever
		// they may write — a shared trust directory, say.
		return false, fmt.Sprintf("%s belongs to uid %d, not %d", path, st.Uid, uid)
	case fi.Mode().Perm()&0o022 != 0:
		return false, fmt.Sprintf("%s is writable by others (mode %v)", path, fi.Mode().Perm())
	case st.Nlink != 1:
		// Another name of one of the uid's files (a log that holds text
		// someone else chose, say), linked here by whoever may write
		// this directory where the kernel allows linking others' files.
		return false, fmt.Sprintf("%s has %d names (hard links)", path, st.Nlink)
	}
	if err := safeDirs(path, uid); err != nil {
		return false, err.Error()
	}
	sc := bufio.NewScanner(io.LimitReader(f, maxTrustFile))
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == acct.Access {
			return true, ""
		}
	}
	return false, fmt.Sprintf("%s does not hold the access key id", path)
}

// maxLinks bounds the symbolic links safeDirs follows (the kernel's
// own limit is 40).
const maxLinks = 40

// safeDirs checks every directory in which the lookup of path reads an
// entry — its ancestors, and those of the targets of any symbolic links
// on the way — and refuses one that another uid could change: it must
// belong to root or uid, and be writable by neither group nor others
// unless it is sticky (there only an entry's owner may rename or remove
// it, and every entry followed is checked in turn: each directory, and
// each symbolic link, must be root's or uid's too). Otherwise whoever may
// write such a directory could swap in another home, or another trust
// file of uid's (a file whose text they chose, a log, say), and vouch for
// a mapping the uid never made. This is OpenSSH's StrictModes rule for
// ~/.ssh, with sticky directories allowed. Checked after the file is
// open: only root or uid could have changed these directories since.
func safeDirs(path string, uid int) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("trust file %s: not an absolute path", path)
	}
	todo := strings.Split(strings.Trim(path, "/"), "/")
	dir, links := "/", 0
	for len(todo) > 0 {
		if err := safeDir(dir, uid); err != nil {
			return err
		}
		name := todo[0]
		todo = todo[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			dir = filepath.Dir(dir)
			continue
		}
		next := filepath.Join(dir, name)
		if len(todo) == 0 {
			return nil // the file itself: checked on its descriptor
		}
		fi, err := os.Lstat(next)
		if err != nil {
			return fmt.Errorf("trust file %s: %w", path, err)
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			// A link is followed only if root or uid made it: in a
			// sticky directory anyone may add one.
			if o := fi.Sys().(*syscall.Stat_t).Uid; o != 0 && int(o) != uid {
				return fmt.Errorf("trust file %s: symbolic link %s belongs to uid %d, neither root nor %d", path, next, o, uid)
			}
			if links++; links > maxLinks {
				return fmt.Errorf("trust file %s: too many symbolic links", path)
			}
			target, err := os.Readlink(next)
			if err != nil {
				return fmt.Errorf("trust file %s: %w", path, err)
			}
			if filepath.IsAbs(target) {
				dir = "/"
			}
			todo = append(strings.Split(strings.Trim(target, "/"), "/"), todo...)
			continue
		}
		dir = next
	}
	return nil
}

// safeDir checks one directory for safeDirs.
func safeDir(dir string, uid int) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("trust file directory %s: %w", dir, err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("trust file directory %s is not a directory", dir)
	case st.Uid != 0 && int(st.Uid) != uid:
		return fmt.Errorf("trust file directory %s belongs to uid %d, neither root nor %d", dir, st.Uid, uid)
	case fi.Mode().Perm()&0o022 != 0 && fi.Mode()&os.ModeSticky == 0:
		return fmt.Errorf("trust file directory %s is writable by others (mode %v)", dir, fi.Mode().Perm())
	}
	return nil
}

// giveToWriter makes f (an object about to be published) belong to the
// writing user's uid and gid when the user is mapped and the mapping is
// trusted; otherwise f keeps the gateway's ownership.
func (b *Backend) giveToWriter(ctx context.Context, f *os.File) error {
	acct, _, _ := caller(ctx)
	return b.giveTo(acct, f)
}

// sameOwner returns what mkdirs calls for the directories it creates
// inside r for object file f: when f was given to a user (giveTo), they
// are given to the same uid and gid, so that the user can also create,
// rename and remove files there directly — the pWalrus way of writing
// files that `basalt object export` then makes objects. Otherwise nil: the
// directories stay the gateway's.
func sameOwner(r *os.Root, f *os.File) func(string) error {
	fi, err := f.Stat()
	if err != nil {
		return nil
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) == os.Geteuid() || st.Uid == 0 {
		return nil
	}
	return func(dir string) error {
		// Through a descriptor of the directory itself: the user owns its
		// parent, and must not be able to swap in something else (a hard
		// link to a file) for the chown to land on.
		d, err := r.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
		if err == nil {
			err = d.Chown(int(st.Uid), int(st.Gid))
			d.Close()
		}
		if err != nil {
			return fmt.Errorf("give directory %s to uid %d: %w", dir, st.Uid, err)
		}
		return nil
	}
}

// giveTo makes f belong to acct's uid and gid when acct is mapped to a uid
// and the mapping is trusted.
func (b *Backend) giveTo(acct auth.Account, f *os.File) error {
	uid, gid, ok := b.ownerFor(acct, "object")
	if !ok {
		return nil
	}
	if err := f.Chown(uid, gid); err != nil {
		return fmt.Errorf("give the object to uid %d: %w", uid, err)
	}
	return nil
}

// giveDirTo makes a new bucket directory belong to its owner when the
// owner is mapped to a uid and the mapping is trusted, so that the user
// can write files into the bucket directly (see sameOwner).
func (b *Backend) giveDirTo(acct auth.Account, dir string) error {
	uid, gid, ok := b.ownerFor(acct, "bucket directory")
	if !ok {
		return nil
	}
	if err := os.Lchown(dir, uid, gid); err != nil {
		return fmt.Errorf("give bucket directory %s to uid %d: %w", dir, uid, err)
	}
	return nil
}

// ownerFor is the uid and gid (-1: unchanged) what acct writes is given
// to, if acct is mapped to a uid and the mapping is trusted.
func (b *Backend) ownerFor(acct auth.Account, what string) (uid, gid int, ok bool) {
	if acct.UserID <= 0 { // unmapped, or no account (never chown to root)
		return 0, 0, false
	}
	if ok, why := b.trusted(acct); !ok {
		b.log.Info("uid mapping not trusted; "+what+" stays the gateway's", "user", userOf(acct), "uid", acct.UserID, "why", why)
		return 0, 0, false
	}
	gid = acct.GroupID
	if gid <= 0 {
		gid = -1
	}
	return acct.UserID, gid, true
}
