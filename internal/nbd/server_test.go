package nbd

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/block"
)

// mapExports serves fixed exports by name.
type mapExports map[string]*Export

func (m mapExports) Open(_ context.Context, name string, _ *tls.ConnectionState) (*Export, error) {
	e, ok := m[name]
	if !ok {
		return nil, ErrUnknownExport
	}
	cp := *e
	return &cp, nil
}

// startServer serves exps on a loopback port and returns "host:port".
func startServer(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	return ln.Addr().String()
}

// fileExport makes a sparse file of size bytes and an export over it.
func fileExport(t *testing.T, name string, size int64, ro bool) (*Export, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), name+".img")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, size); err != nil {
		t.Fatal(err)
	}
	d, err := block.OpenFile(p, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return &Export{Name: name, Device: d, ReadOnly: ro}, p
}

func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not installed: run `make deps` (scripts/deps.sh installs the real NBD clients the tests drive)", name)
	}
	return p
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	needTool(t, name)
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestNbdinfo(t *testing.T) {
	exp, _ := fileExport(t, "disk", 64<<20, false)
	ro, _ := fileExport(t, "ro", 1<<20, true)
	addr := startServer(t, &Server{Exports: mapExports{"disk": exp, "ro": ro}})
	out := run(t, "nbdinfo", "nbd://"+addr+"/disk")
	for _, want := range []string{"export-size: 67108864", "can_flush: true", "can_fua: true", "can_multi_conn: true", "can_trim: true", "can_zero: true", "can_fast_zero: true", "is_read_only: false", "base:allocation"} {
		if !strings.Contains(out, want) {
			t.Errorf("nbdinfo output lacks %q:\n%s", want, out)
		}
	}
	out = run(t, "nbdinfo", "nbd://"+addr+"/ro")
	if !strings.Contains(out, "is_read_only: true") {
		t.Errorf("read-only export not shown read-only:\n%s", out)
	}
	out = run(t, "nbdinfo", "--map", "nbd://"+addr+"/disk")
	if !strings.Contains(out, "hole,zero") {
		t.Errorf("block status of a sparse export shows no hole:\n%s", out)
	}
}

func TestQemuIO(t *testing.T) {
	exp, path := fileExport(t, "disk", 16<<20, false)
	addr := startServer(t, &Server{Exports: mapExports{"disk": exp}})
	uri := "nbd://" + addr + "/disk"
	run(t, "qemu-io", "-f", "raw", "-c", "write -P 0xab 4096 65536", "-c", "flush", uri)
	out := run(t, "qemu-io", "-f", "raw", "-c", "read -P 0xab 4096 65536", "-c", "read -P 0 0 4096", uri)
	if strings.Contains(out, "Pattern verification failed") {
		t.Fatalf("pattern mismatch:\n%s", out)
	}
	b, _ := os.ReadFile(path)
	if b[4096] != 0xab || b[4096+65535] != 0xab || b[4095] != 0 {
		t.Fatal("backing file does not hold the written pattern")
	}
}
