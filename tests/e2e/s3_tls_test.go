package e2e

// The S3 gateway over HTTPS: a certificate from the cluster CA that
// identities already hold (s3.env sets AWS_CA_BUNDLE to their ca.pem), so
// the aws cli, boto3 and aws-sdk-go-v2 verify the gateway and refuse it
// without that CA; HTTPS by default beyond loopback, plain HTTP there only
// with --s3-insecure; a site's own certificate with --s3-cert/--s3-key.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// s3Env reads an identity's s3.env as a map and as KEY=VALUE lines.
func s3Env(t *testing.T, dir string) (map[string]string, []string) {
	t.Helper()
	m := map[string]string{}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(mustRead(t, filepath.Join(dir, "s3.env"))))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if k, v, ok := strings.Cut(line, "="); ok && strings.HasPrefix(k, "AWS_") {
			m[k] = v
			lines = append(lines, line)
		}
	}
	return m, lines
}

// without returns env without the variable name.
func without(env []string, name string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(e string) bool { return strings.HasPrefix(e, name+"=") })
}

// awsTLS runs the aws cli with exactly env (an s3.env and extras): the
// endpoint and the CA bundle come from there, as for a user.
func awsTLS(t *testing.T, env []string, args ...string) ToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := filepath.Join(t.TempDir(), "aws-config")
	if err := os.WriteFile(cfg, []byte("[default]\ns3 =\n  addressing_style = path\n  signature_version = s3v4\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "aws", args...)
	var clean []string
	for _, e := range baseEnv() {
		// Nothing from the test's own environment may supply trust.
		if !strings.HasPrefix(e, "AWS_") && !strings.HasPrefix(e, "SSL_CERT_") && !strings.HasPrefix(e, "REQUESTS_CA_BUNDLE=") {
			clean = append(clean, e)
		}
	}
	cmd.Env = append(append(clean, env...), "AWS_CONFIG_FILE="+cfg, "AWS_SHARED_CREDENTIALS_FILE=/nonexistent",
		"AWS_EC2_METADATA_DISABLED=true", "AWS_PAGER=")
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	start := time.Now()
	err := cmd.Run()
	r := ToolResult{Cmd: shellQuote("aws", args...), Stdout: so.String(), Stderr: se.String(), Took: time.Since(start)}
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("run %s: %v", r.Cmd, err)
		}
		r.Code = ee.ExitCode()
	}
	return r
}

// sdkClient is an aws-sdk-go-v2 client for the keys in env, trusting only
// the CAs in caPEM (none: the system's roots).
func sdkClient(t *testing.T, endpoint string, env map[string]string, caPEM []byte) *s3.Client {
	t.Helper()
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if caPEM != nil {
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(caPEM) {
			t.Fatal("no certificate in the CA PEM")
		}
	}
	return s3.New(s3.Options{
		Region:           env["AWS_REGION"],
		BaseEndpoint:     aws.String(endpoint),
		UsePathStyle:     true,
		Credentials:      credentials.NewStaticCredentialsProvider(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"], ""),
		RetryMaxAttempts: 1,
		HTTPClient:       &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}},
	})
}

