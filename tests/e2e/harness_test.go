// Package e2e holds basalt's end-to-end tests: every test starts real
// `basalt server` processes in temporary data directories on free loopback
// ports and drives them with the real `basalt` CLI (os/exec, `-o json`) or a
// plain Go HTTPS client. Nothing here links the server in-process.
//
// The binary is $BASALT_BIN when set, else built once by TestMain.
//
// This file is the harness: node start/stop/kill/restart, the CLI runner,
// raw HTTPS helpers, JSON shapes, store paths and file helpers. Volume data
// is read and written through NBD only (nbd_harness_test.go).
package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// basaltBin is the absolute path of the basalt binary under test.
var basaltBin string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	if b := os.Getenv("BASALT_BIN"); b != "" {
		abs, err := filepath.Abs(b)
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e: BASALT_BIN: %v\n", err)
			return 1
		}
		if _, err := os.Stat(abs); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: BASALT_BIN: %v\n", err)
			return 1
		}
		basaltBin = abs
	} else {
		root, err := moduleRoot()
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
			return 1
		}
		dir, err := os.MkdirTemp("", "basalt-e2e-bin-")
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
			return 1
		}
		defer os.RemoveAll(dir)
		basaltBin = filepath.Join(dir, "basalt")
		cmd := exec.Command("go", "build", "-o", basaltBin, "./cmd/basalt")
		cmd.Dir = root
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: go build ./cmd/basalt: %v\n", err)
			return 1
		}
	}
	return m.Run()
}

// moduleRoot walks up from the working directory to the directory of go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory; set BASALT_BIN")
		}
		dir = parent
	}
}

// baseEnv is the environment of every process we start: ours, minus any
// BASALT_* variable (the CLI and the server read BASALT_<FLAG> for every
// flag, so a stray one in the developer's shell would change the test).
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BASALT_") {
			env = append(env, kv)
		}
	}
	return env
}

// ---------------------------------------------------------------------------
// Ports

var (
	portMu    sync.Mutex
	usedPorts = map[int]bool{}
)

// freePort returns a loopback port that was free a moment ago and that this
// test binary has not handed out before.
func freePort(t testing.TB) int {
	t.Helper()
	portMu.Lock()
	defer portMu.Unlock()
	for range 200 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("free port: %v", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !usedPorts[p] {
			usedPorts[p] = true
			return p
		}
	}
	t.Fatal("free port: none found")
	return 0
}

// ---------------------------------------------------------------------------
// Logs

// logBuf collects a process's output for printing when a test fails.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// tail returns at most the last max bytes of s.
func tail(s string, max int) string {
	if len(s) <= max {
		return s
	}
	return "…(truncated)…\n" + s[len(s)-max:]
}

// ---------------------------------------------------------------------------
// Nodes

// NodeOptions configure a basalt server process.
type NodeOptions struct {
	Name  string   // --name; default "node1"
	Data  string   // --data; default a fresh t.TempDir()
	Store string   // --store; default DATA/store
	Args  []string // more flags, e.g. "--image-grace", "0s"
	// NBDHost is the host part of --nbd (default 127.0.0.1; the port is
	// always a free one), e.g. "0.0.0.0" to listen beyond loopback.
	NBDHost string
	// Host is the address every listener uses and other nodes reach
	// (default 127.0.0.1), and NetNS the network namespace the process
	// runs in: a node on its own link that a test can cut (netns_test.go).
	Host, NetNS string
	// Env is added to the process's environment (at every start: a test
	// may change it between restarts), e.g. "BASALT_FAILPOINT=NAME".
	Env []string
}

