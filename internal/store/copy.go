package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// CopyOptions tune Copy.
type CopyOptions struct {
	// Progress is called after each chunk with bytes covered so far.
	Progress func(done, total int64)
	// BytesPerSecond caps the data copy rate (0 = unlimited) so that a job
	// does not starve the volumes in production.
	BytesPerSecond int64
}

const copyChunk = 4 << 20

// Copy makes dst (which must not exist) a copy of src, keeping holes, then
// renames it to final. It first tries a reflink (FICLONE: O(1) on btrfs,
// XFS, OCFS2, bcachefs), then falls back to a sparse copy driven by
// SEEK_DATA/SEEK_HOLE. dst is fsynced before the rename so that final,
// once it exists, is complete and durable.
func (s *Store) Copy(ctx context.Context, src, final string, o CopyOptions) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	total := st.Size()
	tmp := s.TempPath(final)
	os.Remove(tmp) // a partial file from an interrupted attempt
	out, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	defer func() {
		out.Close()
		os.Remove(tmp)
	}()
	if o.BytesPerSecond == 0 && unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		if o.Progress != nil {
			o.Progress(total, total)
		}
	} else {
		if err := out.Truncate(total); err != nil {
			return err
		}
		if err := sparseCopy(ctx, in, out, total, o); err != nil {
			return err
		}
	}
	if err := out.Sync(); err != nil {
		return fmt.Errorf("copy: sync: %w", err)
	}
	if err := out.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	return syncDir(filepath.Dir(final))
}

func sparseCopy(ctx context.Context, in, out *os.File, total int64, o CopyOptions) error {
	buf := make([]byte, copyChunk)
	start := time.Now()
	var copied int64
	off := int64(0)
	for off < total {
		if err := ctx.Err(); err != nil {
			return err
		}
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if err != nil {
			if errors.Is(err, unix.ENXIO) { // only a hole remains
				break
			}
			data = off // SEEK_DATA unsupported: copy everything
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			hole = total
		}
		for p := data; p < hole; {
			n := min(int64(len(buf)), hole-p)
			r, err := in.ReadAt(buf[:n], p)
			if err != nil && !(errors.Is(err, io.EOF) && int64(r) == n) {
				return fmt.Errorf("copy: read at %d: %w", p, err)
			}
			if _, err := out.WriteAt(buf[:n], p); err != nil {
				return fmt.Errorf("copy: write at %d: %w", p, err)
			}
			p += n
			copied += n
			if o.Progress != nil {
				o.Progress(p, total)
			}
			if o.BytesPerSecond > 0 {
				want := time.Duration(float64(copied) / float64(o.BytesPerSecond) * float64(time.Second))
				if d := want - time.Since(start); d > 0 {
					select {
					case <-time.After(d):
					case <-ctx.Done():
						return ctx.Err()
					}
				}
			}
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		off = hole
	}
	if o.Progress != nil {
		o.Progress(total, total)
	}
	return nil
}
