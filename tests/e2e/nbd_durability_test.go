package e2e

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// fioRegionJob is the fio job (command-line form) that writes — or with
// verify_only re-reads and verifies — cycle i's region: random 4k writes with
// crc32c verify headers and a cycle-dependent seed.
func fioRegionJob(i int, off, size int64) []string {
	return []string{
		fmt.Sprintf("--name=cycle%02d", i),
		fmt.Sprintf("--offset=%d", off),
		fmt.Sprintf("--size=%d", size),
		fmt.Sprintf("--randseed=%d", 7919*(i+1)),
	}
}

// fioRegionGlobals are the options shared by writing and verifying.
func fioRegionGlobals(uri string) []string {
	return []string{"--ioengine=nbd", "--uri=" + uri, "--rw=randwrite", "--bs=4k", "--iodepth=16",
		"--verify=crc32c", "--verify_fatal=1", "--verify_state_save=0"}
}

// TestNBDDurabilityKill9: at least 10 cycles of: fio writes a region with
// verify headers and ends with FLUSH, qemu-io writes a FUA block, then a
// background writer runs unflushed writes elsewhere and the server is killed
// with SIGKILL at a random moment; after the restart the attachment's
// nbd_uri still works and every region flushed (or written with FUA) in
// every cycle so far reads back exactly.
func TestNBDDurabilityKill9(t *testing.T) {
	t.Parallel()
	requireTools(t, "fio", "qemu-io", "nbdinfo")
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	admin.CreateVolume("--size", "128MiB", "--name", "dur")
	a := admin.Attach("dur", "hv1", "rw")

	const (
		cycles      = 10
		regionSize  = 4 * MiB
		fuaBase     = 64 * MiB // FUA blocks: 64 KiB per cycle from 64 MiB
		fuaSize     = 64 * KiB
		scratchBase = 96 * MiB // the unflushed writer's area
	)
	seed := time.Now().UnixNano()
	t.Logf("kill timing seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	start := time.Now()
	var verifyJobs []string
	for i := 0; i < cycles; i++ {
		cycleStart := time.Now()
		// 1. Flushed writes: fio with crc32c headers, FLUSH at the end.
		w := tool(t, time.Minute, "fio", append(append(fioRegionGlobals(a.NBDURI), "--do_verify=0", "--end_fsync=1"),
			fioRegionJob(i, int64(i)*regionSize, regionSize)...)...)
		if w.Code != 0 {
			t.Fatalf("cycle %d: fio write: %s", i, w)
		}
		// 2. A FUA write (durable before its reply, no flush).
		pat := 0x10 + i
		fuaOff := fuaBase + int64(i)*fuaSize
		if r := qemuIO(t, a.NBDURI, fmt.Sprintf("write -f -P %#x %d %d", pat, fuaOff, fuaSize)); qemuIOFailed(r) {
			t.Fatalf("cycle %d: qemu-io FUA write: %s", i, r)
		}
		verifyJobs = append(verifyJobs, fioRegionJob(i, int64(i)*regionSize, regionSize)...)

		written := time.Now()
		// 3. Unflushed writes in the background, then SIGKILL at a random
		// moment 0-500 ms later.
		bg := startBG(t, "fio", "--name=scratch", "--ioengine=nbd", "--uri="+a.NBDURI, "--rw=randwrite",
			"--bs=64k", "--iodepth=32", fmt.Sprintf("--offset=%d", scratchBase), "--size=32M",
			"--time_based", "--runtime=30")
		time.Sleep(time.Duration(rng.IntN(501)) * time.Millisecond)
		n.Kill()
		if !bg.Wait(10 * time.Second) {
			t.Errorf("cycle %d: the background fio did not notice the server's death within 10s: %s", i, bg)
		}
		bg.Kill()

		// 4. Restart on the same data dir and ports.
		killed := time.Now()
		n.Restart()

		// 5. The attachment persists and its URI works as is.
		var got Attachment
		admin.OK(&got, "attachment", "show", a.ID)
		if got.NBDURI != a.NBDURI || got.Export != a.Export {
			t.Fatalf("cycle %d: after the restart the attachment is %+v, want nbd_uri %s", i, got, a.NBDURI)
		}
		if info := nbdinfo(t, a.NBDURI); info.Exports[0].Size != 128*MiB {
			t.Fatalf("cycle %d: nbdinfo after restart: %+v", i, info)
		}

		restarted := time.Now()
		// 6. Every flushed region so far verifies; every FUA block reads back.
		v := tool(t, 2*time.Minute, "fio", append(append(fioRegionGlobals(a.NBDURI), "--verify_only"), verifyJobs...)...)
		if v.Code != 0 || strings.Contains(v.Stdout+v.Stderr, "verify:") {
			t.Fatalf("cycle %d: data flushed before the SIGKILL does not verify after the restart: %s", i, v)
		}
		var cmds []string
		for j := 0; j <= i; j++ {
			cmds = append(cmds, fmt.Sprintf("read -P %#x %d %d", 0x10+j, fuaBase+int64(j)*fuaSize, fuaSize))
		}
		if r := qemuIO(t, a.NBDURI, cmds...); qemuIOFailed(r) || strings.Contains(r.Stdout, "Pattern verification failed") {
			t.Fatalf("cycle %d: FUA writes lost after the SIGKILL: %s", i, r)
		}
		t.Logf("cycle %d: write %v, kill %v, restart %v, verify %v", i, written.Sub(cycleStart).Round(time.Millisecond),
			killed.Sub(written).Round(time.Millisecond), restarted.Sub(killed).Round(time.Millisecond), time.Since(restarted).Round(time.Millisecond))
	}
	t.Logf("%d kill -9 cycles in %v", cycles, time.Since(start).Round(time.Millisecond))

	// The verify is not vacuous: a region never written does not verify.
	bad := tool(t, time.Minute, "fio", append(append(fioRegionGlobals(a.NBDURI), "--verify_only"),
		fioRegionJob(99, 48*MiB, regionSize)...)...)
	if bad.Code == 0 {
		t.Errorf("fio --verify_only passed on a region that was never written: %s", bad)
	}

	// After all the restarts, detach still revokes live connections at once.
	c, err := dialNBD(n.NBD, a.Export)
	if err != nil {
		t.Fatalf("raw connection after the restarts: %v", err)
	}
	defer c.c.Close()
	admin.Detach(a.ID)
	c.c.SetReadDeadline(time.Now().Add(revokeWithin))
	if _, err := c.r.ReadByte(); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Errorf("after restarts, a live connection survived its attachment's detach: read returned %v", err)
	}
	if r := tool(t, 30*time.Second, "nbdinfo", a.NBDURI); r.Code == 0 {
		t.Errorf("nbdinfo on the detached URI succeeded after restarts: %s", r)
	}
}