// Node is one `basalt server` process; Restart reuses its data dir, ports
// and flags.
type Node struct {
	t    *testing.T
	opts NodeOptions
	Data string

	API, EtcdClient, EtcdPeer, S3, NBD int
	// EtcdHTTP is the member's /metrics port, on loopback. Fixed, like the
	// others: left to the kernel (the server's default), a restart could
	// be given a port this node's S3 or NBD listener has just freed, and
	// then fail to bind that listener.
	EtcdHTTP int

	log    *logBuf
	starts int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// StartNode starts a server and waits until GET /healthz answers 200. It
// registers a cleanup that stops the process and prints its log if the test
// failed.
func StartNode(t *testing.T, opts NodeOptions) *Node {
	t.Helper()
	n := NewNode(t, opts)
	n.Start()
	return n
}

// NewNode prepares a server without starting it.
func NewNode(t *testing.T, opts NodeOptions) *Node {
	t.Helper()
	if opts.Name == "" {
		opts.Name = "node1"
	}
	if opts.Data == "" {
		opts.Data = filepath.Join(t.TempDir(), "data")
	}
	n := &Node{t: t, opts: opts, Data: opts.Data, log: &logBuf{}}
	n.pickPorts()
	t.Cleanup(func() {
		if n.Running() {
			n.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-n.done:
			case <-time.After(10 * time.Second):
				n.cmd.Process.Kill()
				<-n.done
			}
		}
		if t.Failed() {
			t.Logf("==== log of basalt server %s (%s) ====\n%s\n==== end of log of %s ====",
				n.opts.Name, n.Data, tail(n.log.String(), 40000), n.opts.Name)
		}
	})
	return n
}

func (n *Node) pickPorts() {
	n.API, n.EtcdClient, n.EtcdPeer = freePort(n.t), freePort(n.t), freePort(n.t)
	n.S3, n.NBD, n.EtcdHTTP = freePort(n.t), freePort(n.t), freePort(n.t)
}

func (n *Node) serverArgs() []string {
	args := []string{"server",
		"--data", n.Data,
		"--name", n.opts.Name,
		"--api", n.addr(n.API),
		"--etcd-client", n.addr(n.EtcdClient),
		"--etcd-peer", n.addr(n.EtcdPeer),
		"--etcd-http", addr(n.EtcdHTTP),
		"--s3", n.addr(n.S3),
		"--nbd", n.addr(n.NBD), // last: NBDHost replaces its value below
	}
	if n.opts.Host != "" {
		args = append(args, "--advertise", n.opts.Host)
	}
	if n.opts.NBDHost != "" {
		args[len(args)-1] = net.JoinHostPort(n.opts.NBDHost, strconv.Itoa(n.NBD))
	}
	if n.opts.Store != "" {
		args = append(args, "--store", n.opts.Store)
	}
	return append(args, n.opts.Args...)
}

func addr(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

// addr is host:port on the node's address.
func (n *Node) addr(port int) string {
	if n.opts.Host == "" {
		return addr(port)
	}
	return net.JoinHostPort(n.opts.Host, strconv.Itoa(port))
}

// Start starts the process (first start: retrying with new ports if one was
// taken meanwhile by another process) and waits for health.
func (n *Node) Start() {
	n.t.Helper()
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		mark := len(n.log.String())
		if err = n.launch(); err == nil {
			return
		}
		if n.starts > 1 || !strings.Contains(n.log.String()[mark:], "address already in use") {
			break
		}
		// A port we picked was grabbed by someone else: try fresh ports
		// with a fresh data dir (the failed attempt may have written one).
		os.RemoveAll(n.Data)
		n.starts = 0
		n.pickPorts()
	}
	n.t.Fatalf("start basalt server %s: %v", n.opts.Name, err)
}

// Restart starts the process again with the same data dir, ports and flags.
func (n *Node) Restart() {
	n.t.Helper()
	if n.Running() {
		n.t.Fatalf("restart %s: still running", n.opts.Name)
	}
	if err := n.launch(); err != nil {
		n.t.Fatalf("restart basalt server %s: %v", n.opts.Name, err)
	}
}

// SetEnv replaces the environment added to the process from its next
// start on (NodeOptions.Env).
func (n *Node) SetEnv(env ...string) { n.opts.Env = env }

// launch runs the process and waits up to 60 s for /healthz == 200.
func (n *Node) launch() error {
	n.starts++
	args := n.serverArgs()
	cmd := exec.Command(basaltBin, args...)
	if n.opts.NetNS != "" {
		cmd = exec.Command("ip", append([]string{"netns", "exec", n.opts.NetNS, basaltBin}, args...)...)
	}
	cmd.Env = append(baseEnv(), n.opts.Env...)
	cmd.Stdout, cmd.Stderr = n.log, n.log
	fmt.Fprintf(n.log, "\n==== start #%d: basalt %s\n", n.starts, strings.Join(args, " "))
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	n.mu.Lock()
	n.cmd, n.done = cmd, done
	n.mu.Unlock()
	go func() {
		cmd.Wait()
		fmt.Fprintf(n.log, "==== process exited: %v\n", cmd.ProcessState)
		close(done)
	}()
	return n.waitHealthy(60 * time.Second)
}

