package e2e

import (
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// revokeWithin is how soon after `basalt detach` returns the attachment's
// connections must be closed.
const revokeWithin = 2 * time.Second

// fioExitWithin is how soon after `basalt detach` returns fio, whose
// connection it closed, must have exited.
const fioExitWithin = 10 * time.Second

// TestNBDDetachRevokes: `basalt detach` closes the attachment's live NBD
// connections at once — fio, nbdfuse, qemu-io and an idle raw connection —
// and the export name stops working, while another attachment of the same
// volume keeps working.
func TestNBDDetachRevokes(t *testing.T) {
	t.Parallel()
	requireTools(t, "fio", "nbdfuse", "nbdinfo", "qemu-io", "fusermount3")
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	admin.CreateVolume("--size", "64MiB", "--name", "rev", "--multiattach")
	a := admin.Attach("rev", "victim", "rw")
	b := admin.Attach("rev", "bystander", "rw")
	if r := qemuIO(t, a.NBDURI, "write -P 0x42 0 64M", "flush"); qemuIOFailed(r) {
		t.Fatalf("fill: %s", r)
	}

	// Live connections on A.
	fio := startBG(t, "fio", "--name=live", "--ioengine=nbd", "--uri="+a.NBDURI, "--rw=randrw",
		"--bs=4k", "--iodepth=8", "--size=32M", "--time_based", "--runtime=120") // writes stay below 32 MiB
	mnt := nbdfuseMount(t, filepath.Join(t.TempDir(), "nbd-a"), a.NBDURI, false)
	qa := startQemuSession(t, "-f", "raw", a.NBDURI)
	rawA, err := dialNBD(n.NBD, a.Export)
	if err != nil {
		t.Fatalf("raw connection to A: %v", err)
	}
	defer rawA.c.Close()
	// Live connections on B.
	qb := startQemuSession(t, "-f", "raw", b.NBDURI)
	rawB, err := dialNBD(n.NBD, b.Export)
	if err != nil {
		t.Fatalf("raw connection to B: %v", err)
	}
	defer rawB.Close()

	// All of them work now.
	if out := qa.Do("read -P 0x42 0 4k"); strings.Contains(out, "failed") {
		t.Fatalf("qemu-io on A before detach: %s", out)
	}
	if out := qb.Do("read -P 0x42 0 4k"); strings.Contains(out, "failed") {
		t.Fatalf("qemu-io on B before detach: %s", out)
	}
	if errno, data, err := rawA.Do(nbdCmdRead, 0, uint64(50*MiB), 4096, nil); err != nil || errno != 0 || data[0] != 0x42 {
		t.Fatalf("raw read on A before detach: errno %d, %v", errno, err)
	}
	f, err := os.Open(filepath.Join(mnt.Dir, "nbd"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	if _, err := f.ReadAt(buf, 60*MiB); err != nil || buf[0] != 0x42 {
		t.Fatalf("read through nbdfuse before detach: %v (byte %#x)", err, buf[0])
	}
	time.Sleep(500 * time.Millisecond)
	if fio.Exited() {
		t.Fatalf("fio ended before the detach: %s", fio)
	}

	// The raw idle connection: wait for the server to close it.
	rawClosed := make(chan error, 1)
	go func() {
		rawA.c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err := rawA.r.ReadByte()
		rawClosed <- err
	}()
	// nbdfuse: read fresh offsets until a read fails.
	var fuseErr error
	var fuseWG sync.WaitGroup
	stopFuse := make(chan struct{})
	fuseFailed := make(chan time.Time, 1)
	fuseWG.Add(1)
	go func() {
		defer fuseWG.Done()
		b := make([]byte, 4096)
		for {
			select {
			case <-stopFuse:
				return
			default:
			}
			off := 32*MiB + rand.Int64N(32*MiB/4096)*4096
			if _, err := f.ReadAt(b, off); err != nil {
				fuseErr = err
				fuseFailed <- time.Now()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	defer func() { close(stopFuse); fuseWG.Wait() }()

	detachStart := time.Now()
	admin.Detach(a.ID)
	detached := time.Now()

	// The raw idle connection is closed by the server.
	select {
	case err := <-rawClosed:
		if err == nil || (!errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "reset")) {
			t.Errorf("raw connection on A after detach: read returned %v, want EOF (closed by the server)", err)
		}
	case <-time.After(time.Until(detached.Add(revokeWithin))):
		t.Errorf("raw connection on A is still open %v after the detach", revokeWithin)
	}
	// nbdfuse reads fail.
	select {
	case at := <-fuseFailed:
		t.Logf("nbdfuse read failed %v after the detach command started (it took %v): %v",
			at.Sub(detachStart).Round(time.Millisecond), detached.Sub(detachStart).Round(time.Millisecond), fuseErr)
	case <-time.After(time.Until(detached.Add(revokeWithin))):
		t.Errorf("reads through nbdfuse on the detached attachment still succeed %v after the detach", revokeWithin)
	}
	// fio fails and exits. Checked last, with more time: the server closed
	// its connection before the detach answered (the raw connection shows
	// it), and how soon fio then tears its job down and exits is fio's
	// business — slower on a loaded machine.
	if !fio.Wait(time.Until(detached.Add(fioExitWithin))) {
		t.Errorf("fio on the detached attachment still runs %v after the detach", fioExitWithin)
	} else if fio.ExitCode() == 0 {
		t.Errorf("fio on the detached attachment exited 0 (it should see its connection closed): %s", fio)
	}
	// qemu-io on A: the next read fails.
	if out := qa.Do("read 0 4k"); !strings.Contains(out, "failed") {
		t.Errorf("qemu-io on the detached attachment could still read: %s", out)
	}
	// The export name no longer works: nbdinfo, a new raw connection.
	if r := tool(t, 30*time.Second, "nbdinfo", a.NBDURI); r.Code == 0 {
		t.Errorf("nbdinfo on the detached attachment's URI succeeded: %s", r)
	}
	if c, err := dialNBD(n.NBD, a.Export); err == nil {
		c.Close()
		t.Errorf("a new connection to the detached export was accepted")
	}

	// B is untouched: its connections and new ones work.
	if out := qb.Do("read -P 0x42 48M 64k"); strings.Contains(out, "failed") {
		t.Errorf("qemu-io on the other attachment failed after A's detach: %s", out)
	}
	if errno, data, err := rawB.Do(nbdCmdRead, 0, uint64(40*MiB), 4096, nil); err != nil || errno != 0 || data[0] != 0x42 {
		t.Errorf("raw read on the other attachment after A's detach: errno %d, %v", errno, err)
	}
	if info := nbdinfo(t, b.NBDURI); info.Exports[0].Size != 64*MiB {
		t.Errorf("nbdinfo on the other attachment: %+v", info)
	}
	if v := admin.Volume("rev"); v.Status != "in-use" || len(v.Attachments) != 1 {
		t.Errorf("volume after detaching one of two attachments: %s with %d attachments", v.Status, len(v.Attachments))
	}

	// Detaching B too closes B's connections.
	admin.Detach(b.ID)
	rawB.c.SetReadDeadline(time.Now().Add(revokeWithin))
	if _, err := rawB.r.ReadByte(); err == nil || !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "reset") {
		t.Errorf("raw connection on B after its detach: read returned %v, want EOF", err)
	}

	// The export names are secrets: not in the server's log (brief §9).
	log := n.Log()
	for _, e := range []string{a.Export, b.Export} {
		if i := strings.Index(log, e); i >= 0 {
			line := log[strings.LastIndex(log[:i], "\n")+1:]
			if j := strings.Index(line, "\n"); j >= 0 {
				line = line[:j]
			}
			t.Errorf("the server log contains an export name (a secret: anyone who reads it can open the volume):\n%s", line)
		}
	}
}
