package e2e

// Integrity layers end to end (issue 4, "Failures survived"): the checksum
// layer turns bytes flipped in a backing file into EIO for a real NBD
// client and into a scrub report, and repairs them from the good copy when
// it sits on a mirror; the crypt layer leaves no plaintext in any file of
// the store and cannot be opened without the cluster's key.
//
// Backing files are found through `volume show` (the stack's file paths)
// and edited only while the volume is detached, as a disk or an attacker
// would change them behind the server's back.

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/crypto/xts"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/block/crypt"
	_ "github.com/basalt-storage/basalt/internal/block/layers" // every layer type
	"github.com/basalt-storage/basalt/internal/keys"
)

// ---------------------------------------------------------------------------
// Helpers

// blockPattern is what writeBlockPattern writes: n blocks of 4 KiB, block
// i filled with byte base+i — distinctive in a backing file (no other
// content has these runs in this order) and checkable block by block
// with `qemu-io read -P`.
func blockPattern(base byte, n int) []byte {
	b := make([]byte, n*4096)
	for i := range n {
		for j := range 4096 {
			b[i*4096+j] = base + byte(i)
		}
	}
	return b
}

// blockPatternCmds are qemu-io commands writing (verb "write") or
// verifying (verb "read") blockPattern(base, n) at off.
func blockPatternCmds(verb string, off int64, base byte, n int) []string {
	var cmds []string
	for i := range n {
		cmds = append(cmds, fmt.Sprintf("%s -q -P 0x%02x %d 4k", verb, base+byte(i), off+int64(i)*4096))
	}
	return cmds
}

// qemuIOEIO runs one qemu-io read and requires that it fails with EIO —
// not a pattern mismatch (wrong data), not success.
func qemuIOEIO(t *testing.T, what, uri string, cmd string) {
	t.Helper()
	r := qemuIO(t, uri, cmd)
	out := r.Stdout + r.Stderr
	if strings.Contains(out, "Pattern verification failed") {
		t.Errorf("%s: the client got wrong data instead of an error: %s", what, r)
	} else if !strings.Contains(out, "Input/output error") {
		t.Errorf("%s: want the read to fail with EIO: %s", what, r)
	}
}

// qemuIOGood runs qemu-io commands and requires that all of them succeed
// (reads with -P verify the data).
func qemuIOGood(t *testing.T, what, uri string, cmds ...string) {
	t.Helper()
	if r := qemuIO(t, uri, cmds...); qemuIOFailed(r) || strings.Contains(r.Stdout, "Pattern verification failed") {
		t.Errorf("%s: %s", what, r)
	}
}

// findOnce returns the offset of the only occurrence of needle in the
// file at path (a backing file), failing if it is absent or repeated.
func findOnce(t *testing.T, path string, needle []byte) int64 {
	t.Helper()
	b := mustRead(t, path)
	i := bytes.Index(b, needle)
	if i < 0 {
		t.Fatalf("the %d-byte pattern written through NBD is not in %s", len(needle), path)
	}
	if j := bytes.LastIndex(b, needle); j != i {
		t.Fatalf("the pattern is in %s twice (at %d and %d)", path, i, j)
	}
	return int64(i)
}