// waitHealthy polls GET /healthz with the node's CA (DATA/pki/ca.pem) and no
// client certificate.
func (n *Node) waitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-n.done:
			return fmt.Errorf("server exited before it was healthy (%v); last health probe: %s", n.cmd.ProcessState, last)
		default:
		}
		// The cluster CA: DATA/pki/ca.pem, or (a node on an external etcd
		// may not keep one there) the admin identity's copy.
		ca, err := os.ReadFile(filepath.Join(n.Data, "pki", "ca.pem"))
		if err != nil {
			ca, err = os.ReadFile(filepath.Join(n.AdminDir(), "ca.pem"))
		}
		if err == nil {
			c := tlsClient(n.t, ca)
			c.Timeout = 2 * time.Second
			resp, err := c.Get(n.Endpoint() + "/healthz")
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return nil
				}
				last = fmt.Sprintf("HTTP %d %s", resp.StatusCode, body)
			} else {
				last = err.Error()
			}
			c.CloseIdleConnections()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("not healthy after %v; last health probe: %s", timeout, last)
}

// Running reports whether the process is alive.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.done == nil {
		return false
	}
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// Stop sends SIGTERM and waits (at most 15 s, then SIGKILL and an error) for
// the process to exit. It returns the exit code and how long exit took.
func (n *Node) Stop() (int, time.Duration) {
	n.t.Helper()
	if !n.Running() {
		n.t.Fatalf("stop %s: not running", n.opts.Name)
	}
	start := time.Now()
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(15 * time.Second):
		n.t.Errorf("basalt server %s did not exit within 15s of SIGTERM; sending SIGKILL", n.opts.Name)
		n.cmd.Process.Kill()
		<-n.done
	}
	return n.cmd.ProcessState.ExitCode(), time.Since(start)
}

// StopOK stops the node and requires exit status 0.
func (n *Node) StopOK() {
	n.t.Helper()
	if code, took := n.Stop(); code != 0 {
		n.t.Fatalf("basalt server %s exited %d after SIGTERM (took %v)", n.opts.Name, code, took)
	}
}

// Kill sends SIGKILL (a crash) and waits for the process to be gone.
func (n *Node) Kill() {
	n.t.Helper()
	if !n.Running() {
		n.t.Fatalf("kill %s: not running", n.opts.Name)
	}
	n.cmd.Process.Kill()
	<-n.done
}

// Log is everything the process printed so far, across restarts.
func (n *Node) Log() string { return n.log.String() }

// Endpoint is the control API URL.
func (n *Node) Endpoint() string { return "https://" + n.addr(n.API) }

// AdminDir is the node's admin identity directory.
func (n *Node) AdminDir() string { return filepath.Join(n.Data, "identities", "admin") }

// StoreDir is the data root.
func (n *Node) StoreDir() string {
	if n.opts.Store != "" {
		return n.opts.Store
	}
	return filepath.Join(n.Data, "store")
}

// VolumeDir is a volume's stack directory, STORE/volumes/<id>: cow.sb
// (which image is the volume's top) and the metadata of layers above cow.
// A volume's data is not there: it is a chain of images (ImagesDir), and
// tests read and write it through NBD only (WriteRegions, VolumeCopy).
func (n *Node) VolumeDir(id string) string { return filepath.Join(n.StoreDir(), "volumes", id) }

// ImagesDir holds every copy-on-write image, STORE/images/<img-id>/.
func (n *Node) ImagesDir() string { return filepath.Join(n.StoreDir(), "images") }

// ImageDir is one image's directory.
func (n *Node) ImageDir(id string) string { return filepath.Join(n.ImagesDir(), id) }

