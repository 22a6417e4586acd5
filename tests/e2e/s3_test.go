package e2e

// S3 through real clients: the aws cli against basalt's gateway, objects
// checked as the plain files they are.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// S3User is a user's S3 credentials, from the s3.env of their identity.
type S3User struct {
	t        *testing.T
	Endpoint string
	Env      []string // AWS_ACCESS_KEY_ID=..., AWS_SECRET_ACCESS_KEY=...
}

// S3User returns the S3 credentials of client c's identity for node n.
func (n *Node) S3User(c *Client) *S3User {
	n.t.Helper()
	f, err := os.Open(filepath.Join(c.Identity, "s3.env"))
	if err != nil {
		n.t.Fatal(err)
	}
	defer f.Close()
	var env []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); strings.HasPrefix(line, "AWS_") {
			env = append(env, line)
		}
	}
	// s3.env is all a user needs: keys, the gateway's URL and the region.
	u := &S3User{t: n.t, Env: env}
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "AWS_ENDPOINT_URL="); ok {
			u.Endpoint = v
		}
	}
	if want := "http://" + addr(n.S3); u.Endpoint != want || len(env) < 5 {
		n.t.Fatalf("%s/s3.env: endpoint %q (want %q) in %v", c.Identity, u.Endpoint, want, env)
	}
	return u
}

// On is the same user talking to node n's gateway.
func (u *S3User) On(n *Node) *S3User {
	v := *u
	v.Endpoint = "http://" + addr(n.S3)
	return &v
}

// WithSecret is the same user with a wrong secret key.
func (u *S3User) WithSecret(secret string) *S3User {
	v := *u
	v.Env = nil
	for _, e := range u.Env {
		if strings.HasPrefix(e, "AWS_SECRET_ACCESS_KEY=") {
			e = "AWS_SECRET_ACCESS_KEY=" + secret
		}
		v.Env = append(v.Env, e)
	}
	return &v
}

// AWS runs the aws cli as this user against the gateway.
func (u *S3User) AWS(args ...string) ToolResult {
	u.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	full := append([]string{"--endpoint-url", u.Endpoint, "--region", "us-east-1"}, args...)
	cmd := exec.CommandContext(ctx, "aws", full...)
	cfg := filepath.Join(u.t.TempDir(), "aws-config")
	// Path-style addressing and SigV4 (aws cli v1 presigns with SigV2 otherwise).
	if err := os.WriteFile(cfg, []byte("[default]\ns3 =\n  addressing_style = path\n  signature_version = s3v4\n"), 0o600); err != nil {
		u.t.Fatal(err)
	}
	cmd.Env = append(append(baseEnv(), u.Env...), "AWS_CONFIG_FILE="+cfg,
		"AWS_SHARED_CREDENTIALS_FILE=/nonexistent", "AWS_EC2_METADATA_DISABLED=true", "AWS_PAGER=")
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	start := time.Now()
	err := cmd.Run()
	r := ToolResult{Cmd: shellQuote("aws", full...), Stdout: so.String(), Stderr: se.String(), Took: time.Since(start)}
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			u.t.Fatalf("run %s: %v", r.Cmd, err)
		}
		r.Code = ee.ExitCode()
	}
	return r
}

// AWSOK runs the aws cli and requires success.
func (u *S3User) AWSOK(args ...string) string {
	u.t.Helper()
	r := u.AWS(args...)
	if r.Code != 0 {
		u.t.Fatalf("%s", r)
	}
	return r.Stdout
}

// AWSFail runs the aws cli and requires it to fail naming code.
func (u *S3User) AWSFail(code string, args ...string) {
	u.t.Helper()
	r := u.AWS(args...)
	if r.Code == 0 || !strings.Contains(r.Stderr+r.Stdout, code) {
		u.t.Fatalf("want a failure naming %s: %s", code, r)
	}
}

