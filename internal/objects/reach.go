package objects

// Which files of a bucket the gateway serves: only those the bucket's
// owner could read directly (docs/objects.md, "Direct access"). The
// gateway reads with its own rights, and a file can be brought into a
// bucket by someone who may not read it — a private file moved in by
// rename (its xattr record travels with it), or a directory its owner
// closed to others moved in with the directory above it.

import (
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// dirInfo is what refusal needs of a directory.
type dirInfo struct{ uid, mode uint32 }

// dirStat describes a directory of a bucket (a path inside it, "." the
// bucket's own).
type dirStat func(dir string) (dirInfo, error)

// lstatDirs is the dirStat of the directories at their paths in r.
func lstatDirs(r *os.Root) dirStat {
	return func(dir string) (dirInfo, error) {
		fi, err := r.Lstat(dir)
		if err != nil {
			return dirInfo{}, err
		}
		st := statOf(fi)
		return dirInfo{st.Uid, st.Mode}, nil
	}
}

// denial is why refusal refuses a file: the first directory from the
// bucket's down that belongs neither to the file's owner nor to the
// gateway (foreign, owned by uid), and, for a file anyone may read, the
// first directory below the bucket's that others may not enter (closed)
// or that it was reached through a symbolic link (linked).
type denial struct {
	closed, foreign string
	uid             uint32
	linked          bool
}

// closedTo says how the file is closed to others, for a message.
func (d *denial) closedTo(bucket string) string {
	switch {
	case d.linked:
		return "its key leads to it through a symbolic link, so the directories it is in were not checked"
	case d.closed != "":
		return fmt.Sprintf("not everyone may reach it (others may not enter the directory %s)", path.Join(bucket, d.closed))
	}
	return "not everyone may read it"
}

// why says why a file of uid is refused, for a message.
func (d *denial) why(bucket string, uid uint32) string {
	return fmt.Sprintf("its file belongs to uid %d and %s, but the directory %s belongs to uid %d, so the file may have "+
		"been moved into the bucket by someone who may not read it", uid, d.closedTo(bucket), path.Join(bucket, d.foreign), d.uid)
}

// refusal says why the file st at name (a path inside the bucket) is one
// the bucket's owner might not read directly, nil if it is not. It is
// served (GET, HEAD, copies, listings) and exported if anyone may read it
// and enter every directory below the bucket's on its way (reached: stat
// describes the directories it is in, not just those at name's path), or
// if every directory from the bucket's down to it belongs to the file's
// owner (or to the gateway, writable by nobody else). The bucket's own
// directory decides who else may enter the bucket, not what its owner may
// read, so its mode does not count: a file anyone may read directly in
// the bucket's directory needs no directory described.
func refusal(stat dirStat, name string, st *syscall.Stat_t, reached bool) (*denial, error) {
	public := st.Mode&0o004 != 0
	closed := ""
	if public && reached {
		for dir := range dirsOf(name) {
			if dir == "." {
				continue
			}
			di, err := stat(dir)
			if err != nil {
				return nil, err
			}
			if di.mode&0o001 == 0 {
				closed = dir
				break
			}
		}
		if closed == "" {
			return nil, nil
		}
	}
	for dir := range dirsOf(name) {
		di, err := stat(dir)
		if err != nil {
			return nil, err
		}
		gateway := (di.uid == 0 || int(di.uid) == os.Geteuid()) && di.mode&0o022 == 0
		if di.uid != st.Uid && !gateway {
			return &denial{closed: closed, foreign: dir, uid: di.uid, linked: public && !reached}, nil
		}
	}
	return nil, nil
}

// judge is refusal for the file st, opened at name inside the bucket r
// (through symbolic links perhaps), on the directories it is in: a
// dirChain checks that they hold it. A file its key reaches only
// through a symbolic link (an alias inside the bucket), or moved away
// meanwhile, counts as closed to others and is judged on the directories
// at name's path.
func judge(r *os.Root, name string, st *syscall.Stat_t) (*denial, error) {
	c, err := openChain(r)
	if err != nil {
		return nil, err
	}
	defer c.close()
	if c.holds(name, st) {
		return refusal(c.stat, name, st, true)
	}
	return refusal(lstatDirs(r), name, st, false)
}

// dirsOf yields the directories from the bucket's (".") down to name's.
func dirsOf(name string) iter.Seq[string] {
	return func(yield func(string) bool) {
		if !yield(".") {
			return
		}
		for i := 0; i < len(name); i++ {
			if name[i] == '/' && !yield(name[:i]) {
				return
			}
		}
	}
}

// dirChain holds open the directories from a bucket's down to one inside
// it, each opened in the one above without following a symbolic link and
// described from its own descriptor. So what it says of them holds for
// the files opened in the last one (OpenFile), whatever a rename puts at
// their paths meanwhile: a bucket's owner can swap two of their
// directories with one rename (RENAME_EXCHANGE), as often as they like,
// and a check of the directories at a file's path after opening it would
// judge the wrong ones. Moving down the tree costs an openat and an fstat
// per directory, moving up a close, so a listing, which walks the bucket
// in order, pays them once per directory, not per object. Not safe for
// concurrent use.
type dirChain struct {
	dir    *os.File // the bucket's directory (nil: base is Root's)
	path   string   // dir's path
	base   int      // dir's descriptor, or Root's with prefix "<bucket>/"
	prefix string
	dirs   []string // held open, each in the one before: "a", "a/b", ...
	fds    []int
	infos  []dirInfo
	bucket *dirInfo // the bucket directory's, once asked for
}

// openChain is a dirChain of the bucket r.
func openChain(r *os.Root) (*dirChain, error) {
	f, err := r.Open(".")
	if err != nil {
		return nil, err
	}
	return &dirChain{dir: f, path: r.Name(), base: int(f.Fd())}, nil
}

func (c *dirChain) close() {
	c.up(0)
	if c.dir != nil {
		c.dir.Close()
	}
}

// up closes the directories below the first n.
func (c *dirChain) up(n int) {
	for _, fd := range c.fds[n:] {
		unix.Close(fd)
	}
	c.dirs, c.fds, c.infos = c.dirs[:n], c.fds[:n], c.infos[:n]
}

// top is the descriptor of the last directory held (base: the bucket's).
func (c *dirChain) top() int {
	if len(c.fds) == 0 {
		return c.base
	}
	return c.fds[len(c.fds)-1]
}

// cd makes dir ("." the bucket's) the last directory held, keeping those
// above it that are held already. dir must have no "." or ".."
// component; a symbolic link on the way fails (ENOTDIR).
func (c *dirChain) cd(dir string) error {
	if dir == "." {
		dir = ""
	}
	n := 0
	for n < len(c.dirs) && (dir == c.dirs[n] || strings.HasPrefix(dir, c.dirs[n]+"/")) {
		n++
	}
	c.up(n)
	for {
		cur, start := "", 0
		if len(c.dirs) > 0 {
			cur = c.dirs[len(c.dirs)-1]
			start = len(cur) + 1
		}
		if cur == dir {
			return nil
		}
		end := len(dir)
		if i := strings.IndexByte(dir[start:], '/'); i >= 0 {
			end = start + i
		}
		comp := dir[start:end]
		if comp == "" || comp == "." || comp == ".." {
			return syscall.EINVAL
		}
		var fd int
		var err error
		const flags = unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if len(c.fds) == 0 && c.prefix != "" {
			fd, err = unix.Openat2(c.base, c.prefix+comp, &unix.OpenHow{Flags: flags,
				Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
		} else {
			fd, err = unix.Openat(c.top(), comp, flags, 0)
		}
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return err
		}
		c.dirs, c.fds, c.infos = append(c.dirs, dir[:end]), append(c.fds, fd), append(c.infos, dirInfo{st.Uid, st.Mode})
	}
}

// OpenFile opens name (a path inside the bucket) in the directory that
// holds it, never following a symbolic link: a dirChain can stand for
// the bucket's os.Root in inspect.
func (c *dirChain) OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error) {
	flag |= unix.O_NOFOLLOW | unix.O_CLOEXEC
	if path.Dir(name) == "." && c.path != "" {
		// By its path: a file made of a descriptor (os.NewFile) costs an
		// fcntl, and no user can change the bucket directory's path
		// (Root's, and its name there).
		return os.OpenFile(filepath.Join(c.path, name), flag, perm)
	}
	if err := c.cd(path.Dir(name)); err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	fd, err := unix.Openat(c.top(), path.Base(name), flag, uint32(perm.Perm()))
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	return os.NewFile(uintptr(fd), filepath.Join(c.path, name)), nil
}

// holds reports whether the file st is at name in the bucket, reached
// without a symbolic link, and moves the chain to name's directory.
func (c *dirChain) holds(name string, st *syscall.Stat_t) bool {
	if c.cd(path.Dir(name)) != nil {
		return false
	}
	var at unix.Stat_t
	if unix.Fstatat(c.top(), path.Base(name), &at, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return false
	}
	return at.Dev == st.Dev && at.Ino == st.Ino
}

// stat is the dirStat of the directories held (the chain must hold
// those of the name judged) and of the bucket's.
func (c *dirChain) stat(dir string) (dirInfo, error) {
	if dir == "." {
		if c.bucket == nil {
			if c.dir == nil {
				return dirInfo{}, errors.New("the bucket's directory is not held")
			}
			var st unix.Stat_t
			if err := unix.Fstat(c.base, &st); err != nil {
				return dirInfo{}, err
			}
			c.bucket = &dirInfo{st.Uid, st.Mode}
		}
		return *c.bucket, nil
	}
	for i, d := range c.dirs {
		if d == dir {
			return c.infos[i], nil
		}
	}
	return dirInfo{}, fmt.Errorf("directory %s is not held", dir)
}

// open reports whether others may enter every directory held.
func (c *dirChain) open() bool {
	for _, di := range c.infos {
		if di.mode&0o001 == 0 {
			return false
		}
	}
	return true
}