// flipBytes inverts the bytes at each offset of path and syncs it: silent
// corruption, the way a disk or a stray writer would leave it.
func flipBytes(t *testing.T, path string, offs ...int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, off := range offs {
		b := make([]byte, 1)
		if _, err := f.ReadAt(b, off); err != nil {
			t.Fatal(err)
		}
		b[0] ^= 0xff
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// layerState is the state of the first layer of type typ of volume ref's
// live stack.
func layerState(t *testing.T, c *Client, ref, typ string) string {
	t.Helper()
	v := c.Volume(ref)
	n := v.Stack.Find(typ)
	if n == nil {
		t.Fatalf("volume %s has no %s layer: %+v", ref, typ, v.Stack)
	}
	return n.State
}

// scrubReport is last_job.report of a scrub.
type scrubReport struct {
	Checked  int64 `json:"checked_bytes"`
	Bad      int64 `json:"bad_blocks"`
	Repaired int64 `json:"repaired_blocks"`
}

// scrub runs `volume scrub REF --wait` and returns the report, requiring
// the job to have ended as a scrub without error.
func scrub(t *testing.T, c *Client, ref string) scrubReport {
	t.Helper()
	var v Volume
	c.OK(&v, "volume", "scrub", ref, "--wait")
	if v.Progress != nil || v.LastJob == nil || v.LastJob.Job != "scrub" || v.LastJob.Error != "" {
		t.Fatalf("volume scrub --wait: progress %+v, last_job %+v", v.Progress, v.LastJob)
	}
	var rep scrubReport
	if err := json.Unmarshal(v.LastJob.Report, &rep); err != nil {
		t.Fatalf("scrub report %s: %v", v.LastJob.Report, err)
	}
	return rep
}

// ---------------------------------------------------------------------------
// checksum

// TestChecksumDetectsFlippedBytes: a `verified` volume (checksum → cow →
// file). Three bytes flipped inside one 4 KiB block of the backing file
// make every NBD read covering that block fail with EIO (qemu-io, and
// nbdcopy of the whole volume fails rather than copying), while the
// other 15 blocks of the same 64 KiB pattern and other regions read
// correctly. While a client is connected, `volume show` reports the
// checksum layer `degraded`. A scrub reports exactly one bad block and
// none repaired (there is no copy to repair from), the block still fails
// and the file is left as it is; the server log names the block's
// offset. After a server restart the block still fails with EIO (the
// detection lives in the on-disk tables, not in a cache). Rewriting the
// block through NBD heals it, and a scrub then finds nothing bad.
func TestChecksumDetectsFlippedBytes(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io", "nbdcopy")
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	vol := admin.CreateVolume("--size", "16MiB", "--type", "verified", "--name", "v")
	if vol.Status != "available" {
		t.Fatalf("verified volume: %+v", vol)
	}

	const (
		patOff = 5 * MiB // in the checksum layer's second group
		other  = 1 * MiB // 1 MiB of 0x5a, in the first group
		badBlk = 7       // the block of the pattern that gets corrupted
	)
	pattern := blockPattern(0x41, 16)
	a := admin.Attach("v", "hv1", "rw")
	qemuIOGood(t, "write the pattern", a.NBDURI,
		append(blockPatternCmds("write", patOff, 0x41, 16), fmt.Sprintf("write -q -P 0x5a %d 1M", other), "flush")...)
	admin.Detach(a.ID)

	// Corrupt block 7 of the pattern in the backing file.
	files := admin.Volume("v").Stack.Files()
	if len(files) != 1 {
		t.Fatalf("verified volume has file layers %v, want one", files)
	}
	data := files[0]
	at := findOnce(t, data, pattern)
	blk := at + badBlk*4096
	flipBytes(t, data, blk+1, blk+2000, blk+4095)

	badOff := patOff + badBlk*4096
	goodCmds := func() []string {
		var cmds []string
		for i, c := range blockPatternCmds("read", patOff, 0x41, 16) {
			if i != badBlk {
				cmds = append(cmds, c)
			}
		}
		return append(cmds, fmt.Sprintf("read -q -P 0x5a %d 1M", other), "read -q -P 0 8M 1M", "read -q -P 0 15M 1M")
	}
	a = admin.Attach("v", "hv1", "rw")
	qemuIOEIO(t, "read of the corrupt block", a.NBDURI, fmt.Sprintf("read -P 0x%02x %d 4k", 0x41+badBlk, badOff))
	qemuIOEIO(t, "read of 512 bytes inside the corrupt block", a.NBDURI, fmt.Sprintf("read -P 0x%02x %d 512", 0x41+badBlk, badOff+1024))
	qemuIOEIO(t, "read of the whole pattern", a.NBDURI, fmt.Sprintf("read %d 64k", patOff))
	qemuIOGood(t, "reads around the corrupt block", a.NBDURI, goodCmds()...)
	if r := tool(t, time.Minute, "nbdcopy", a.NBDURI, filepath.Join(t.TempDir(), "copy.img")); r.Code == 0 {
		t.Errorf("nbdcopy of a volume with a corrupt block succeeded: %s", r)
	}
	// The stack is live while a client is connected: a qemu-io session
	// keeps it open, so the state below is that of the layer that saw the
	// corruption (a stack opened afresh knows of no bad block until it
	// reads one).
	sess := startQemuSession(t, "-f", "raw", a.NBDURI)
	if out := sess.Do(fmt.Sprintf("read %d 4k", badOff)); !strings.Contains(out, "Input/output error") {
		t.Errorf("read of the corrupt block in a qemu-io session: %s", out)
	}
	if got := layerState(t, admin, "v", "checksum"); got != "degraded" {
		t.Errorf("checksum layer after a corrupt read: state %q, want degraded", got)
	}

	// Scrub, with the client connected (the job shares the live stack).
	rep := scrub(t, admin, "v")
	if rep.Bad != 1 || rep.Repaired != 0 || rep.Checked != 16*MiB {
		t.Errorf("scrub report %+v, want 1 bad block, none repaired, 16 MiB checked", rep)
	}
	if got := layerState(t, admin, "v", "checksum"); got != "degraded" {
		t.Errorf("checksum layer after a scrub found a bad block: state %q, want degraded", got)
	}
	if log := n.Log(); !strings.Contains(log, "corrupt block") || !strings.Contains(log, fmt.Sprint(badOff)) {
		t.Errorf("the server log does not name the corrupt block at offset %d", badOff)
	}
	if out := sess.Do(fmt.Sprintf("read %d 4k", badOff)); !strings.Contains(out, "Input/output error") {
		t.Errorf("read of the corrupt block after the scrub: %s", out)
	}
	sess.in.Close()
	if !sess.p.Wait(10 * time.Second) {
		t.Fatalf("qemu-io session did not end: %s", sess.p)
	}
	admin.Detach(a.ID)
	if got := readAt(t, data, blk, 4096); bytes.Equal(got, pattern[badBlk*4096:(badBlk+1)*4096]) {
		t.Errorf("the corrupt block was silently 'fixed' in the file with no copy to repair from")
	}

	// Persistent: a restarted server detects it too.
	n.StopOK()
	n.Restart()
	a = admin.Attach("v", "hv1", "rw")
	qemuIOEIO(t, "read of the corrupt block after a restart", a.NBDURI, fmt.Sprintf("read %d 4k", badOff))
	qemuIOGood(t, "reads around the corrupt block after a restart", a.NBDURI, goodCmds()...)

	// Overwriting the whole block makes it good again.
	qemuIOGood(t, "rewrite the corrupt block", a.NBDURI, fmt.Sprintf("write -q -P 0x77 %d 4k", badOff), "flush",
		fmt.Sprintf("read -q -P 0x77 %d 4k", badOff))
	admin.Detach(a.ID)
	if rep := scrub(t, admin, "v"); rep.Bad != 0 || rep.Checked != 16*MiB {
		t.Errorf("scrub after the block was rewritten: %+v, want nothing bad", rep)
	}
}

// mirroredChecksumStack is an admin type with the checksum layer directly
// over a mirror of two files (below cow, so every image is mirrored and
// checksummed). The checksum layer repairs only from a child that offers
// copies (block.Copies): a mirror does, cow does not, so the checksum
// layer must sit right on the mirror.
const mirroredChecksumStack = `{"type":"cow","children":[{"type":"checksum","children":[
	{"type":"mirror","children":[
		{"type":"file","params":{"path":"leg0.img"}},
		{"type":"file","params":{"path":"leg1.img"}}]}]}]}`

// TestChecksumOverMirrorRepairs: an admin type cow → checksum → mirror of
// two files. Bytes flipped in one block of leg 0 and another block of leg
// 1 (so each leg must repair the other) are invisible to an NBD client:
// reads return the right data, the bad copies are rewritten from the good
// ones (the two leg files are byte-identical again afterwards) and the
// stack stays ok. Corrupted again (two more blocks, one per leg) with the
// volume detached, a scrub repairs both: report bad 2, repaired 2, legs
// identical, data correct through NBD, and a second scrub finds nothing.
func TestChecksumOverMirrorRepairs(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io")
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	admin.OK(nil, "type", "create", "verified-mirror", "--stack", stackFile(t, mirroredChecksumStack))
	admin.CreateVolume("--size", "16MiB", "--type", "verified-mirror", "--name", "m")

	const patOff = 5 * MiB
	pattern := blockPattern(0x61, 16)
	all := append(blockPatternCmds("read", patOff, 0x61, 16), "read -q -P 0x3c 1M 1M", "read -q -P 0 8M 1M")
	a := admin.Attach("m", "hv1", "rw")
	qemuIOGood(t, "write the pattern", a.NBDURI,
		append(blockPatternCmds("write", patOff, 0x61, 16), "write -q -P 0x3c 1M 1M", "flush")...)
	admin.Detach(a.ID)

	files := admin.Volume("m").Stack.Files()
	if len(files) != 2 || filepath.Base(files[0]) != "leg0.img" || filepath.Base(files[1]) != "leg1.img" {
		t.Fatalf("stack files %v, want leg0.img and leg1.img", files)
	}
	legs := [2]string{files[0], files[1]}
	same := func(what string) {
		t.Helper()
		if s0, s1 := sum(mustRead(t, legs[0])), sum(mustRead(t, legs[1])); s0 != s1 {
			t.Errorf("%s: the leg files differ (sha256 %s vs %s)", what, s0[:12], s1[:12])
		}
	}
	same("after writing")
	at := findOnce(t, legs[0], pattern)
	if at1 := findOnce(t, legs[1], pattern); at1 != at {
		t.Fatalf("the pattern is at %d in leg 0 and %d in leg 1", at, at1)
	}
	corrupt := func(leg, blk int) int64 {
		off := at + int64(blk)*4096
		flipBytes(t, legs[leg], off+3, off+1500, off+4000)
		return patOff + int64(blk)*4096
	}

	// Read repair: leg 0 is bad in block 7, leg 1 in block 3.
	bad7, bad3 := corrupt(0, 7), corrupt(1, 3)
	if s0, s1 := sum(mustRead(t, legs[0])), sum(mustRead(t, legs[1])); s0 == s1 {
		t.Fatal("flipping bytes did not change a leg file")
	}
	a = admin.Attach("m", "hv1", "rw")
	// The mirror spreads reads over its legs round-robin and nothing else
	// reads meanwhile: two reads of a block in a row reach both legs, so
	// one of them meets the bad copy (if none did, the legs would still
	// differ below).
	qemuIOGood(t, "reads of the blocks corrupt in one leg", a.NBDURI,
		fmt.Sprintf("read -q -P 0x%02x %d 4k", 0x61+7, bad7), fmt.Sprintf("read -q -P 0x%02x %d 4k", 0x61+7, bad7),
		fmt.Sprintf("read -q -P 0x%02x %d 4k", 0x61+3, bad3), fmt.Sprintf("read -q -P 0x%02x %d 4k", 0x61+3, bad3))
	qemuIOGood(t, "all data after read repair", a.NBDURI, all...)
	v := admin.Volume("m")
	if cs, mr := v.Stack.Find("checksum"), v.Stack.Find("mirror"); cs == nil || mr == nil || cs.State != "ok" || mr.State != "ok" {
		t.Errorf("stack after read repair: %+v, want checksum and mirror ok", v.Stack)
	}
	admin.Detach(a.ID)
	same("after read repair")
	if got := readAt(t, legs[0], at, len(pattern)); !bytes.Equal(got, pattern) {
		t.Errorf("leg 0 does not hold the pattern after read repair")
	}

	// Scrub repair, with the volume detached: leg 1 bad in block 11, leg 0
	// in block 12.
	corrupt(1, 11)
	corrupt(0, 12)
	rep := scrub(t, admin, "m")
	if rep.Bad != 2 || rep.Repaired != 2 || rep.Checked != 16*MiB {
		t.Errorf("scrub report %+v, want 2 bad blocks, 2 repaired, 16 MiB checked", rep)
	}
	same("after scrub")
	if got := readAt(t, legs[1], at, len(pattern)); !bytes.Equal(got, pattern) {
		t.Errorf("leg 1 does not hold the pattern after the scrub")
	}
	a = admin.Attach("m", "hv1", "ro")
	if r := qemuIORO(t, a.NBDURI, all...); qemuIOFailed(r) || strings.Contains(r.Stdout, "Pattern verification failed") {
		t.Errorf("data after scrub repair: %s", r)
	}
	admin.Detach(a.ID)
	if rep := scrub(t, admin, "m"); rep.Bad != 0 || rep.Repaired != 0 {
		t.Errorf("second scrub: %+v, want nothing bad", rep)
	}
}

// ---------------------------------------------------------------------------
// crypt

const canary = "basalt-plaintext-canary-"

// canaryBytes is n bytes of canary repeated.
func canaryBytes(n int) []byte {
	return bytes.Repeat([]byte(canary), n/len(canary)+1)[:n]
}

// canaryWindows are the distinct 16-byte windows of canary repeated —
// every 16 bytes any plaintext region of canaryBytes can show.
func canaryWindows(text string) [][]byte {
	rep := strings.Repeat(text, 3)
	var out [][]byte
	for i := range len(text) {
		out = append(out, []byte(rep[i:i+16]))
	}
	return out
}

// plaintextHits scans every regular file under each dir for any of the
// windows and returns "path: window" for each file holding one.
func plaintextHits(t *testing.T, windows [][]byte, dirs ...string) (hits []string, scanned int) {
	t.Helper()
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.Type().IsRegular() {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			scanned++
			for _, w := range windows {
				if bytes.Contains(b, w) {
					hits = append(hits, fmt.Sprintf("%s: %q", p, w))
					break
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return hits, scanned
}

// repeatedBlocks counts the non-zero 4 KiB blocks of a file equal to an
// earlier one.
func repeatedBlocks(t *testing.T, path string) int {
	t.Helper()
	b := mustRead(t, path)
	seen := map[[32]byte]bool{}
	var zero [4096]byte
	dups := 0
	for i := 0; i+4096 <= len(b); i += 4096 {
		blk := b[i : i+4096]
		if bytes.Equal(blk, zero[:]) {
			continue
		}
		h := sha256.Sum256(blk)
		if seen[h] {
			dups++
		}
		seen[h] = true
	}
	return dups
}

// TestCryptNoPlaintextOnDisk: an `encrypted` volume (crypt → cow → file)
// gets 4 MiB + 64 KiB of "basalt-plaintext-canary-" repeated through NBD.
// No file anywhere in the store (volume directories, every image) holds
// any 16-byte window of it — all 24 possible windows are searched, and the
// same scan finds them in the local copy read back through NBD, so it can
// see plaintext. The written sectors repeat (the text's period divides 3
// sectors) but the backing file holds no two equal non-zero 4 KiB blocks:
// the XTS tweak differs per sector. A snapshot and a clone of it read the
// plaintext back through NBD; after a second plaintext is written into the
// clone, still no file in the store holds either.
func TestCryptNoPlaintextOnDisk(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io", "nbdcopy")
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	admin.CreateVolume("--size", "16MiB", "--type", "encrypted", "--name", "e")
	regions := []region{{1 * MiB, canaryBytes(int(4 * MiB))}, {12 * MiB, canaryBytes(int(64 * KiB))}}
	a := admin.Attach("e", "hv1", "rw")
	writeRegionsURI(t, a.NBDURI, regions)
	local := copyOut(t, a.NBDURI)
	admin.Detach(a.ID)
	checkRegions(t, "encrypted volume read back", local, regions)

	windows := canaryWindows(canary)
	if hits, _ := plaintextHits(t, windows, local); len(hits) == 0 {
		t.Fatalf("the scan does not find the plaintext in the volume's own NBD copy %s: it could see nothing", local)
	}
	store := n.StoreDir()
	if hits, scanned := plaintextHits(t, windows, store); len(hits) > 0 {
		t.Errorf("plaintext on disk in %d of %d files: %v", len(hits), scanned, hits)
	} else if scanned < 3 {
		t.Errorf("only %d files under %s: the scan looked at nothing", scanned, store)
	}
	data := admin.Volume("e").Stack.Files()
	if len(data) != 1 {
		t.Fatalf("encrypted volume has file layers %v, want one", data)
	}
	if got := fileSize(t, data[0]); got < 16*MiB {
		t.Fatalf("%s is %d bytes", data[0], got)
	}
	if d := repeatedBlocks(t, local); d < 1000 {
		t.Fatalf("the plaintext read back has %d repeated 4 KiB blocks, want over 1000: the check below would mean nothing", d)
	}
	if d := repeatedBlocks(t, data[0]); d > 0 {
		t.Errorf("%s holds %d repeated 4 KiB blocks: equal plaintext sectors encrypt alike", data[0], d)
	}

	// Snapshot and clone: the plaintext reads back, the files stay dark.
	admin.CreateSnapshot("e", "--name", "s")
	clone := admin.CreateVolume("--from-snapshot", "s", "--name", "ec")
	if clone.Status != "available" || clone.Type != "encrypted" {
		t.Fatalf("clone: %+v", clone)
	}
	second := "clone-plaintext-canary-#"
	regions2 := []region{{8 * MiB, bytes.Repeat([]byte(second), 1000)}}
	a = admin.Attach("ec", "hv1", "rw")
	writeRegionsURI(t, a.NBDURI, regions2)
	local = copyOut(t, a.NBDURI)
	admin.Detach(a.ID)
	checkRegions(t, "clone of the encrypted volume", local, []region{regions[0], regions[1]})
	checkRegions(t, "clone, written after cloning", local, regions2)
	windows = append(windows, canaryWindows(second)...)
	if hits, scanned := plaintextHits(t, windows, store); len(hits) > 0 {
		t.Errorf("plaintext on disk after snapshot and clone, in %d of %d files: %v", len(hits), scanned, hits)
	}
	checkRegions(t, "the origin after its clone was written", admin.VolumeCopy("e"), regions)
}

// nodeClusterKey reads the node's cluster key (etcd /basalt/pki/data-key)
// from its embedded etcd, with the node's own certificate.
func nodeClusterKey(t *testing.T, n *Node) []byte {
	t.Helper()
	pki := filepath.Join(n.Data, "pki")
	cert, err := tls.LoadX509KeyPair(filepath.Join(pki, "server.pem"), filepath.Join(pki, "server-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(mustRead(t, filepath.Join(pki, "ca.pem"))) {
		t.Fatal("no CA certificate in pki/ca.pem")
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{"https://" + addr(n.EtcdClient)},
		DialTimeout: 5 * time.Second,
		TLS:         &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "/basalt/pki/data-key")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get /basalt/pki/data-key: %v (%d keys)", err, len(resp.Kvs))
	}
	var rec struct {
		Key []byte `json:"key"`
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil || len(rec.Key) != keys.Size {
		t.Fatalf("data-key record: %v (%d-byte key)", err, len(rec.Key))
	}
	return rec.Key
}

// specOf turns a described stack back into the spec that built it.
func specOf(s StackNode) block.Spec {
	sp := block.Spec{Type: s.Type, Params: s.Params}
	for _, c := range s.Children {
		sp.Children = append(sp.Children, specOf(c))
	}
	return sp
}

// copyTree copies the regular files under src to dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		out := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(out, 0o700)
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		f, err := os.Create(out)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, in); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestCryptWrongKeyCannotRead: an attacker holds every file of an
// `encrypted` volume (a copy of its volume directory and of the images)
// but not the cluster key. Building the volume's own stack over that copy
// with a random cluster key fails with the wrong-key error (keys.
// ErrWrongKey: the wrapped data key does not unwrap), and with no key
// service at all with crypt.ErrNoKeys; the same copy with the node's real
// cluster key (read from its etcd) opens and reads the plaintext back, so
// the failure is the key's alone. Decrypting the copied data file with a
// guessed XTS key, skipping the header check, yields none of the
// plaintext either.
func TestCryptWrongKeyCannotRead(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io")
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	vol := admin.CreateVolume("--size", "16MiB", "--type", "encrypted", "--name", "e")
	plain := canaryBytes(int(2 * MiB))
	const off = 4 * MiB
	admin.WriteVolume("e", off, plain)

	// The attacker's copy, taken with the volume detached.
	v := admin.Volume("e")
	if v.Stack == nil || v.Stack.Type != "crypt" {
		t.Fatalf("encrypted volume's stack: %+v", v.Stack)
	}
	spec := specOf(*v.Stack)
	loot := t.TempDir()
	copyTree(t, n.VolumeDir(vol.ID), filepath.Join(loot, "volume"))
	copyTree(t, n.ImagesDir(), filepath.Join(loot, "images"))
	env := func(k block.Keys) block.Env {
		return block.Env{Dir: filepath.Join(loot, "volume"), Images: filepath.Join(loot, "images"), ReadOnly: true, Keys: k}
	}

	wrong, err := keys.New(keys.Generate())
	if err != nil {
		t.Fatal(err)
	}
	if l, err := block.Build(env(wrong), spec); err == nil {
		l.Close()
		t.Errorf("the volume's stack opened with a random cluster key")
	} else if !errors.Is(err, keys.ErrWrongKey) || !strings.Contains(err.Error(), "wrong cluster key") {
		t.Errorf("open with a random cluster key: %v, want the wrong-key error", err)
	} else {
		t.Logf("open with a random cluster key: %v", err)
	}
	if l, err := block.Build(env(nil), spec); err == nil {
		l.Close()
		t.Errorf("the volume's stack opened without a cluster key")
	} else if !errors.Is(err, crypt.ErrNoKeys) {
		t.Errorf("open without a cluster key: %v, want crypt.ErrNoKeys", err)
	}

	// Control: the same files with the node's key read the plaintext.
	right, err := keys.New(nodeClusterKey(t, n))
	if err != nil {
		t.Fatal(err)
	}
	l, err := block.Build(env(right), spec)
	if err != nil {
		t.Fatalf("the copy does not open with the node's own cluster key: %v", err)
	}
	got := make([]byte, len(plain))
	err = l.ReadAt(got, off)
	l.Close()
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("the copy read with the node's key: err %v, plaintext matches %v", err, bytes.Equal(got, plain))
	}

	// Skipping the header check: a guessed data key decrypts the data
	// area to noise.
	files := v.Stack.Files()
	if len(files) != 1 {
		t.Fatalf("file layers %v", files)
	}
	rel, err := filepath.Rel(n.ImagesDir(), files[0])
	if err != nil {
		t.Fatal(err)
	}
	raw := mustRead(t, filepath.Join(loot, "images", rel))
	guess := make([]byte, crypt.KeySize)
	rand.Read(guess)
	c, err := xts.NewCipher(aes.NewCipher, guess)
	if err != nil {
		t.Fatal(err)
	}
	dec := make([]byte, 0, len(raw))
	sector := make([]byte, crypt.SectorSize)
	for i := int64(crypt.DataOffset); i+crypt.SectorSize <= int64(len(raw)); i += crypt.SectorSize {
		c.Decrypt(sector, raw[i:i+crypt.SectorSize], uint64((i-crypt.DataOffset)/crypt.SectorSize))
		dec = append(dec, sector...)
	}
	for _, w := range canaryWindows(canary) {
		if bytes.Contains(dec, w) || bytes.Contains(raw, w) {
			t.Fatalf("plaintext %q found decrypting %s with a guessed key", w, files[0])
		}
	}
}
