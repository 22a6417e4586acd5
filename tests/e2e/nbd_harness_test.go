package e2e

// Helpers of the NBD end-to-end tests: attachments through the CLI, the
// real NBD clients (nbdinfo, qemu-io, nbdcopy, nbdfuse, fuse2fs, fio) run as
// processes, and a minimal raw NBD client for what no real client sends
// (requests beyond the end, unknown commands, disconnects mid-request).

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Attachment as the CLI prints it (brief §3).
type Attachment struct {
	ID        string `json:"id"`
	VolumeID  string `json:"volume_id"`
	Host      string `json:"host"`
	Mode      string `json:"mode"`
	Status    string `json:"status"`
	NBDURI    string `json:"nbd_uri"`
	Export    string `json:"export"`
	CreatedAt string `json:"created_at"`
}

// Attach runs `attach VOL --host HOST --mode MODE`.
func (c *Client) Attach(vol, host, mode string) Attachment {
	c.t.Helper()
	var a Attachment
	c.OK(&a, "attach", vol, "--host", host, "--mode", mode)
	if a.ID == "" || a.NBDURI == "" || a.Export == "" {
		c.t.Fatalf("attach %s to %s (%s) printed an incomplete attachment: %+v", vol, host, mode, a)
	}
	return a
}

// Detach runs `detach ID`.
func (c *Client) Detach(id string) {
	c.t.Helper()
	c.OK(nil, "detach", id)
}

// FailBody runs the CLI, checks the error contract like Fail and returns
// the decoded error body.
func (c *Client) FailBody(code string, args ...string) ErrorBody {
	c.t.Helper()
	r := c.Run(args...)
	var eb ErrorBody
	if r.Code != 1 {
		c.t.Errorf("expected exit 1 with %s: %s", code, r)
	}
	if err := json.Unmarshal([]byte(r.Stdout), &eb); err != nil {
		c.t.Errorf("expected {\"error\":{\"code\":%q}} on stdout: %v: %s", code, err, r)
		return eb
	}
	if eb.Error.Code != code {
		c.t.Errorf("expected error code %s, got %q: %s", code, eb.Error.Code, r)
	}
	if eb.Error.Message == "" || !strings.Contains(r.Stderr, eb.Error.Message) {
		c.t.Errorf("expected the error message on stderr: %s", r)
	}
	return eb
}

// ---------------------------------------------------------------------------
// Tools

// requireTools fails the test when a client program is missing.
func requireTools(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			t.Fatalf("%s is not installed (run make deps): %v", n, err)
		}
	}
}

// ToolResult is one run of an external program.
type ToolResult struct {
	Cmd    string
	Stdout string
	Stderr string
	Code   int // -1: did not exit normally (killed, timeout)
	Took   time.Duration
}

func (r ToolResult) String() string {
	return fmt.Sprintf("`%s` exit %d (took %v)\nstdout: %s\nstderr: %s",
		r.Cmd, r.Code, r.Took.Round(time.Millisecond), tail(strings.TrimSpace(r.Stdout), 4000), tail(strings.TrimSpace(r.Stderr), 4000))
}

// tool runs a program to completion (at most timeout) and returns what it did.
func tool(t testing.TB, timeout time.Duration, name string, args ...string) ToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = baseEnv()
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	start := time.Now()
	err := cmd.Run()
	r := ToolResult{Cmd: shellQuote(name, args...), Stdout: so.String(), Stderr: se.String(), Took: time.Since(start)}
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("run %s: %v", r.Cmd, err)
		}
		r.Code = ee.ExitCode()
		if ctx.Err() != nil {
			r.Stderr += fmt.Sprintf("\n(killed after the test's timeout of %v)", timeout)
		}
	}
	return r
}

// toolOK runs a program and requires exit 0.
func toolOK(t testing.TB, timeout time.Duration, name string, args ...string) ToolResult {
	t.Helper()
	r := tool(t, timeout, name, args...)
	if r.Code != 0 {
		t.Fatalf("expected success: %s", r)
	}
	return r
}

