package e2e

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ext4Store is an ext4 file system on a loop device, mounted with
// errors=remount-ro, for a store that turns read-only for real: fail
// makes the kernel take an error (ext4's trigger_fs_error) and remount it
// read-only, as it does after a real one, with files open for writing.
type ext4Store struct {
	t        *testing.T
	img, mnt string
}

func mountExt4(t *testing.T, size string) *ext4Store {
	t.Helper()
	if os.Geteuid() != 0 {
		skipf(t, "a loop-mounted ext4 needs root")
	}
	for _, tool := range []string{"mkfs.ext4", "e2fsck", "losetup"} {
		if _, err := exec.LookPath(tool); err != nil {
			skipf(t, "%s is not installed", tool)
		}
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		skipf(t, "no loop devices here: %v", err)
	}
	dir := t.TempDir()
	s := &ext4Store{t: t, img: filepath.Join(dir, "ext4.img"), mnt: filepath.Join(dir, "mnt")}
	toolOK(t, time.Minute, "truncate", "-s", size, s.img)
	toolOK(t, time.Minute, "mkfs.ext4", "-q", "-F", s.img)
	if err := os.Mkdir(s.mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	s.mount()
	t.Cleanup(func() { exec.Command("umount", s.mnt).Run() })
	return s
}

func (s *ext4Store) mount() {
	toolOK(s.t, time.Minute, "mount", "-o", "loop,errors=remount-ro", s.img, s.mnt)
}

// fail makes the file system take an error; it is read-only afterwards.
func (s *ext4Store) fail() {
	s.t.Helper()
	dev := strings.TrimSpace(toolOK(s.t, time.Minute, "findmnt", "-n", "-o", "SOURCE", s.mnt).Stdout)
	trigger := filepath.Join("/sys/fs/ext4", filepath.Base(dev), "trigger_fs_error")
	if err := os.WriteFile(trigger, []byte("1"), 0); err != nil {
		skipf(s.t, "this kernel cannot inject an ext4 error: %v", err)
	}
	if f, err := os.Create(filepath.Join(s.mnt, "probe")); err == nil || !strings.Contains(err.Error(), "read-only") {
		if f != nil {
			f.Close()
		}
		s.t.Fatalf("after the injected error the file system is not read-only: %v", err)
	}
}

// repair is what an administrator does: unmount, check, mount again.
func (s *ext4Store) repair() {
	s.t.Helper()
	toolOK(s.t, time.Minute, "umount", s.mnt)
	// e2fsck exits 1 when it corrected something (the error it was told of).
	if r := tool(s.t, 5*time.Minute, "e2fsck", "-fy", s.img); r.Code > 1 {
		s.t.Fatalf("e2fsck: %s", r)
	}
	s.mount()
}

// liveQemuIO is a qemu-io connected before the store turned read-only:
// its connection, and the volume's open stack, outlive the change.
type liveQemuIO struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out strings.Builder
}

func startQemuIO(t *testing.T, uri, first string) *liveQemuIO {
	t.Helper()
	q := &liveQemuIO{cmd: exec.Command("qemu-io", "-f", "raw", uri)}
	q.cmd.Stdout, q.cmd.Stderr = &q.out, &q.out
	var err error
	if q.in, err = q.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := q.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.cmd.Process.Kill(); q.cmd.Wait() })
	io.WriteString(q.in, first+"\n")
	return q
}

// finish sends the last commands, ends the session and returns all it
// printed. (qemu-io reads commands from a pipe as they come; closing it
// makes it take every one sent.)
func (q *liveQemuIO) finish(t *testing.T, cmds ...string) string {
	t.Helper()
	io.WriteString(q.in, strings.Join(cmds, "\n")+"\nquit\n")
	q.in.Close()
	done := make(chan error, 1)
	go func() { done <- q.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		q.cmd.Process.Kill()
		t.Fatalf("qemu-io did not finish: %s", q.out.String())
	}
	return q.out.String()
}