// WaitImages polls Images until done holds (images are collected in the
// background, soon after the delete that freed them) or timeout passes,
// and returns the last list.
func (n *Node) WaitImages(timeout time.Duration, done func([]string) bool) []string {
	n.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		imgs := n.Images()
		if done(imgs) || time.Now().After(deadline) {
			return imgs
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// imageGone is a WaitImages condition: img is gone.
func imageGone(img string) func([]string) bool {
	return func(imgs []string) bool { return !slices.Contains(imgs, img) }
}

// Images lists the image ids under STORE/images.
func (n *Node) Images() []string {
	n.t.Helper()
	ents, err := os.ReadDir(n.ImagesDir())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		n.t.Fatal(err)
	}
	var ids []string
	for _, e := range ents {
		ids = append(ids, e.Name())
	}
	return ids
}

// TopImage is the id of the image volume ref writes into: the directory
// under STORE/images of the file layer its `volume show` stack names.
func (n *Node) TopImage(c *Client, ref string) string {
	n.t.Helper()
	v := c.Volume(ref)
	if v.Stack == nil {
		n.t.Fatalf("volume show %s has no stack", ref)
	}
	files := v.Stack.Files()
	if len(files) == 0 {
		n.t.Fatalf("the stack of volume %s has no file layer: %+v", ref, *v.Stack)
	}
	rel, err := filepath.Rel(n.ImagesDir(), files[0])
	if err != nil || strings.HasPrefix(rel, "..") || !strings.Contains(rel, string(filepath.Separator)) {
		n.t.Fatalf("the file layer of volume %s is %s, not in an image under %s", ref, files[0], n.ImagesDir())
	}
	return strings.Split(rel, string(filepath.Separator))[0]
}

// DataFile is the backing file of the first file layer of volume ref's
// live stack: for a standard volume, STORE/images/<top image>/data.img.
// Tests may stat it (size, allocation) but never read or write it.
func (n *Node) DataFile(c *Client, ref string) string {
	n.t.Helper()
	v := c.Volume(ref)
	if v.Stack == nil || len(v.Stack.Files()) == 0 {
		n.t.Fatalf("volume show %s has no stack with a file layer: %+v", ref, v.Stack)
	}
	return v.Stack.Files()[0]
}

// Admin is a CLI client with the node's admin identity.
func (n *Node) Admin() *Client { return n.As(n.AdminDir()) }

// As is a CLI client with the identity in dir.
func (n *Node) As(dir string) *Client { return &Client{t: n.t, Endpoint: n.Endpoint(), Identity: dir} }

// ---------------------------------------------------------------------------
// CLI

// Client runs the basalt CLI against one endpoint with one identity.
type Client struct {
	t        *testing.T
	Endpoint string
	Identity string
}

// Result is one CLI run.
type Result struct {
	Args   []string
	Stdout string
	Stderr string
	Code   int
	Took   time.Duration
}

func (r Result) String() string {
	return fmt.Sprintf("`basalt %s` exit %d (took %v)\nstdout: %s\nstderr: %s",
		strings.Join(r.Args, " "), r.Code, r.Took.Round(time.Millisecond), strings.TrimSpace(r.Stdout), strings.TrimSpace(r.Stderr))
}

// Run runs `basalt ARGS -o json` with BASALT_ENDPOINT and BASALT_IDENTITY set.
func (c *Client) Run(args ...string) Result {
	c.t.Helper()
	return c.runRaw(append(append([]string{}, args...), "-o", "json")...)
}

// runRaw runs `basalt ARGS` exactly as given.
func (c *Client) runRaw(full ...string) Result {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, basaltBin, full...)
	cmd.Env = append(baseEnv(), "BASALT_ENDPOINT="+c.Endpoint, "BASALT_IDENTITY="+c.Identity)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	start := time.Now()
	err := cmd.Run()
	r := Result{Args: full, Stdout: so.String(), Stderr: se.String(), Took: time.Since(start)}
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			c.t.Fatalf("run basalt %v: %v", full, err)
		}
		r.Code = ee.ExitCode()
	}
	return r
}

// OK runs the CLI, requires exit 0 and decodes stdout into out (if non-nil).
func (c *Client) OK(out any, args ...string) Result {
	c.t.Helper()
	r := c.Run(args...)
	if r.Code != 0 {
		c.t.Fatalf("expected success: %s", r)
	}
	if out != nil {
		// Zero the target first: json.Unmarshal leaves fields the output
		// omits (progress once a job ended) as an earlier decode set them,
		// and callers poll with one variable.
		reflect.ValueOf(out).Elem().SetZero()
		if err := json.Unmarshal([]byte(r.Stdout), out); err != nil {
			c.t.Fatalf("decode JSON of %s: %v", r, err)
		}
	}
	return r
}

