package objects

// Chunked request bodies and keep-alive: whatever the handlers leave of
// a body sent with Transfer-Encoding: chunked must not be taken for the
// next request on the connection. Raw HTTP over one TCP connection,
// signed with aws-sdk-go-v2's SigV4 signer, as boto3 sends a PUT over
// HTTPS: aws-chunked content with a CRC32 trailer inside HTTP chunks.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// rawConn is one client connection speaking HTTP/1.1 by hand.
type rawConn struct {
	t    *testing.T
	addr string
	c    net.Conn
	br   *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawConn{t: t, addr: addr, c: c, br: bufio.NewReader(c)}
}

// head writes a request's first line and headers, signed as alice when
// sign is set (payloadHash as x-amz-content-sha256).
func (r *rawConn) head(method, path string, h http.Header, sign bool, payloadHash string) {
	r.t.Helper()
	req, err := http.NewRequest(method, "http://"+r.addr+path, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	if sign {
		req.Header.Set("X-Amz-Content-Sha256", payloadHash)
		creds := aws.Credentials{AccessKeyID: "AKALICE", SecretAccessKey: "alice-secret"}
		if err := v4.NewSigner().SignHTTP(context.Background(), creds, req, payloadHash, "s3", "us-east-1", time.Now()); err != nil {
			r.t.Fatal(err)
		}
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, path, r.addr)
	req.Header.Write(&b)
	b.WriteString("\r\n")
	r.write(b.String())
}

func (r *rawConn) write(s string) {
	r.t.Helper()
	if _, err := io.WriteString(r.c, s); err != nil {
		r.t.Fatal(err)
	}
}

// answer reads the next response: status, body, whether the server
// closes the connection after it.
func (r *rawConn) answer() (int, string, bool) {
	r.t.Helper()
	resp, err := http.ReadResponse(r.br, nil)
	if err != nil {
		r.t.Fatalf("reading an answer: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatalf("reading an answer's body: %v", err)
	}
	return resp.StatusCode, string(body), resp.Close
}

// httpChunk frames s as one HTTP chunk.
func httpChunk(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }

// getKey asks for bkt/key, signed, and wants data back on the same
// connection.
func (r *rawConn) getKey(key, data string) {
	r.t.Helper()
	r.head("GET", "/bkt/"+key, http.Header{}, true, "UNSIGNED-PAYLOAD")
	if status, body, _ := r.answer(); status != 200 || body != data {
		r.t.Fatalf("GET after the chunked PUT on the same connection: %d %.200q", status, body)
	}
}

func TestChunkedBodyKeepAlive(t *testing.T) {
	e := newMiddlewareEnv(t)
	addr := strings.TrimPrefix(*e.alice.Options().BaseEndpoint, "http://")
	if _, err := e.alice.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String("bkt")}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.alice.PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String("bkt"), Key: aws.String("old"), Body: strings.NewReader("old")}); err != nil {
		t.Fatal(err)
	}

	t.Run("TrailerThenLateTerminator", func(t *testing.T) {
		// The aws-chunked content ends (with its trailer) in one HTTP
		// chunk; the HTTP terminator follows a moment later, so s3api
		// has read all it wants before it arrives (and the answer
		// waits for it).
		for i := range 20 {
			r := dialRaw(t, addr)
			data := strings.Repeat(fmt.Sprint(i), 1000+i)
			crc := binary.BigEndian.AppendUint32(nil, crc32.ChecksumIEEE([]byte(data)))
			awsChunked := fmt.Sprintf("%x\r\n%s\r\n0\r\nx-amz-checksum-crc32:%s\r\n\r\n", len(data), data, base64.StdEncoding.EncodeToString(crc))
			key := fmt.Sprintf("k%d", i)
			r.head("PUT", "/bkt/"+key, http.Header{
				"Content-Encoding":             {"aws-chunked"},
				"X-Amz-Decoded-Content-Length": {fmt.Sprint(len(data))},
				"X-Amz-Trailer":                {"x-amz-checksum-crc32"},
				"Transfer-Encoding":            {"chunked"},
			}, true, "STREAMING-UNSIGNED-PAYLOAD-TRAILER")
			r.write(httpChunk(awsChunked))
			time.Sleep(time.Duration(i%3) * 10 * time.Millisecond)
			r.write("0\r\n\r\n")
			if status, body, _ := r.answer(); status != 200 {
				t.Fatalf("PUT: %d %s", status, body)
			}
			r.getKey(key, data)
		}
	})

	t.Run("RefusedBeforeItsBodyWasRead", func(t *testing.T) {
		// No signature: refused before s3api reads a byte of the body.
		for _, n := range []int{10, 100 << 10} {
			r := dialRaw(t, addr)
			r.head("PUT", "/bkt/refused", http.Header{"Transfer-Encoding": {"chunked"}}, false, "")
			r.write(httpChunk(strings.Repeat("GET /bkt/old HTTP/1.1\r\n\r\n", n/25+1)) + "0\r\n\r\n")
			if status, body, closed := r.answer(); status != 403 || closed {
				t.Fatalf("unsigned chunked PUT of %d bytes: %d (close %v) %.200s", n, status, closed, body)
			}
			r.getKey("old", "old")
		}
		if _, err := e.alice.HeadObject(context.Background(), &s3.HeadObjectInput{Bucket: aws.String("bkt"), Key: aws.String("refused")}); err == nil {
			t.Fatal("the refused PUT wrote an object")
		}
	})

	t.Run("RefusedTooLargeToDrain", func(t *testing.T) {
		r := dialRaw(t, addr)
		r.head("PUT", "/bkt/refused", http.Header{"Transfer-Encoding": {"chunked"}}, false, "")
		go io.WriteString(r.c, httpChunk(strings.Repeat("x", 2*drainLimit))+"0\r\n\r\n") // may meet the close
		if status, body, closed := r.answer(); status != 403 || !closed {
			t.Fatalf("unsigned chunked PUT beyond the drain limit: %d (close %v) %.200s; want 403 and the connection closed", status, closed, body)
		}
	})
}