// healthz answers GET /healthz's status through c ("" status and the
// error if the request failed).
func healthz(c *http.Client, url string) (int, error) {
	resp, err := c.Get(url + "/healthz")
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// plainHTTPRefused requires plain HTTP to a TLS port to get no S3 answer.
func plainHTTPRefused(t *testing.T, hostport string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	if status, err := healthz(c, "http://"+hostport); err == nil {
		t.Errorf("plain HTTP to the TLS port %s answered %d", hostport, status)
	} else {
		t.Logf("plain HTTP to %s: %v", hostport, err)
	}
}

// certificateRefused: a client error that is a certificate verification
// failure (and not, say, a refused connection).
func certificateRefused(s string) bool {
	s = strings.ToLower(s)
	return strings.Contains(s, "certificate") || strings.Contains(s, "ssl validation failed") || strings.Contains(s, "x509")
}

func TestS3TLS(t *testing.T) {
	requireTools(t, "aws")
	n := StartNode(t, NodeOptions{Args: []string{"--s3-tls"}})
	ep := "https://" + addr(n.S3)
	caPEM := mustRead(t, filepath.Join(n.AdminDir(), "ca.pem"))

	// s3.env of a new user, and of the admin: the https URL and the
	// identity's own ca.pem as the CA bundle (an absolute path).
	alice := n.Admin().CreateUser("alice")
	aliceDir, err := filepath.Abs(alice.Identity)
	if err != nil {
		t.Fatal(err)
	}
	env, lines := s3Env(t, alice.Identity)
	if env["AWS_ENDPOINT_URL"] != ep || env["AWS_CA_BUNDLE"] != filepath.Join(aliceDir, "ca.pem") {
		t.Fatalf("alice's s3.env: %v (want endpoint %s and AWS_CA_BUNDLE %s)", lines, ep, filepath.Join(aliceDir, "ca.pem"))
	}
	if adm, _ := s3Env(t, n.AdminDir()); adm["AWS_ENDPOINT_URL"] != ep || adm["AWS_CA_BUNDLE"] != filepath.Join(n.AdminDir(), "ca.pem") {
		t.Fatalf("admin's s3.env: %v", adm)
	}

	// The gateway's certificate: issued by the cluster CA, for the
	// server only, naming the loopback address and the host name.
	blk, _ := pem.Decode(mustRead(t, filepath.Join(n.Data, "pki", "s3.pem")))
	if blk == nil {
		t.Fatal("DATA/pki/s3.pem holds no certificate")
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	host, _ := os.Hostname()
	for _, name := range []string{"127.0.0.1", "localhost", host} {
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: name, Roots: pool}); err != nil {
			t.Errorf("s3 certificate for %s: %v", name, err)
		}
	}
	if !slices.Equal(cert.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
		t.Errorf("s3 certificate key usages %v, want server auth only", cert.ExtKeyUsage)
	}
	if m := fileMode(t, filepath.Join(n.Data, "pki", "s3-key.pem")); m != 0o600 {
		t.Errorf("s3-key.pem mode %v, want 0600", m)
	}

	src := filepath.Join(t.TempDir(), "src")
	data := randomBytes(t, 3<<20+17)
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("awsCLI", func(t *testing.T) {
		// s3.env alone: endpoint, keys, region, CA bundle.
		for _, args := range [][]string{
			{"s3", "mb", "s3://tls-cli"},
			{"s3", "cp", src, "s3://tls-cli/dir/obj"},
		} {
			if r := awsTLS(t, lines, args...); r.Code != 0 {
				t.Fatalf("%s", r)
			}
		}
		if r := awsTLS(t, lines, "s3", "ls", "s3://tls-cli/dir/"); r.Code != 0 || !strings.Contains(r.Stdout, "obj") {
			t.Fatalf("%s", r)
		}
		back := filepath.Join(t.TempDir(), "back")
		if r := awsTLS(t, lines, "s3", "cp", "s3://tls-cli/dir/obj", back); r.Code != 0 {
			t.Fatalf("%s", r)
		}
		if !bytes.Equal(mustRead(t, back), data) {
			t.Fatal("downloaded object differs")
		}
		// --ca-bundle instead of the variable.
		noBundle := without(lines, "AWS_CA_BUNDLE")
		if r := awsTLS(t, noBundle, "--ca-bundle", filepath.Join(aliceDir, "ca.pem"), "s3", "ls"); r.Code != 0 || !strings.Contains(r.Stdout, "tls-cli") {
			t.Fatalf("%s", r)
		}
		// Without the cluster CA the cli refuses the gateway.
		r := awsTLS(t, noBundle, "s3", "ls")
		if r.Code == 0 || !certificateRefused(r.Stderr) {
			t.Fatalf("without the CA bundle: want a certificate error, got %s", r)
		}
		t.Logf("without the CA bundle: %s", strings.TrimSpace(r.Stderr))
	})

	t.Run("GoSDK", func(t *testing.T) {
		c := sdkClient(t, ep, env, caPEM)
		bucket, key := "tls-sdk", "k/v"
		if _, err := c.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: &bucket}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.PutObject(context.Background(), &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: bytes.NewReader(data)}); err != nil {
			t.Fatal(err)
		}
		out, err := c.GetObject(context.Background(), &s3.GetObjectInput{Bucket: &bucket, Key: &key})
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(out.Body)
		out.Body.Close()
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("GET over TLS: %d bytes, %v", len(got), err)
		}
		if !bytes.Equal(mustRead(t, filepath.Join(n.StoreDir(), "buckets", bucket, "k", "v")), data) {
			t.Fatal("the object's file differs")
		}
		// The system's roots do not know the cluster CA.
		_, err = sdkClient(t, ep, env, nil).ListBuckets(context.Background(), &s3.ListBucketsInput{})
		if err == nil || !certificateRefused(err.Error()) {
			t.Fatalf("without the cluster CA: want a certificate error, got %v", err)
		}
		// Plain HTTP to the TLS port: no answer.
		_, err = sdkClient(t, "http://"+addr(n.S3), env, nil).ListBuckets(context.Background(), &s3.ListBucketsInput{})
		if err == nil {
			t.Fatal("plain HTTP to the TLS port was answered")
		}
	})

	t.Run("boto3", func(t *testing.T) {
		if err := exec.Command("python3", "-c", "import boto3").Run(); err != nil {
			t.Fatalf("boto3 is not installed (run make deps): %v", err)
		}
		script := `
import os, sys, boto3, botocore.config, botocore.exceptions
cfg = botocore.config.Config(s3={"addressing_style": "path"}, signature_version="s3v4")
ca = os.environ.pop("AWS_CA_BUNDLE")
s3 = boto3.client("s3", config=cfg, verify=ca)
s3.create_bucket(Bucket="tls-boto")
s3.put_object(Bucket="tls-boto", Key="x", Body=b"over tls")
assert s3.get_object(Bucket="tls-boto", Key="x")["Body"].read() == b"over tls"
try:
    boto3.client("s3", config=cfg).list_buckets()
    sys.exit("the gateway was trusted without the cluster CA")
except botocore.exceptions.SSLError as e:
    print("refused without the CA:", e)
`
		cmd := exec.Command("python3", "-c", script)
		cmd.Env = append(baseEnv(), lines...)
		cmd.Env = append(cmd.Env, "AWS_CONFIG_FILE=/nonexistent", "AWS_SHARED_CREDENTIALS_FILE=/nonexistent", "AWS_EC2_METADATA_DISABLED=true")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("boto3: %v\n%s", err, out)
		}
		t.Logf("boto3: %s", strings.TrimSpace(string(out)))
	})

	t.Run("healthz", func(t *testing.T) {
		if status, err := healthz(tlsClient(t, caPEM), ep); err != nil || status != 200 {
			t.Fatalf("GET %s/healthz: %d %v", ep, status, err)
		}
		plainHTTPRefused(t, addr(n.S3))
	})
}