// ErrorBody is {"error":{"code","message"}}.
type ErrorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// Fail runs the CLI and checks the error contract: exit 1, the code in
// {"error":{"code":...}} on stdout, a message on stderr. It reports problems
// with Errorf (table tests go on) and returns whether all held.
func (c *Client) Fail(code string, args ...string) bool {
	c.t.Helper()
	r := c.Run(args...)
	if r.Code == 0 {
		c.t.Errorf("expected failure with %s, but the command succeeded: %s", code, r)
		return false
	}
	ok := true
	if r.Code != 1 {
		c.t.Errorf("expected exit 1 with %s: %s", code, r)
		ok = false
	}
	var eb ErrorBody
	if err := json.Unmarshal([]byte(r.Stdout), &eb); err != nil {
		c.t.Errorf("expected {\"error\":{\"code\":%q}} on stdout: %v: %s", code, err, r)
		return false
	}
	if eb.Error.Code != code {
		c.t.Errorf("expected error code %s, got %q: %s", code, eb.Error.Code, r)
		ok = false
	}
	if eb.Error.Message == "" {
		c.t.Errorf("error without a message: %s", r)
		ok = false
	}
	if !strings.Contains(r.Stderr, "error") {
		c.t.Errorf("expected the error message on stderr: %s", r)
		ok = false
	}
	return ok
}

// ---------------------------------------------------------------------------
// JSON shapes (brief §3)

// Progress of a volume's running job (flatten, repair, scrub).
type Progress struct {
	Job     string  `json:"job"`
	Done    int64   `json:"done"`
	Total   int64   `json:"total"`
	Percent float64 `json:"percent"`
	Phase   string  `json:"phase"`
	Object  string  `json:"object"`
}

// JobResult is how a volume's last job ended.
type JobResult struct {
	Job        string          `json:"job"`
	Error      string          `json:"error"`
	Report     json.RawMessage `json:"report"`
	FinishedAt string          `json:"finished_at"`
}

// StackNode is one layer of a volume's live stack (`volume show` only).
type StackNode struct {
	Type     string          `json:"type"`
	Params   json.RawMessage `json:"params"`
	State    string          `json:"state"`
	Progress *float64        `json:"progress"`
	Path     string          `json:"path"`
	Image    string          `json:"image"` // below cow: the image whose stack this is
	Children []StackNode     `json:"children"`
}

// Files lists the backing file paths of the tree's file layers, depth first.
func (s StackNode) Files() []string {
	var out []string
	if s.Path != "" {
		out = append(out, s.Path)
	}
	for _, c := range s.Children {
		out = append(out, c.Files()...)
	}
	return out
}

// Find returns the first node of type typ in the tree, depth first (nil if
// there is none, or s is nil).
func (s *StackNode) Find(typ string) *StackNode {
	if s == nil {
		return nil
	}
	if s.Type == typ {
		return s
	}
	for i := range s.Children {
		if n := s.Children[i].Find(typ); n != nil {
			return n
		}
	}
	return nil
}

// Volume as the CLI prints it.
type Volume struct {
	ID             string            `json:"id"`
	Name           string            `json:"name"`
	SizeBytes      int64             `json:"size_bytes"`
	Status         string            `json:"status"`
	StatusMessage  string            `json:"status_message"`
	Type           string            `json:"type"`
	Owner          string            `json:"owner"`
	Multiattach    bool              `json:"multiattach"`
	SourceSnapshot string            `json:"source_snapshot"`
	SourceObject   string            `json:"source_object"`
	CreatedAt      string            `json:"created_at"`
	Attachments    []json.RawMessage `json:"attachments"`
	Progress       *Progress         `json:"progress"`
	LastJob        *JobResult        `json:"last_job"`
	Stack          *StackNode        `json:"stack"`
}

// Snapshot as the CLI prints it.
type Snapshot struct {
	ID            string     `json:"id"`
	Name          string     `json:"name"`
	VolumeID      string     `json:"volume_id"`
	SizeBytes     int64      `json:"size_bytes"`
	Status        string     `json:"status"`
	StatusMessage string     `json:"status_message"`
	Owner         string     `json:"owner"`
	CreatedAt     string     `json:"created_at"`
	Progress      *Progress  `json:"progress"`
	LastJob       *JobResult `json:"last_job"`
}