func shellQuote(name string, args ...string) string {
	parts := []string{name}
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " '\"$;&|") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

// bgProc is a program running in the background.
type bgProc struct {
	cmd  *exec.Cmd
	out  *logBuf
	done chan struct{}
	desc string
}

// startBG starts a program in the background; a cleanup kills it (by its
// pid) if it is still running when the test ends.
func startBG(t testing.TB, name string, args ...string) *bgProc {
	t.Helper()
	p := &bgProc{out: &logBuf{}, done: make(chan struct{}), desc: shellQuote(name, args...)}
	p.cmd = exec.Command(name, args...)
	p.cmd.Env = baseEnv()
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", p.desc, err)
	}
	go func() {
		p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Kill()
	})
	return p
}

// Kill sends SIGKILL unless the process already exited, and waits for it.
func (p *bgProc) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Kill()
	<-p.done
}

// Wait waits at most timeout for the process to exit; it reports whether it
// did.
func (p *bgProc) Wait(timeout time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// Exited reports whether the process has exited.
func (p *bgProc) Exited() bool { return p.Wait(0) }

// ExitCode is the exit code once exited (-1 when killed by a signal).
func (p *bgProc) ExitCode() int { return p.cmd.ProcessState.ExitCode() }

func (p *bgProc) String() string {
	state := "running"
	if p.Exited() {
		state = p.cmd.ProcessState.String()
	}
	return fmt.Sprintf("`%s` (%s)\noutput: %s", p.desc, state, tail(strings.TrimSpace(p.out.String()), 4000))
}

// ---------------------------------------------------------------------------
// nbdinfo

// NBDInfo is the part of `nbdinfo --json` the tests read.
type NBDInfo struct {
	Protocol   string `json:"protocol"`
	TLS        bool   `json:"TLS"`
	Structured bool   `json:"structured"`
	Exports    []struct {
		ExportName   string   `json:"export-name"`
		Size         int64    `json:"export-size"`
		Contexts     []string `json:"contexts"`
		ReadOnly     bool     `json:"is_read_only"`
		CanFlush     bool     `json:"can_flush"`
		CanFUA       bool     `json:"can_fua"`
		CanMultiConn bool     `json:"can_multi_conn"`
		CanTrim      bool     `json:"can_trim"`
		CanZero      bool     `json:"can_zero"`
		CanFastZero  bool     `json:"can_fast_zero"`
	} `json:"exports"`
}

// nbdinfo runs `nbdinfo --json URI` and requires success and one export.
func nbdinfo(t testing.TB, uri string) NBDInfo {
	t.Helper()
	r := toolOK(t, 30*time.Second, "nbdinfo", "--json", uri)
	var info NBDInfo
	if err := json.Unmarshal([]byte(r.Stdout), &info); err != nil {
		t.Fatalf("nbdinfo --json output is not JSON: %v: %s", err, r)
	}
	if len(info.Exports) != 1 {
		t.Fatalf("nbdinfo shows %d exports, want 1: %s", len(info.Exports), r)
	}
	return info
}

// mapExtent is one line of `nbdinfo --map`.
type mapExtent struct {
	Off, Len int64
	Type     int
	Desc     string
}

// nbdmap runs `nbdinfo --map URI` (base:allocation) and parses it.
func nbdmap(t testing.TB, uri string) []mapExtent {
	t.Helper()
	r := toolOK(t, 30*time.Second, "nbdinfo", "--map", uri)
	var out []mapExtent
	for _, line := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			t.Fatalf("nbdinfo --map: unexpected line %q: %s", line, r)
		}
		off, err1 := strconv.ParseInt(f[0], 10, 64)
		n, err2 := strconv.ParseInt(f[1], 10, 64)
		typ, err3 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil || err3 != nil {
			t.Fatalf("nbdinfo --map: unexpected line %q: %s", line, r)
		}
		out = append(out, mapExtent{off, n, typ, strings.Join(f[3:], " ")})
	}
	return out
}