// TestStoreTurnsReadOnly: the store's file system remounts itself
// read-only after an error (ext4's errors=remount-ro), with volumes of
// every redundancy attached and written. Nothing is lost and everything
// that can go on does: live NBD connections keep reading, their writes fail
// with EPERM (as a read-only export's), and no mirror or parity leg is
// failed — the legs share the broken file system, and failing them would
// leave the parity volume unreadable; new connections are served
// read-only (the handshake says so); the control API and S3 refuse
// writes with 503 StoreReadOnly and S3 GETs go on. After the
// administrator's repair (umount, e2fsck, mount) and a restart, every
// flushed byte reads back and every volume takes writes again, its legs
// all ok.
func TestStoreTurnsReadOnly(t *testing.T) {
	requireTools(t, "qemu-io", "nbdinfo", "aws")
	fs := mountExt4(t, "512M")
	n := StartNode(t, NodeOptions{Store: filepath.Join(fs.mnt, "store")})
	admin := n.Admin()
	s3 := n.S3User(admin)

	types := []string{"standard", "mirrored", "parity", "verified", "encrypted"}
	ids := map[string]string{}
	uris := map[string]string{}
	live := map[string]*liveQemuIO{}
	for _, typ := range types {
		ids[typ] = admin.CreateVolume("--size", "16MiB", "--name", typ, "--type", typ).ID
		uris[typ] = admin.Attach(ids[typ], "h1", "rw").NBDURI
		if r := qemuIO(t, uris[typ], "write -P 0x11 0 4M", "flush"); qemuIOFailed(r) {
			t.Fatalf("%s: %s", typ, r)
		}
		live[typ] = startQemuIO(t, uris[typ], "read -P 0x11 0 1M")
	}
	s3.AWSOK("s3api", "create-bucket", "--bucket", "robucket")
	body := filepath.Join(t.TempDir(), "body")
	if err := os.WriteFile(body, []byte(strings.Repeat("kept ", 1000)), 0o600); err != nil {
		t.Fatal(err)
	}
	s3.AWSOK("s3api", "put-object", "--bucket", "robucket", "--key", "k", "--body", body)
	time.Sleep(500 * time.Millisecond) // the live sessions' first reads

	fs.fail()

	for _, typ := range types {
		out := live[typ].finish(t, "write -P 0x22 4M 1M", "flush", "read -P 0x11 0 4M", "read -P 0 4M 1M")
		if !strings.Contains(out, "write failed: Operation not permitted") {
			t.Errorf("%s: a write on a connection made before the store turned read-only: want EPERM:\n%s", typ, out)
		}
		if strings.Contains(out, "read failed") || strings.Contains(out, "Pattern verification failed") || strings.Count(out, "read 4194304/4194304") != 1 {
			t.Errorf("%s: reads on a connection made before the store turned read-only:\n%s", typ, out)
		}
	}
	for _, typ := range types {
		if r := toolOK(t, time.Minute, "nbdinfo", uris[typ]); !strings.Contains(r.Stdout, "is_read_only: true") {
			t.Errorf("%s: an rw attachment on a read-only store is not served read-only:\n%s", typ, r.Stdout)
		}
		if r := qemuIOArgs(t, []string{"-r", "-f", "raw"}, uris[typ], "read -P 0x11 0 4M"); qemuIOFailed(r) {
			t.Errorf("%s: reading a new connection on a read-only store: %s", typ, r)
		}
	}
	for typ, layer := range map[string]string{"mirrored": "mirror", "parity": "parity"} {
		_, node := redShow(t, admin, ids[typ], layer)
		for k, st := range redLegStates(node) {
			if st != "ok" {
				t.Errorf("%s: leg %d is %s on a read-only store, want ok (stack %+v)", typ, k, st, node)
			}
		}
	}
	admin.Fail("StoreReadOnly", "volume", "create", "--size", "1MiB")
	admin.Fail("StoreReadOnly", "snapshot", "create", ids["standard"])
	put := s3.AWS("s3api", "put-object", "--bucket", "robucket", "--key", "k", "--body", body)
	if put.Code == 0 || !strings.Contains(put.Stderr, "StoreReadOnly") {
		t.Errorf("PUT into a read-only store: want StoreReadOnly, got %s", put)
	}
	got := filepath.Join(t.TempDir(), "got")
	s3.AWSOK("s3api", "get-object", "--bucket", "robucket", "--key", "k", got)
	if b, err := os.ReadFile(got); err != nil || string(b) != strings.Repeat("kept ", 1000) {
		t.Errorf("GET from a read-only store: %d bytes, %v", len(b), err)
	}

	n.StopOK()
	fs.repair()
	n.Restart()
	for _, typ := range types {
		if r := qemuIO(t, uris[typ], "read -P 0x11 0 4M", "read -P 0 4M 12M", "write -P 0x33 4M 1M", "flush", "read -P 0x33 4M 1M"); qemuIOFailed(r) {
			t.Errorf("%s after the repair: %s", typ, r)
		}
	}
	for typ, layer := range map[string]string{"mirrored": "mirror", "parity": "parity"} {
		_, node := redShow(t, admin, ids[typ], layer)
		for k, st := range redLegStates(node) {
			if st != "ok" {
				t.Errorf("%s after the repair: leg %d is %s, want ok", typ, k, st)
			}
		}
	}
	s3.AWSOK("s3api", "put-object", "--bucket", "robucket", "--key", "k", "--body", body)
	admin.CreateVolume("--size", "1MiB")
}