// VolumeType as the CLI prints it.
type VolumeType struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Stack       json.RawMessage `json:"stack"`
	BuiltIn     bool            `json:"built_in"`
}

// User as the CLI prints it.
type User struct {
	Name        string `json:"name"`
	Admin       bool   `json:"admin"`
	AccessKeyID string `json:"access_key_id"`
}

// Status is `basalt status -o json`.
type Status struct {
	Node struct {
		Name      string `json:"name"`
		ClusterID string `json:"cluster_id"`
	} `json:"node"`
	Metadata struct {
		Healthy  bool   `json:"healthy"`
		Embedded bool   `json:"embedded"`
		Error    string `json:"error"`
	} `json:"metadata"`
	Store struct {
		Healthy          bool    `json:"healthy"`
		Error            string  `json:"error"`
		Path             string  `json:"path"`
		TotalBytes       int64   `json:"total_bytes"`
		FreeBytes        int64   `json:"free_bytes"`
		ProvisionedBytes int64   `json:"provisioned_bytes"`
		LimitBytes       int64   `json:"limit_bytes"`
		Overcommit       float64 `json:"overcommit"`
	} `json:"store"`
}

// CreateVolume runs `volume create ARGS`.
func (c *Client) CreateVolume(args ...string) Volume {
	c.t.Helper()
	var v Volume
	c.OK(&v, append([]string{"volume", "create"}, args...)...)
	return v
}

// Volume runs `volume show REF`.
func (c *Client) Volume(ref string) Volume {
	c.t.Helper()
	var v Volume
	c.OK(&v, "volume", "show", ref)
	return v
}

// Volumes runs `volume list`.
func (c *Client) Volumes() []Volume {
	c.t.Helper()
	var vs []Volume
	c.OK(&vs, "volume", "list")
	return vs
}

// CreateSnapshot runs `snapshot create VOL ARGS`.
func (c *Client) CreateSnapshot(vol string, args ...string) Snapshot {
	c.t.Helper()
	var s Snapshot
	c.OK(&s, append([]string{"snapshot", "create", vol}, args...)...)
	return s
}

// Snapshot runs `snapshot show REF`.
func (c *Client) Snapshot(ref string) Snapshot {
	c.t.Helper()
	var s Snapshot
	c.OK(&s, "snapshot", "show", ref)
	return s
}

// Snapshots runs `snapshot list ARGS`.
func (c *Client) Snapshots(args ...string) []Snapshot {
	c.t.Helper()
	var ss []Snapshot
	c.OK(&ss, append([]string{"snapshot", "list"}, args...)...)
	return ss
}

// Status runs `status`.
func (c *Client) Status() Status {
	c.t.Helper()
	var st Status
	c.OK(&st, "status")
	return st
}

// CreateUser runs `user create NAME --out DIR` (DIR a fresh temp dir) and
// returns a client with the new identity.
func (c *Client) CreateUser(name string) *Client {
	c.t.Helper()
	dir := filepath.Join(c.t.TempDir(), "identity-"+name)
	var u User
	c.OK(&u, "user", "create", name, "--out", dir)
	if u.Name != name {
		c.t.Fatalf("user create %s printed user %q", name, u.Name)
	}
	return &Client{t: c.t, Endpoint: c.Endpoint, Identity: dir}
}

// WaitJob polls until the volume's job has ended (no progress any more)
// and returns the volume, whose last_job says how it ended.
func (c *Client) WaitJob(ref string, timeout time.Duration) Volume {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v := c.Volume(ref)
		if v.Progress == nil {
			return v
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("volume %s still runs its %s job after %v (progress %+v)", ref, v.Progress.Job, timeout, *v.Progress)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// slowImagesStack is a volume type template whose images are throttled to
// 40 operations a second: cow copies and flattens one 64 KiB chunk per read
// and per write, so flattening a clone of 16 MiB takes about 5 s on any
// machine, while large writes (one operation each) stay quick.
const slowImagesStack = `{"type":"cow","children":[{"type":"throttle","params":{"iops":40},
	"children":[{"type":"file","params":{"path":"data.img"}}]}]}`

// stackFile writes a layer stack template (JSON) for `type create --stack`
// into a temp file and returns its path.
func stackFile(t *testing.T, spec string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "stack.json")
	if err := os.WriteFile(p, []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// requireKeys checks that a JSON object has every key.
func requireKeys(t *testing.T, what string, raw []byte, keys ...string) {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("%s is not a JSON object: %v: %s", what, err, raw)
	}
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			t.Errorf("%s lacks field %q: %s", what, k, raw)
		}
	}
}

