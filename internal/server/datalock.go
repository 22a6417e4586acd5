package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/basalt-storage/basalt/internal/errs"
)

// CodeDataDirInUse: another server runs on the data directory.
const CodeDataDirInUse = "DataDirInUse"

// lockFileName is DATA/lock: a running server holds a flock on it.
const lockFileName = "lock"

// lockData takes the data directory for this server: an exclusive flock
// on DATA/lock, held until Close. A second server on the same directory
// is refused before it touches anything in it. Without the lock it would
// rewrite the node's certificates and identity and start a second etcd
// member on the first one's database and WAL — hanging on the database's
// own lock, and taking the data over the moment the first server stopped.
// The kernel drops a flock with its process, so a server killed with -9
// leaves nothing to clean up. The file records the holder's pid, for the
// message a refused server prints.
func lockData(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data dir lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder := "another process"
			if b, rerr := os.ReadFile(path); rerr == nil {
				if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil {
					holder = "process " + strconv.Itoa(pid)
				}
			}
			return nil, errs.Conflict(CodeDataDirInUse, "data directory %s is in use by another basalt server (%s holds %s); stop it first, or give this one its own --data",
				dir, holder, path)
		}
		return nil, fmt.Errorf("data dir lock %s: %w", path, err)
	}
	// Informational only: the flock, not the content, is the lock.
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
