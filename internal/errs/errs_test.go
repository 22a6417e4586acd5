package errs

import (
	"fmt"
	"io/fs"
	"net/http"
	"syscall"
	"testing"
)

// A full store is the caller's to act on, however deep in a chain of
// context the file system's refusal is: 507 InsufficientCapacity, saying
// so. Other errors stay internal; typed ones stay as they are.
func TestPublic(t *testing.T) {
	full := fmt.Errorf("create volume v: build stack: %w", &fs.PathError{Op: "write", Path: "/s/image.sb", Err: syscall.ENOSPC})
	quota := fmt.Errorf("put: %w", syscall.EDQUOT)
	typed := fmt.Errorf("ctx: %w", NotFound("volume", "v"))
	for _, c := range []struct {
		err    error
		ok     bool
		status int
		code   string
	}{
		{full, true, http.StatusInsufficientStorage, CodeInsufficientCapacity},
		{quota, true, http.StatusInsufficientStorage, CodeInsufficientCapacity},
		{typed, true, http.StatusNotFound, CodeNotFound},
		{fmt.Errorf("truncate: %w", syscall.EFBIG), true, http.StatusBadRequest, CodeInvalidSize},
		{fmt.Errorf("mkdir: %w", &fs.PathError{Op: "mkdir", Path: "/s/v", Err: syscall.EROFS}), true, http.StatusServiceUnavailable, CodeStoreReadOnly},
		{fmt.Errorf("ctx: %w", syscall.EIO), false, 0, ""},
	} {
		e, ok := Public(c.err)
		if ok != c.ok {
			t.Fatalf("%v: public %v, want %v", c.err, ok, c.ok)
		}
		if ok && (e.Kind.Status() != c.status || e.Code != c.code) {
			t.Fatalf("%v: %d %s, want %d %s", c.err, e.Kind.Status(), e.Code, c.status, c.code)
		}
	}
	if _, ok := As(full); ok {
		t.Fatal("As took a full disk for a typed error: workflows would read it as a transaction's refusal")
	}
}