// ---------------------------------------------------------------------------
// Raw HTTPS

// tlsClient is an HTTPS client trusting caPEM and presenting certs (if any).
func tlsClient(t testing.TB, caPEM []byte, certs ...tls.Certificate) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("no certificate in CA PEM")
	}
	return &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: pool, Certificates: certs, MinVersion: tls.VersionTLS12},
			DisableKeepAlives: true,
		},
	}
}

// identityHTTP is an HTTPS client with the identity in dir.
func identityHTTP(t testing.TB, dir string) *http.Client {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"))
	if err != nil {
		t.Fatalf("load identity %s: %v", dir, err)
	}
	return tlsClient(t, mustRead(t, filepath.Join(dir, "ca.pem")), cert)
}

// call sends one request and returns the status, the error code (if the body
// is an error body) and the body.
func call(t testing.TB, c *http.Client, method, url, body string) (int, string, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var eb ErrorBody
	json.Unmarshal(data, &eb)
	return resp.StatusCode, eb.Error.Code, data
}

// ---------------------------------------------------------------------------
// Files

func mustRead(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func randomBytes(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// readAt reads n bytes at off from path.
func readAt(t testing.TB, path string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatalf("read %d bytes at %d from %s: %v", n, off, path, err)
	}
	return b
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// regionSum is the sha256 of n bytes at off in path.
func regionSum(t testing.TB, path string, off int64, n int) string {
	t.Helper()
	return sum(readAt(t, path, off, n))
}

// fileSize is the apparent size of path.
func fileSize(t testing.TB, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// allocated is the bytes actually allocated to path (st_blocks × 512).
func allocated(t testing.TB, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Blocks * 512
}

// allocatedTree is the bytes allocated to every file under dir.
func allocatedTree(t testing.TB, dir string) int64 {
	t.Helper()
	var total int64
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			total += allocated(t, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// region is a byte range of a volume with the data written there
// (WriteRegions writes regions through NBD; checkRegions checks them in a
// local copy of a volume, VolumeCopy).
type region struct {
	off  int64
	data []byte
}

// checkRegions verifies that the file path (a local copy of a volume, see
// VolumeCopy) holds each region's data.
func checkRegions(t testing.TB, what, path string, rs []region) {
	t.Helper()
	for _, r := range rs {
		if got, want := regionSum(t, path, r.off, len(r.data)), sum(r.data); got != want {
			t.Errorf("%s: %d bytes at offset %d differ from what was written (sha256 %s, want %s)", what, len(r.data), r.off, got[:12], want[:12])
		}
	}
}

// image is the expected content of a whole volume of size bytes: zeroes
// with each list of regions written over it in turn.
func image(size int64, layers ...[]region) []byte {
	b := make([]byte, size)
	for _, rs := range layers {
		for _, r := range rs {
			copy(b[r.off:], r.data)
		}
	}
	return b
}

// checkImage verifies that the file path (a local copy of a volume)
// holds exactly want, and reports the first differing MiB if not.
func checkImage(t testing.TB, what, path string, want []byte) {
	t.Helper()
	got := mustRead(t, path)
	if len(got) != len(want) {
		t.Errorf("%s: %d bytes, want %d", what, len(got), len(want))
		return
	}
	if bytes.Equal(got, want) {
		return
	}
	for off := 0; off < len(want); off += int(MiB) {
		end := min(off+int(MiB), len(want))
		if !bytes.Equal(got[off:end], want[off:end]) {
			t.Errorf("%s differs from what was written, first in the MiB at offset %d", what, off)
			return
		}
	}
}

const (
	KiB = int64(1) << 10
	MiB = int64(1) << 20
	GiB = int64(1) << 30
)

// sz renders bytes for the CLI's --size.
func sz(n int64) string { return strconv.FormatInt(n, 10) }