func fileMode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

// TestS3TLSModes: beyond loopback HTTPS is the default; --s3-insecure
// serves plain HTTP there; contradicting flags stop the start; a site's
// own certificate replaces the cluster CA's (and s3.env then names no CA
// bundle). One node, restarted with each setting: the admin identity's
// s3.env follows.
func TestS3TLSModes(t *testing.T) {
	requireTools(t, "aws")
	n := NewNode(t, NodeOptions{})
	allIfaces := net.JoinHostPort("0.0.0.0", strconv.Itoa(n.S3))
	n.opts.Args = []string{"--s3", allIfaces}
	n.Start()
	caPEM := mustRead(t, filepath.Join(n.AdminDir(), "ca.pem"))
	host, _ := os.Hostname()
	loop := addr(n.S3)

	// All interfaces, no flag: HTTPS with the cluster CA's certificate;
	// s3.env names the host name.
	adm, _ := s3Env(t, n.AdminDir())
	if want := "https://" + net.JoinHostPort(host, strconv.Itoa(n.S3)); adm["AWS_ENDPOINT_URL"] != want || adm["AWS_CA_BUNDLE"] == "" {
		t.Fatalf("admin s3.env beyond loopback: %v (want %s and a CA bundle)", adm, want)
	}
	if status, err := healthz(tlsClient(t, caPEM), "https://"+loop); err != nil || status != 200 {
		t.Fatalf("https healthz: %d %v", status, err)
	}
	plainHTTPRefused(t, loop)
	// Every address of the machine is in the certificate.
	if ifAddrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range ifAddrs {
			in, ok := a.(*net.IPNet)
			if !ok || in.IP.IsLoopback() || in.IP.IsLinkLocalUnicast() || in.IP.To4() == nil {
				continue
			}
			hp := net.JoinHostPort(in.IP.String(), strconv.Itoa(n.S3))
			if status, err := healthz(tlsClient(t, caPEM), "https://"+hp); err != nil || status != 200 {
				t.Errorf("https healthz on %s: %d %v", hp, status, err)
			} else {
				t.Logf("https on %s verified with the cluster CA", hp)
			}
		}
	}

	// --s3-insecure: plain HTTP beyond loopback; s3.env follows.
	n.StopOK()
	n.opts.Args = []string{"--s3", allIfaces, "--s3-insecure"}
	n.Restart()
	adm, _ = s3Env(t, n.AdminDir())
	if want := "http://" + net.JoinHostPort(host, strconv.Itoa(n.S3)); adm["AWS_ENDPOINT_URL"] != want || adm["AWS_CA_BUNDLE"] != "" {
		t.Fatalf("admin s3.env with --s3-insecure: %v (want %s, no CA bundle)", adm, want)
	}
	if status, err := healthz(&http.Client{Timeout: 10 * time.Second}, "http://"+loop); err != nil || status != 200 {
		t.Fatalf("plain http healthz with --s3-insecure: %d %v", status, err)
	}

	// Contradicting flags: the node does not start, and says why.
	n.StopOK()
	for _, args := range [][]string{{"--s3-insecure", "--s3-tls"}, {"--s3-cert", "/nonexistent.pem"}} {
		n.opts.Args = append([]string{"--s3", allIfaces}, args...)
		mark := len(n.Log())
		if err := n.launch(); err == nil {
			t.Fatalf("started with %v", args)
		}
		msg := n.Log()[mark:]
		if i := strings.Index(msg, "error: "); i < 0 || !strings.Contains(msg[i:], "--s3-") || !strings.Contains(msg[i:], "(UsageError)") {
			t.Errorf("start with %v failed without naming the flags: %s", args, tail(msg, 2000))
		} else {
			t.Logf("start with %v: %s", args, strings.SplitN(msg[i:], "\n", 2)[0])
		}
	}

	// A site's own certificate (here from a CA made by the test).
	dir := t.TempDir()
	siteCA, certFile, keyFile := siteCertificate(t, dir, "127.0.0.1", "localhost", host)
	n.opts.Args = []string{"--s3", allIfaces, "--s3-cert", certFile, "--s3-key", keyFile}
	n.Restart()
	if status, err := healthz(tlsClient(t, siteCA), "https://"+loop); err != nil || status != 200 {
		t.Fatalf("healthz with the site CA: %d %v", status, err)
	}
	if _, err := healthz(tlsClient(t, caPEM), "https://"+loop); err == nil || !certificateRefused(err.Error()) {
		t.Fatalf("the cluster CA verified a site certificate: %v", err)
	}
	adm, lines := s3Env(t, n.AdminDir())
	if adm["AWS_CA_BUNDLE"] != "" || !strings.HasPrefix(adm["AWS_ENDPOINT_URL"], "https://") {
		t.Fatalf("admin s3.env with a site certificate: %v (want https, no CA bundle)", adm)
	}
	// A client that trusts the site's CA (as it would a public one).
	env := append(without(lines, "AWS_ENDPOINT_URL"), "AWS_ENDPOINT_URL=https://"+loop,
		"AWS_CA_BUNDLE="+filepath.Join(dir, "site-ca.pem"))
	if r := awsTLS(t, env, "s3", "mb", "s3://site"); r.Code != 0 {
		t.Fatalf("%s", r)
	}
	if r := awsTLS(t, env, "s3", "ls"); r.Code != 0 || !strings.Contains(r.Stdout, "site") {
		t.Fatalf("%s", r)
	}
}

// siteCertificate makes a CA (written to DIR/site-ca.pem) and a server
// certificate for names (DIR/site.pem, DIR/site-key.pem).
func siteCertificate(t *testing.T, dir string, names ...string) (caPEM []byte, certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "site CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if n != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	certFile, keyFile = filepath.Join(dir, "site.pem"), filepath.Join(dir, "site-key.pem")
	for _, f := range []struct {
		path string
		data []byte
	}{
		{filepath.Join(dir, "site-ca.pem"), caPEM},
		{certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})},
		{keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})},
	} {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return caPEM, certFile, keyFile
}