func TestS3AwsCLI(t *testing.T) {
	requireTools(t, "aws")
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	alice := n.S3User(admin.CreateUser("alice"))
	bob := n.S3User(admin.CreateUser("bob"))
	dir := t.TempDir()

	alice.AWSOK("s3", "mb", "s3://alice-data")
	if ls := alice.AWSOK("s3", "ls"); !strings.Contains(ls, "alice-data") {
		t.Fatalf("alice's buckets: %q", ls)
	}
	if ls := bob.AWSOK("s3", "ls"); strings.Contains(ls, "alice-data") {
		t.Fatalf("bob sees alice's bucket: %q", ls)
	}

	// An object is a plain file holding exactly its bytes.
	data := randomBytes(t, 3<<20+123)
	src := filepath.Join(dir, "obj.bin")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	alice.AWSOK("s3", "cp", src, "s3://alice-data/dir/obj.bin")
	file := filepath.Join(n.StoreDir(), "buckets", "alice-data", "dir", "obj.bin")
	if got := mustRead(t, file); !bytes.Equal(got, data) {
		t.Fatalf("%s holds %d bytes, not the object's %d", file, len(got), len(data))
	}
	back := filepath.Join(dir, "back.bin")
	alice.AWSOK("s3", "cp", "s3://alice-data/dir/obj.bin", back)
	if !bytes.Equal(mustRead(t, back), data) {
		t.Fatal("object read back differs")
	}
	if ls := alice.AWSOK("s3", "ls", "s3://alice-data/dir/"); !strings.Contains(ls, "obj.bin") || !strings.Contains(ls, fmt.Sprint(len(data))) {
		t.Fatalf("listing: %q", ls)
	}
	// A ranged GET.
	part := filepath.Join(dir, "range.bin")
	alice.AWSOK("s3api", "get-object", "--bucket", "alice-data", "--key", "dir/obj.bin", "--range", "bytes=1000-1999", part)
	if !bytes.Equal(mustRead(t, part), data[1000:2000]) {
		t.Fatal("ranged GET returned other bytes")
	}

	// Another user's bucket, a wrong secret: refused, nothing written.
	bob.AWSFail("AccessDenied", "s3", "ls", "s3://alice-data")
	bob.AWSFail("AccessDenied", "s3", "cp", src, "s3://alice-data/bob.bin")
	alice.WithSecret("wrong-secret-0000000000000000000000000").AWSFail("SignatureDoesNotMatch", "s3", "ls", "s3://alice-data")
	if _, err := os.Stat(filepath.Join(n.StoreDir(), "buckets", "alice-data", "bob.bin")); !os.IsNotExist(err) {
		t.Fatalf("bob's refused upload left a file: %v", err)
	}

	// A file written directly into the bucket is no object until exported.
	if err := os.WriteFile(filepath.Join(n.StoreDir(), "buckets", "alice-data", "direct.txt"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	if ls := alice.AWSOK("s3", "ls", "s3://alice-data"); strings.Contains(ls, "direct.txt") {
		t.Fatalf("an unexported file is listed: %q", ls)
	}
	alice.AWSFail("404", "s3api", "head-object", "--bucket", "alice-data", "--key", "direct.txt")

	// Delete removes the file; a bucket with objects cannot be removed.
	alice.AWSFail("BucketNotEmpty", "s3", "rb", "s3://alice-data")
	alice.AWSOK("s3", "rm", "s3://alice-data/dir/obj.bin")
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Fatalf("deleted object's file: %v", err)
	}
	os.Remove(filepath.Join(n.StoreDir(), "buckets", "alice-data", "direct.txt"))
	alice.AWSOK("s3", "rb", "s3://alice-data")
}

// Two gateways over one etcd and one store: a PUT through one is a GET
// through the other at once, and deleting a user revokes their keys on both.
func TestS3TwoGateways(t *testing.T) {
	requireTools(t, "aws")
	t.Parallel()
	ep := startEtcd(t)
	store := filepath.Join(t.TempDir(), "shared-store")
	opts := func(name string) NodeOptions {
		return NodeOptions{Name: name, Data: filepath.Join(t.TempDir(), "data-"+name), Store: store,
			Args: []string{"--meta-endpoints", ep}}
	}
	n1 := StartNode(t, opts("node1"))
	n2 := StartNode(t, opts("node2"))
	admin := n1.Admin()
	alice := n1.S3User(admin.CreateUser("alice"))
	alice2 := alice.On(n2)

	dir := t.TempDir()
	for i := range 3 {
		data := randomBytes(t, 64<<10+i)
		src := filepath.Join(dir, fmt.Sprint("in", i))
		if err := os.WriteFile(src, data, 0o600); err != nil {
			t.Fatal(err)
		}
		put, get := alice, alice2
		if i%2 == 1 {
			put, get = alice2, alice
		}
		if i == 0 {
			put.AWSOK("s3", "mb", "s3://shared")
		}
		key := fmt.Sprintf("s3://shared/k%d", i)
		put.AWSOK("s3", "cp", src, key)
		out := filepath.Join(dir, fmt.Sprint("out", i))
		get.AWSOK("s3", "cp", key, out)
		if !bytes.Equal(mustRead(t, out), data) {
			t.Fatalf("object %d put through one gateway reads differently through the other", i)
		}
	}
	if ls := alice2.AWSOK("s3", "ls", "s3://shared"); strings.Count(ls, "k") != 3 {
		t.Fatalf("node2 lists %q", ls)
	}

	admin.OK(nil, "user", "delete", "alice")
	alice2.AWSFail("InvalidAccessKeyId", "s3", "ls", "s3://shared")
	alice.AWSFail("InvalidAccessKeyId", "s3", "ls", "s3://shared")

	// A new user with the old name does not inherit the old user's buckets
	// (as with volumes: ownership is by user ID).
	newAlice := n2.S3User(n2.As(n1.AdminDir()).CreateUser("alice"))
	newAlice.AWSFail("AccessDenied", "s3", "ls", "s3://shared")
	newAlice.On(n1).AWSFail("AccessDenied", "s3", "cp", filepath.Join(dir, "in0"), "s3://shared/again")
	if ls := newAlice.AWSOK("s3", "ls"); strings.Contains(ls, "shared") {
		t.Fatalf("the new alice lists the old alice's bucket: %q", ls)
	}
}