// ---------------------------------------------------------------------------
// qemu-io

// qemuIO runs qemu-io on a raw NBD URI with the given commands.
func qemuIO(t testing.TB, uri string, cmds ...string) ToolResult {
	t.Helper()
	return qemuIOArgs(t, []string{"-f", "raw"}, uri, cmds...)
}

// qemuIORO runs qemu-io read-only (-r), as a read-only export requires.
func qemuIORO(t testing.TB, uri string, cmds ...string) ToolResult {
	t.Helper()
	return qemuIOArgs(t, []string{"-r", "-f", "raw"}, uri, cmds...)
}

func qemuIOArgs(t testing.TB, args []string, uri string, cmds ...string) ToolResult {
	t.Helper()
	args = append([]string{}, args...)
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	return tool(t, 60*time.Second, "qemu-io", append(args, uri)...)
}

// qemuIOFailed reports whether qemu-io's output shows a failed command.
func qemuIOFailed(r ToolResult) bool {
	out := r.Stdout + r.Stderr
	return r.Code != 0 || strings.Contains(out, "failed") || strings.Contains(out, "error")
}

// qemuSession is an interactive qemu-io keeping one NBD connection open.
type qemuSession struct {
	t    testing.TB
	p    *bgProc
	in   io.WriteCloser
	mu   sync.Mutex
	out  bytes.Buffer
	cond *sync.Cond
}

const qemuPrompt = "qemu-io> "

// startQemuSession starts `qemu-io ARGS` reading commands from a pipe and
// waits for its first prompt (the connection is then established).
func startQemuSession(t testing.TB, args ...string) *qemuSession {
	t.Helper()
	return startQemuSessionIn(t, "", args...)
}

// startQemuSessionIn is startQemuSession in network namespace netns ("":
// this one).
func startQemuSessionIn(t testing.TB, netns string, args ...string) *qemuSession {
	t.Helper()
	s := &qemuSession{t: t}
	s.cond = sync.NewCond(&s.mu)
	cmd := exec.Command("qemu-io", args...)
	if netns != "" {
		cmd = exec.Command("ip", append([]string{"netns", "exec", netns, "qemu-io"}, args...)...)
	}
	cmd.Env = baseEnv()
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	s.in = in
	w := writerFunc(func(b []byte) (int, error) {
		s.mu.Lock()
		s.out.Write(b)
		s.mu.Unlock()
		s.cond.Broadcast()
		return len(b), nil
	})
	cmd.Stdout, cmd.Stderr = w, w
	p := &bgProc{cmd: cmd, out: &logBuf{}, done: make(chan struct{}), desc: shellQuote("qemu-io", args...)}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", p.desc, err)
	}
	go func() {
		cmd.Wait()
		close(p.done)
		s.cond.Broadcast()
	}()
	s.p = p
	t.Cleanup(func() {
		in.Close()
		if !p.Wait(5 * time.Second) {
			p.Kill()
		}
	})
	if _, ok := s.waitPrompt(30 * time.Second); !ok {
		t.Fatalf("qemu-io session did not start: %s", s.output())
	}
	return s
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func (s *qemuSession) output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

// waitPrompt waits until the output ends with a prompt, consumes the
// output and returns it (without the prompt).
func (s *qemuSession) waitPrompt(timeout time.Duration) (string, bool) {
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, s.cond.Broadcast)
	defer timer.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for !strings.HasSuffix(s.out.String(), qemuPrompt) {
		if s.p.Exited() || time.Now().After(deadline) {
			out := s.out.String()
			s.out.Reset()
			return out, false
		}
		s.cond.Wait()
	}
	out := strings.TrimSuffix(s.out.String(), qemuPrompt)
	s.out.Reset()
	return out, true
}

// Do runs one command and returns its output.
func (s *qemuSession) Do(cmd string) string {
	s.t.Helper()
	if _, err := io.WriteString(s.in, cmd+"\n"); err != nil {
		s.t.Fatalf("qemu-io session: send %q: %v (%s)", cmd, err, s.p)
	}
	out, ok := s.waitPrompt(30 * time.Second)
	if !ok {
		s.t.Fatalf("qemu-io session: no prompt after %q; output: %s", cmd, out)
	}
	return out
}

