package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestNBDInfo: nbdinfo on the nbd_uri as printed — size, read-only flag,
// base:allocation, and block status showing holes and data.
func TestNBDInfo(t *testing.T) {
	t.Parallel()
	requireTools(t, "nbdinfo", "qemu-io")
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	vol := admin.CreateVolume("--size", "96MiB", "--name", "info")
	rw := admin.Attach("info", "hv1", "rw")

	info := nbdinfo(t, rw.NBDURI)
	e := info.Exports[0]
	if e.Size != vol.SizeBytes {
		t.Errorf("nbdinfo size %d, want %d", e.Size, vol.SizeBytes)
	}
	if e.ReadOnly {
		t.Errorf("rw attachment: nbdinfo says is_read_only: true")
	}
	if !contains(e.Contexts, "base:allocation") {
		t.Errorf("nbdinfo contexts %v lack base:allocation", e.Contexts)
	}
	if !e.CanFlush || !e.CanFUA || !e.CanTrim || !e.CanZero || !e.CanFastZero {
		t.Errorf("rw export: can_flush %v can_fua %v can_trim %v can_zero %v can_fast_zero %v, want all true",
			e.CanFlush, e.CanFUA, e.CanTrim, e.CanZero, e.CanFastZero)
	}
	if info.TLS {
		t.Errorf("plain nbd:// URI negotiated TLS")
	}
	// The plain-text form says the same.
	if out := toolOK(t, 30*time.Second, "nbdinfo", rw.NBDURI).Stdout; !strings.Contains(out, "is_read_only: false") || !strings.Contains(out, "base:allocation") {
		t.Errorf("nbdinfo output:\n%s", out)
	}

	// A fresh sparse volume is one hole (reading as zeroes).
	m := nbdmap(t, rw.NBDURI)
	if len(m) != 1 || m[0].Off != 0 || m[0].Len != vol.SizeBytes || m[0].Type&1 == 0 {
		t.Errorf("nbdinfo --map of a fresh volume: %+v, want one hole of %d bytes", m, vol.SizeBytes)
	}

	// After a write of 4 MiB at 8 MiB, that range is data, the rest holes.
	if r := qemuIO(t, rw.NBDURI, "write -P 0x11 8M 4M", "flush"); qemuIOFailed(r) {
		t.Fatalf("qemu-io write: %s", r)
	}
	m = nbdmap(t, rw.NBDURI)
	var total int64
	for i, x := range m {
		if x.Off != total {
			t.Errorf("nbdinfo --map: extent %d starts at %d, want %d: %+v", i, x.Off, total, m)
		}
		total += x.Len
		dataWanted := x.Off >= 8*MiB && x.Off+x.Len <= 12*MiB
		holeWanted := x.Off+x.Len <= 8*MiB || x.Off >= 12*MiB
		switch {
		case dataWanted && x.Type != 0:
			t.Errorf("nbdinfo --map: written range %d+%d reported as %q (type %d), want data", x.Off, x.Len, x.Desc, x.Type)
		case holeWanted && x.Type&1 == 0:
			t.Errorf("nbdinfo --map: unwritten range %d+%d reported as %q (type %d), want a hole", x.Off, x.Len, x.Desc, x.Type)
		case !dataWanted && !holeWanted:
			t.Errorf("nbdinfo --map: extent %d+%d straddles the written range 8M+4M", x.Off, x.Len)
		}
	}
	if total != vol.SizeBytes {
		t.Errorf("nbdinfo --map covers %d bytes, want %d: %+v", total, vol.SizeBytes, m)
	}
	hasData := false
	for _, x := range m {
		hasData = hasData || x.Type == 0
	}
	if !hasData {
		t.Errorf("nbdinfo --map shows no data after a write: %+v", m)
	}

	// A ro attachment: is_read_only true, and nbdinfo says so in text too.
	admin.Detach(rw.ID)
	ro := admin.Attach("info", "hv2", "ro")
	info = nbdinfo(t, ro.NBDURI)
	if !info.Exports[0].ReadOnly {
		t.Errorf("ro attachment: nbdinfo says is_read_only: false")
	}
	if info.Exports[0].Size != vol.SizeBytes {
		t.Errorf("ro attachment: size %d, want %d", info.Exports[0].Size, vol.SizeBytes)
	}
	if out := toolOK(t, 30*time.Second, "nbdinfo", ro.NBDURI).Stdout; !strings.Contains(out, "is_read_only: true") {
		t.Errorf("nbdinfo on a ro attachment:\n%s", out)
	}
	// Block status works read-only too.
	if m := nbdmap(t, ro.NBDURI); len(m) < 3 {
		t.Errorf("nbdinfo --map on the ro attachment: %+v", m)
	}
	// The old rw export name is dead.
	if r := tool(t, 30*time.Second, "nbdinfo", rw.NBDURI); r.Code == 0 {
		t.Errorf("nbdinfo on a detached attachment's URI succeeded: %s", r)
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// TestNBDQemuIO: qemu-io writes and reads back a pattern; on a ro
// attachment every kind of write fails and changes nothing.
func TestNBDQemuIO(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io")
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	vol := admin.CreateVolume("--size", "64MiB", "--name", "qio")
	rw := admin.Attach("qio", "hv1", "rw")

	if r := qemuIO(t, rw.NBDURI, "write -P 0x5a 1M 4M", "flush"); qemuIOFailed(r) || !strings.Contains(r.Stdout, "wrote 4194304/4194304 bytes at offset 1048576") {
		t.Fatalf("qemu-io write: %s", r)
	}
	// FUA writes, zeroes and discards through qemu-io on the rw export.
	if r := qemuIO(t, rw.NBDURI, "write -f -P 0x6b 32M 1M", "write -z 40M 1M", "discard 44M 1M"); qemuIOFailed(r) {
		t.Fatalf("qemu-io FUA write / write -z / discard: %s", r)
	}
	r := qemuIO(t, rw.NBDURI, "read -P 0x5a 1M 4M", "read -P 0 0 1M", "read -P 0 5M 1M", "read -P 0x6b 32M 1M", "read -P 0 40M 1M", "read -P 0 44M 1M")
	if qemuIOFailed(r) || strings.Contains(r.Stdout, "Pattern verification failed") {
		t.Fatalf("qemu-io read back: %s", r)
	}
	// A wrong pattern is detected (the check above is not vacuous).
	if r := qemuIO(t, rw.NBDURI, "read -P 0x5b 1M 4M"); !strings.Contains(r.Stdout, "Pattern verification failed") {
		t.Errorf("qemu-io read with a wrong pattern did not fail: %s", r)
	}
	// The data went to the store: the volume's image now allocates it.
	if a := allocatedTree(t, n.ImageDir(n.TopImage(admin, vol.ID))); a < 5*MiB {
		t.Errorf("the volume's image allocates %d bytes after 5 MiB were written and flushed", a)
	}
	before := fileSum(t, copyOut(t, rw.NBDURI))

	admin.Detach(rw.ID)
	ro := admin.Attach("qio", "hv2", "ro")
	// qemu sees the READ_ONLY flag: opening read-write is refused, and with
	// -r every write fails. (qemu never sends a write to a read-only export;
	// the raw client below checks the server's own refusal.)
	for _, cmd := range []string{"write -P 0x77 1M 4k", "write -f -P 0x77 1M 4k", "write -z 1M 4k", "discard 1M 4k", "aio_write -P 0x77 2M 64k"} {
		if r := qemuIO(t, ro.NBDURI, cmd, "aio_flush"); !qemuIOFailed(r) {
			t.Errorf("qemu-io %q on a ro attachment succeeded: %s", cmd, r)
		}
		if r := qemuIORO(t, ro.NBDURI, cmd, "aio_flush"); !qemuIOFailed(r) {
			t.Errorf("qemu-io -r %q on a ro attachment succeeded: %s", cmd, r)
		}
	}
	if r := qemuIORO(t, ro.NBDURI, "read -P 0x5a 1M 4M", "read -P 0x6b 32M 1M"); qemuIOFailed(r) || strings.Contains(r.Stdout, "Pattern verification failed") {
		t.Errorf("after refused writes on the ro attachment the data changed: %s", r)
	}
	if after := fileSum(t, copyOut(t, ro.NBDURI)); after != before {
		t.Errorf("the volume's data changed through a ro attachment")
	}

	// The same refusals at the protocol level: EPERM for write, trim, zero.
	c, err := dialNBD(n.NBD, ro.Export)
	if err != nil {
		t.Fatalf("raw client on the ro export: %v", err)
	}
	defer c.Close()
	if c.Flags&nbdTFlagReadOnly == 0 {
		t.Errorf("ro export: transmission flags %#x lack READ_ONLY", c.Flags)
	}
	for _, req := range []struct {
		name string
		typ  uint16
		data []byte
	}{
		{"WRITE", nbdCmdWrite, make([]byte, 4096)},
		{"TRIM", nbdCmdTrim, nil},
		{"WRITE_ZEROES", nbdCmdWriteZeroes, nil},
	} {
		errno, _, err := c.Do(req.typ, 0, uint64(MiB), 4096, req.data)
		if err != nil {
			t.Fatalf("%s on the ro export: %v", req.name, err)
		}
		if errno != nbdEPERM {
			t.Errorf("%s on the ro export: error %d, want EPERM (1)", req.name, errno)
		}
	}
	if errno, data, err := c.Do(nbdCmdRead, 0, uint64(MiB), 4096, nil); err != nil || errno != 0 || data[0] != 0x5a {
		t.Errorf("READ on the ro export after refused writes: errno %d err %v", errno, err)
	}
	if after := fileSum(t, copyOut(t, ro.NBDURI)); after != before {
		t.Errorf("the volume's data changed through refused raw requests")
	}
}

// writeRandomFile writes n pseudo-random bytes (ChaCha8, fast) to path and
// returns their sha256.
func writeRandomFile(t *testing.T, path string, n int64) string {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var seed [32]byte
	copy(seed[:], randomBytes(t, 32))
	rng := rand.NewChaCha8(seed)
	h := sha256.New()
	buf := make([]byte, 4*MiB)
	for left := n; left > 0; {
		b := buf[:min(left, int64(len(buf)))]
		rng.Read(b)
		h.Write(b)
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
		left -= int64(len(b))
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

var connectionsRE = regexp.MustCompile(`connections=(\d+)`)

// TestNBDCopy: nbdcopy a 1 GiB random image in and out, equal sha256, over
// several connections (the export advertises CAN_MULTI_CONN).
func TestNBDCopy(t *testing.T) {
	t.Parallel()
	requireTools(t, "nbdcopy", "nbdinfo")
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	dir := t.TempDir()

	// nbdcopy uses several connections when the server allows it.
	admin.CreateVolume("--size", "4MiB", "--name", "small")
	small := admin.Attach("small", "hv1", "rw")
	if !nbdinfo(t, small.NBDURI).Exports[0].CanMultiConn {
		t.Errorf("the export does not advertise CAN_MULTI_CONN")
	}
	r := toolOK(t, 60*time.Second, "nbdcopy", "--verbose", "--connections=4", "--threads=4", small.NBDURI, "null:")
	if m := connectionsRE.FindStringSubmatch(r.Stderr); m == nil {
		t.Errorf("nbdcopy --verbose did not say how many connections it used: %s", r)
	} else if c, _ := strconv.Atoi(m[1]); c < 2 {
		t.Errorf("nbdcopy used %d connection(s), want several (multi-conn)", c)
	}

	size := GiB
	vol := admin.CreateVolume("--size", sz(size), "--name", "big")
	a := admin.Attach("big", "hv1", "rw")
	in := filepath.Join(dir, "in.img")
	start := time.Now()
	want := writeRandomFile(t, in, size)
	t.Logf("generated 1 GiB in %v", time.Since(start).Round(time.Millisecond))

	start = time.Now()
	r = toolOK(t, 5*time.Minute, "nbdcopy", in, a.NBDURI)
	t.Logf("nbdcopy in: %v", r.Took.Round(time.Millisecond))
	out := filepath.Join(dir, "out.img")
	r = toolOK(t, 5*time.Minute, "nbdcopy", a.NBDURI, out)
	t.Logf("nbdcopy out: %v", r.Took.Round(time.Millisecond))
	os.Remove(in)
	if fileSize(t, out) != size {
		t.Fatalf("copied out %d bytes, want %d", fileSize(t, out), size)
	}
	if got := fileSum(t, out); got != want {
		t.Errorf("1 GiB image: sha256 after nbdcopy in and out %s, want %s", got, want)
		if got := fileSum(t, n.DataFile(admin, vol.ID)); got != want {
			t.Errorf("the file of the volume's one image differs too (sha256 %s): the write path lost or changed data", got)
		}
	}
	t.Logf("whole copy test: %v", time.Since(start).Round(time.Millisecond))
}

// TestNBDFioVerify: fio's nbd engine, random 4k writes at queue depth 32,
// verified with crc32c.
func TestNBDFioVerify(t *testing.T) {
	t.Parallel()
	requireTools(t, "fio")
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	admin.CreateVolume("--size", "64MiB", "--name", "fio")
	a := admin.Attach("fio", "hv1", "rw")
	r := tool(t, 3*time.Minute, "fio", "--name=v", "--ioengine=nbd", "--uri="+a.NBDURI,
		"--rw=randwrite", "--bs=4k", "--size=64M", "--iodepth=32",
		"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--verify_state_save=0")
	if r.Code != 0 {
		t.Fatalf("fio verify over the nbd engine failed: %s", r)
	}
	if !strings.Contains(r.Stdout, "v: (groupid=0") || strings.Contains(r.Stdout+r.Stderr, "verify: bad") {
		t.Errorf("unexpected fio output: %s", r)
	}
	// Mixed sizes and reads in flight too (out-of-order replies).
	r = tool(t, 3*time.Minute, "fio", "--name=mixed", "--ioengine=nbd", "--uri="+a.NBDURI,
		"--rw=randrw", "--bsrange=512-256k", "--size=32M", "--offset=16M", "--iodepth=64",
		"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--verify_state_save=0")
	if r.Code != 0 {
		t.Fatalf("fio mixed-size verify failed: %s", r)
	}
}
