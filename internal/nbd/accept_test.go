package nbd

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestAcceptOutOfFiles: a connection that arrives while the process has
// no file descriptor left (EMFILE: a burst of connections, or of open
// volume files) is accepted once one is free again. Serve used to return
// on that error, and the node served no NBD connection until a restart.
func TestAcceptOutOfFiles(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	restore := lim
	t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &restore) })

	dev, _ := fileExport(t, "disk", 1<<20, false)
	s := &Server{Exports: mapExports{"disk": dev}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	t.Cleanup(func() { s.Close() })

	// Leave this process exactly one free descriptor: the client's.
	open, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	low := restore
	low.Cur = uint64(len(open) + 16)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Skipf("cannot lower RLIMIT_NOFILE: %v", err)
	}
	var fill []*os.File
	t.Cleanup(func() {
		for _, f := range fill {
			f.Close()
		}
	})
	for {
		f, err := os.Open(os.DevNull)
		if errors.Is(err, syscall.EMFILE) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		fill = append(fill, f)
	}
	fill[len(fill)-1].Close()
	fill = fill[:len(fill)-1]
	nc, err := net.DialTimeout("tcp", ln.Addr().String(), ioTimeout)
	if err != nil {
		t.Fatalf("dial with the last descriptor: %v", err)
	}
	defer nc.Close()

	time.Sleep(300 * time.Millisecond) // the server's accepts fail meanwhile
	select {
	case err := <-served:
		t.Fatalf("Serve returned while the process was out of descriptors: %v", err)
	default:
	}
	for _, f := range fill {
		f.Close()
	}
	fill = nil
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &restore); err != nil {
		t.Fatal(err)
	}
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := nc.Read(make([]byte, 1)); err != nil {
		t.Fatalf("the connection that waited for a descriptor got no greeting: %v", err)
	}
}