// ---------------------------------------------------------------------------
// Volume data through NBD
//
// A volume's bytes live in a chain of copy-on-write images, so tests never
// open store files to read or write them: they attach the volume for a
// moment and use qemu-io (writes) and nbdcopy (reads), as a hypervisor would.

// ioHost is the host of the short-lived attachments these helpers make.
const ioHost = "e2e-io"

// withAttachment attaches vol (mode rw or ro) for the test's own I/O, runs
// fn with the attachment's nbd_uri, then detaches. The volume must not be
// attached already (one rw attachment at a time).
func (c *Client) withAttachment(vol, mode string, fn func(uri string)) {
	c.t.Helper()
	a := c.Attach(vol, ioHost, mode)
	fn(a.NBDURI)
	c.Detach(a.ID)
}

// writeRegionsURI writes each region through the export at uri with one
// qemu-io process (`write -s FILE`), then flushes.
func writeRegionsURI(t testing.TB, uri string, rs []region) {
	t.Helper()
	dir := t.TempDir()
	var cmds []string
	for i, r := range rs {
		p := filepath.Join(dir, fmt.Sprintf("region%d", i))
		if err := os.WriteFile(p, r.data, 0o600); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, fmt.Sprintf("write -q -s %s %d %d", p, r.off, len(r.data)))
	}
	if r := qemuIO(t, uri, append(cmds, "flush")...); qemuIOFailed(r) {
		t.Fatalf("qemu-io write of %d regions: %s", len(rs), r)
	}
	for i := range rs {
		os.Remove(filepath.Join(dir, fmt.Sprintf("region%d", i)))
	}
}

// WriteRegions writes each region into volume vol through a short-lived rw
// attachment, and flushes.
func (c *Client) WriteRegions(vol string, rs []region) {
	c.t.Helper()
	c.withAttachment(vol, "rw", func(uri string) { writeRegionsURI(c.t, uri, rs) })
}

// WriteVolume writes data at off into volume vol through NBD.
func (c *Client) WriteVolume(vol string, off int64, data []byte) {
	c.t.Helper()
	c.WriteRegions(vol, []region{{off, data}})
}

// copyOut copies the whole export at uri into a new sparse local file with
// nbdcopy and returns its path.
func copyOut(t testing.TB, uri string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "copy.img")
	toolOK(t, 5*time.Minute, "nbdcopy", uri, p)
	return p
}

// VolumeCopy copies volume vol, as read through a short-lived ro
// attachment, into a local sparse file and returns its path: check it with
// checkRegions, readAt, regionSum, fileSize.
func (c *Client) VolumeCopy(vol string) string {
	c.t.Helper()
	var p string
	c.withAttachment(vol, "ro", func(uri string) { p = copyOut(c.t, uri) })
	return p
}

// CheckVolume verifies, through NBD, that volume vol holds each region's
// data; it returns the local copy it checked.
func (c *Client) CheckVolume(what, vol string, rs []region) string {
	c.t.Helper()
	p := c.VolumeCopy(vol)
	checkRegions(c.t, what, p, rs)
	return p
}

// CheckSnapshot verifies that snapshot snap holds each region's data: a
// snapshot cannot be attached, so it clones it, checks the clone through
// NBD and deletes the clone. It returns the local copy it checked.
func (c *Client) CheckSnapshot(what, snap string, rs []region) string {
	c.t.Helper()
	clone := c.CreateVolume("--from-snapshot", snap)
	if clone.Status != "available" {
		c.t.Fatalf("%s: clone of snapshot %s is %s (%s)", what, snap, clone.Status, clone.StatusMessage)
	}
	p := c.CheckVolume(what+" (read through a clone)", clone.ID, rs)
	c.OK(nil, "volume", "delete", clone.ID)
	return p
}

