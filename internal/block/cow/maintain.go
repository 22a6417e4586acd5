package cow

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/basalt-storage/basalt/internal/block"
)

// Maintenance of base images. A base's stack is opened read-only (nothing
// may change a frozen image's data), yet it needs repair and scrub like
// the top: after a snapshot most of a volume's data may live in bases, and
// a mirror or checksum below cow has an instance per image. Maintain opens
// a base read-write for its maintenance call only, under the image's lock,
// then reopens it read-only in place of the old instance, so reads and
// Describe show what the repair or scrub left.
//
// Why that is safe:
//   - Repair and scrub rewrite copies of data the image already holds (a
//     rebuilt leg, a block repaired from a good copy); what the image reads
//     as never changes, so the read-only instances other volumes' chains
//     hold of a shared base (clones of one snapshot) keep reading correct
//     data meanwhile — a leg they consider failed or stale they do not
//     read — and show the repaired state once reopened.
//   - Two read-write instances of one image would overwrite each other's
//     metadata, so every maintenance open holds the image's exclusive
//     maintenance lock (flock: it covers other volumes of this process and
//     other processes alike); a second maintainer waits for the first and
//     then finds the image repaired.
//   - Maintain only visits the images of the current chain. Every such
//     image is reachable from this volume's top, so the collector (Sweep,
//     gc.go) keeps it, whatever snapshots are deleted meanwhile. Images a
//     flatten detached are left alone: the collector may be removing them,
//     and a repair must not recreate files there.
//   - A base this layer froze itself (Snapshot, since the volume was
//     opened) still has the read-write instance it had as the top, serving
//     reads; it is maintained in place, under the lock too, rather than
//     opened a second time. That instance may write its metadata at any
//     time (a mirror clears write-intent bits once quiet, finishes a
//     resync), so while it is open no other volume (a clone of that
//     snapshot, in this process or on another node) opens the image
//     read-write: the instance holds a shared flock on the image's
//     superblock file (holdFrozen), and a maintainer that finds it held
//     refuses until the freezing volume's stack is closed.

// lockPoll is how often a maintainer waiting for an image's lock retries.
const lockPoll = 20 * time.Millisecond

// Maintain implements block.Maintained: the top's stack as it is, then
// each base's (Children's order).
func (l *Layer) Maintain(ctx context.Context, walk func(block.Layer) bool) error {
	l.chainMu.RLock()
	chain := l.chain()
	top := chain[0].dev
	l.chainMu.RUnlock()
	if !walk(top) {
		return nil
	}
	for _, im := range chain[1:] {
		more, err := l.maintainBase(ctx, im, walk)
		if err != nil {
			return fmt.Errorf("cow image %s: %w", im.meta.ID, err)
		}
		if !more {
			return nil
		}
	}
	return nil
}

// maintainBase calls walk with base image im's stack, opened read-write
// for the call if it is not already (see the package's maintenance notes).
func (l *Layer) maintainBase(ctx context.Context, im *image, walk func(block.Layer) bool) (bool, error) {
	l.chainMu.RLock()
	dev, rw := im.dev, im.rw
	l.chainMu.RUnlock()
	if l.env.ReadOnly || !block.HasMaintainer(dev) {
		return walk(dev), nil
	}
	dir := l.imageDir(im.meta.ID)
	unlock, err := lockImage(ctx, dir)
	if err != nil {
		return false, err
	}
	defer unlock()
	if rw {
		return walk(dev), nil
	}
	if held, err := isFrozenOpen(dir); err != nil || held {
		if err != nil {
			return false, fmt.Errorf("probe for a frozen read-write instance: %w", err)
		}
		return false, errors.New("the volume whose snapshot froze this image still has it open read-write (here or on another node): repair that volume, or this one again once that volume's stack is closed")
	}
	env := l.env
	env.Dir, env.Size, env.Create, env.Base, env.ReadOnly = dir, im.meta.Size, false, "", false
	wdev, err := block.Build(env, im.meta.Spec)
	if err != nil {
		return false, fmt.Errorf("open read-write for maintenance: %w", err)
	}
	more := walk(wdev)
	ferr := wdev.Flush()
	if cerr := wdev.Close(); ferr == nil {
		ferr = cerr
	}
	if ferr != nil {
		return more, fmt.Errorf("close after maintenance: %w", ferr)
	}
	env.ReadOnly = true
	fresh, err := block.Build(env, im.meta.Spec)
	if err != nil {
		// The old instance still reads correctly; it only describes the
		// state it opened with.
		return more, fmt.Errorf("reopen read-only after maintenance: %w", err)
	}
	l.chainMu.Lock()
	old := im.dev
	im.dev = fresh
	l.chainMu.Unlock()
	if err := old.Close(); err != nil {
		return more, fmt.Errorf("close the instance maintenance replaced: %w", err)
	}
	return more, nil
}

// Locks are flocks on files of the image, not on its directory: on NFS
// Linux emulates flock with byte-range locks, which need a descriptor open
// for writing for an exclusive lock — a directory cannot be.
//   - maintenance: exclusive, on alloc.map (lockImage);
//   - a frozen read-write instance: shared, on image.sb (holdFrozen);
//     a maintainer probes it with an exclusive try (isFrozenOpen).

// holdFrozen takes a shared lock (flock) on the superblock file of image
// directory dir for a read-write instance of the image that a Snapshot
// froze; closing the returned file releases it. Maintainers in every
// process — other volumes of this one and other nodes alike — probe it
// (isFrozenOpen) before opening the image read-write.
func holdFrozen(dir string) (*os.File, error) {
	f, err := os.Open(filepath.Join(dir, imgFile))
	if err != nil {
		return nil, fmt.Errorf("hold frozen image: %w", err)
	}
	// Only a probe holds the exclusive lock, for an instant; yet the
	// caller (a snapshot) keeps the volume's writers waiting, so a lock
	// left by a client the file server has not yet given up on is not
	// waited for long.
	for try := 0; ; try++ {
		err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if errors.Is(err, unix.EWOULDBLOCK) && try < 50 {
			time.Sleep(lockPoll)
			continue
		}
		if !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("hold frozen image: %w", err)
		}
	}
}

// isFrozenOpen reports whether some process holds a frozen read-write
// instance of the image in dir (holdFrozen's lock). The caller holds the
// image's maintenance lock, so no new frozen instance can appear: an
// image is frozen only as its volume's top, and a base is never the top.
func isFrozenOpen(dir string) (bool, error) {
	f, err := os.OpenFile(filepath.Join(dir, imgFile), os.O_RDWR, 0)
	if err != nil {
		return false, err
	}
	defer f.Close() // releases the probe's lock
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil:
			return false, nil
		case errors.Is(err, unix.EWOULDBLOCK):
			return true, nil
		case !errors.Is(err, unix.EINTR):
			return false, err
		}
	}
}

// lockImage takes the maintenance lock of the image in directory dir,
// waiting for another maintainer to let go until ctx is done, and returns
// its release.
func lockImage(ctx context.Context, dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, mapFile), os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("lock image: %w", err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing the descriptor releases the lock
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock image: %w", err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for another maintainer of the image: %w", ctx.Err())
		case <-time.After(lockPoll):
		}
	}
}