// writeStampedFile writes n bytes to path, fast: one random MiB repeated,
// with every 4 KiB sector stamped with its own offset (so no two sectors
// are alike and a misplaced one is noticed). It returns the sha256.
func writeStampedFile(t testing.TB, path string, n int64) string {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pattern := randomBytes(t, int(MiB))
	buf := make([]byte, 4*MiB)
	h := sha256.New()
	w := bufio.NewWriterSize(io.MultiWriter(f, h), int(4*MiB))
	for off := int64(0); off < n; off += int64(len(buf)) {
		b := buf[:min(int64(len(buf)), n-off)]
		for i := 0; i < len(b); i += len(pattern) {
			copy(b[i:], pattern)
		}
		for i := 0; i+8 <= len(b); i += 4096 {
			binary.LittleEndian.PutUint64(b[i:], uint64(off)+uint64(i))
		}
		if _, err := w.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// exportPrefixSum is the sha256 of the first n bytes of the export at uri,
// streamed through `nbdcopy URI -` (nothing is written to disk; nbdcopy is
// stopped once n bytes are read).
func exportPrefixSum(t testing.TB, uri string, n int64) string {
	t.Helper()
	cmd := exec.Command("nbdcopy", uri, "-")
	cmd.Env = baseEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start nbdcopy: %v", err)
	}
	h := sha256.New()
	_, err = io.CopyN(h, out, n)
	cmd.Process.Kill()
	cmd.Wait()
	if err != nil {
		t.Fatalf("nbdcopy %s -: reading %d bytes: %v; stderr: %s", uri, n, err, stderr.String())
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ---------------------------------------------------------------------------
// FUSE mounts

// isMounted reports whether dir is a mount point (per /proc/self/mountinfo).
func isMounted(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

// fuseMount is a FUSE file system served by a foreground process.
type fuseMount struct {
	t   testing.TB
	Dir string
	p   *bgProc
}

// mountFUSE starts a FUSE server in the foreground (args must make it stay
// in the foreground) serving dir, and waits until dir is mounted. Unmount
// happens in a cleanup if the test does not do it.
func mountFUSE(t testing.TB, dir string, name string, args ...string) *fuseMount {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	m := &fuseMount{t: t, Dir: dir}
	m.p = startBG(t, name, args...)
	deadline := time.Now().Add(20 * time.Second)
	for !isMounted(dir) {
		if m.p.Exited() || time.Now().After(deadline) {
			t.Fatalf("%s did not mount %s: %s", name, dir, m.p)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() { m.unmount() })
	return m
}

// unmount unmounts and waits for the server process to finish (a FUSE file
// system writes its last data after the unmount, before it exits).
func (m *fuseMount) unmount() error {
	if isMounted(m.Dir) {
		out, err := exec.Command("fusermount3", "-u", m.Dir).CombinedOutput()
		if err != nil {
			// Busy or a dead server: detach lazily so nothing is left behind.
			exec.Command("fusermount3", "-u", "-z", m.Dir).Run()
			if !m.p.Wait(10 * time.Second) {
				m.p.Kill()
			}
			return fmt.Errorf("fusermount3 -u %s: %v: %s", m.Dir, err, out)
		}
	}
	if !m.p.Wait(30 * time.Second) {
		m.p.Kill()
		return fmt.Errorf("%s did not exit within 30s of its unmount", m.p.desc)
	}
	return nil
}

// Unmount unmounts and requires that the server exits cleanly.
func (m *fuseMount) Unmount() {
	m.t.Helper()
	if err := m.unmount(); err != nil {
		m.t.Fatalf("unmount: %v\n%s", err, m.p)
	}
	if code := m.p.ExitCode(); code != 0 {
		m.t.Errorf("%s exited %d after unmount: %s", m.p.desc, code, m.p)
	}
}

// nbdfuseMount runs `nbdfuse [-r] DIR/ URI`; the export appears as DIR/nbd.
func nbdfuseMount(t testing.TB, dir, uri string, readOnly bool) *fuseMount {
	t.Helper()
	args := []string{}
	if readOnly {
		args = append(args, "-r")
	}
	m := mountFUSE(t, dir, "nbdfuse", append(args, dir+"/", uri)...)
	deadline := time.Now().Add(10 * time.Second)
	for !exists(filepath.Join(dir, "nbd")) {
		if time.Now().After(deadline) {
			t.Fatalf("nbdfuse mounted %s without an nbd file: %s", dir, m.p)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return m
}

// fuse2fsMount runs `fuse2fs -f -o fakeroot[,ro] IMAGE DIR`.
func fuse2fsMount(t testing.TB, image, dir string, readOnly bool) *fuseMount {
	t.Helper()
	opts := "fakeroot"
	if readOnly {
		opts += ",ro"
	}
	return mountFUSE(t, dir, "fuse2fs", "-f", "-o", opts, image, dir)
}

// ---------------------------------------------------------------------------
// Raw NBD client

// NBD protocol constants (doc/proto.md).
const (
	nbdCmdRead        = 0
	nbdCmdWrite       = 1
	nbdCmdDisc        = 2
	nbdCmdFlush       = 3
	nbdCmdTrim        = 4
	nbdCmdWriteZeroes = 6

	nbdFlagFUA = 1 << 0

	nbdEPERM     = 1
	nbdEINVAL    = 22
	nbdENOSPC    = 28
	nbdEOVERFLOW = 75

	nbdTFlagReadOnly  = 1 << 1
	nbdTFlagMultiConn = 1 << 8
)

// rawNBD is a minimal NBD client: fixed newstyle, OPT_GO, simple replies,
// one request at a time unless the caller pipelines with Send/Recv.
type rawNBD struct {
	c      net.Conn
	r      *bufio.Reader
	Size   uint64
	Flags  uint16
	cookie uint64
}

// dialNBD connects to 127.0.0.1:port and selects export with NBD_OPT_GO.
func dialNBD(port int, export string) (*rawNBD, error) {
	c, err := net.DialTimeout("tcp", addr(port), 5*time.Second)
	if err != nil {
		return nil, err
	}
	n := &rawNBD{c: c, r: bufio.NewReader(c)}
	if err := n.handshake(export); err != nil {
		c.Close()
		return nil, err
	}
	return n, nil
}

func (n *rawNBD) handshake(export string) error {
	n.c.SetDeadline(time.Now().Add(10 * time.Second))
	defer n.c.SetDeadline(time.Time{})
	var hello [18]byte
	if _, err := io.ReadFull(n.r, hello[:]); err != nil {
		return fmt.Errorf("read greeting: %w", err)
	}
	if string(hello[:8]) != "NBDMAGIC" || string(hello[8:16]) != "IHAVEOPT" {
		return fmt.Errorf("not a newstyle greeting: %q", hello[:16])
	}
	if _, err := n.c.Write([]byte{0, 0, 0, 3}); err != nil { // FIXED_NEWSTYLE | NO_ZEROES
		return err
	}
	data := binary.BigEndian.AppendUint32(nil, uint32(len(export)))
	data = append(data, export...)
	data = binary.BigEndian.AppendUint16(data, 0)
	if err := n.sendOption(7, data); err != nil { // NBD_OPT_GO
		return err
	}
	for {
		typ, payload, err := n.optReply(7)
		if err != nil {
			return err
		}
		switch {
		case typ == 1: // ACK
			return nil
		case typ == 3 && len(payload) >= 12 && binary.BigEndian.Uint16(payload) == 0: // INFO_EXPORT
			n.Size = binary.BigEndian.Uint64(payload[2:])
			n.Flags = binary.BigEndian.Uint16(payload[10:])
		case typ&(1<<31) != 0:
			return fmt.Errorf("NBD_OPT_GO refused: reply type %#x: %s", typ, payload)
		}
	}
}

func (n *rawNBD) sendOption(opt uint32, data []byte) error {
	b := []byte("IHAVEOPT")
	b = binary.BigEndian.AppendUint32(b, opt)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	_, err := n.c.Write(append(b, data...))
	return err
}

func (n *rawNBD) optReply(opt uint32) (uint32, []byte, error) {
	var h [20]byte
	if _, err := io.ReadFull(n.r, h[:]); err != nil {
		return 0, nil, fmt.Errorf("read option reply: %w", err)
	}
	if binary.BigEndian.Uint64(h[:]) != 0x3e889045565a9 || binary.BigEndian.Uint32(h[8:]) != opt {
		return 0, nil, fmt.Errorf("bad option reply header %x", h)
	}
	l := binary.BigEndian.Uint32(h[16:])
	if l > 1<<20 {
		return 0, nil, fmt.Errorf("option reply of %d bytes", l)
	}
	p := make([]byte, l)
	if _, err := io.ReadFull(n.r, p); err != nil {
		return 0, nil, err
	}
	return binary.BigEndian.Uint32(h[12:]), p, nil
}

// Send writes one request (with payload for writes) and returns its cookie.
func (n *rawNBD) Send(typ, flags uint16, off uint64, length uint32, payload []byte) (uint64, error) {
	n.cookie++
	b := make([]byte, 28, 28+len(payload))
	binary.BigEndian.PutUint32(b[0:], 0x25609513)
	binary.BigEndian.PutUint16(b[4:], flags)
	binary.BigEndian.PutUint16(b[6:], typ)
	binary.BigEndian.PutUint64(b[8:], n.cookie)
	binary.BigEndian.PutUint64(b[16:], off)
	binary.BigEndian.PutUint32(b[24:], length)
	_, err := n.c.Write(append(b, payload...))
	return n.cookie, err
}

// Recv reads one simple reply; readLen says how many data bytes follow a
// successful reply to the request with that cookie (reads).
func (n *rawNBD) Recv(readLen func(cookie uint64) int) (cookie uint64, errno uint32, data []byte, err error) {
	n.c.SetReadDeadline(time.Now().Add(30 * time.Second))
	defer n.c.SetReadDeadline(time.Time{})
	var h [16]byte
	if _, err := io.ReadFull(n.r, h[:]); err != nil {
		return 0, 0, nil, err
	}
	if m := binary.BigEndian.Uint32(h[:]); m != 0x67446698 {
		return 0, 0, nil, fmt.Errorf("reply magic %#x is not a simple reply", m)
	}
	errno = binary.BigEndian.Uint32(h[4:])
	cookie = binary.BigEndian.Uint64(h[8:])
	if errno == 0 && readLen != nil {
		if l := readLen(cookie); l > 0 {
			data = make([]byte, l)
			if _, err := io.ReadFull(n.r, data); err != nil {
				return cookie, errno, nil, err
			}
		}
	}
	return cookie, errno, data, nil
}

// Do sends one request and waits for its reply.
func (n *rawNBD) Do(typ, flags uint16, off uint64, length uint32, payload []byte) (uint32, []byte, error) {
	c, err := n.Send(typ, flags, off, length, payload)
	if err != nil {
		return 0, nil, err
	}
	rc, errno, data, err := n.Recv(func(uint64) int {
		if typ == nbdCmdRead {
			return int(length)
		}
		return 0
	})
	if err == nil && rc != c {
		err = fmt.Errorf("reply for cookie %d, want %d", rc, c)
	}
	return errno, data, err
}

// Close sends DISC and closes the socket.
func (n *rawNBD) Close() {
	n.Send(nbdCmdDisc, 0, 0, 0, nil)
	n.c.Close()
}

// ---------------------------------------------------------------------------
// Process inspection

// PID is the server process's pid (0 when not running).
func (n *Node) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || n.cmd.Process == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// openFDs counts the open file descriptors of a process.
func openFDs(t testing.TB, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatalf("count fds of %d: %v", pid, err)
	}
	return len(ents)
}

// rssBytes is a process's resident set size.
func rssBytes(t testing.TB, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("status of %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS line %q: %v", line, err)
			}
			return kb * 1024
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}
