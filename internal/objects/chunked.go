package objects

import (
	"errors"
	"io"
	"strings"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/versity/versitygw/s3api/utils"
)

// A request body sent with Transfer-Encoding: chunked (boto3 sends every
// PUT over HTTPS that way: aws-chunked content with a checksum trailer,
// inside HTTP chunks) must be read to its end before the connection
// takes its next request. fasthttp streams request bodies and reads on
// from wherever the handler stopped, so anything left — the whole body
// of a request refused before its body was read, or just the final
// zero-length HTTP chunk after s3api has read the aws-chunked trailer —
// would be parsed as the start of the next request: that request fails
// with 400 "An error occurred when parsing the HTTP request", or, worse,
// body bytes crafted as a request are served as one. s3api's own drain
// (middlewares.DrainRequestBody) covers Content-Length bodies only,
// because fasthttp's chunked reader is not idempotent at its end: one
// Read past the terminating chunk parses the next request's first line
// as a chunk size. So chunkedBody watches every read s3api makes and
// drains only a body it has not seen end.

// Bounds of a drain: a rejected upload larger than drainLimit is not
// streamed through the gateway just to be thrown away (its connection is
// closed instead), and a client that stops sending is cut loose.
const (
	drainLimit       = 256 << 10
	drainIdleTimeout = time.Second
	drainTimeout     = 5 * time.Second
)

// chunkedBody is the body reader s3api's handlers read a chunked request
// through (installed as its ContextKeyBodyReader, which s3api's auth and
// checksum readers wrap). It notes whether the body's end was read.
type chunkedBody struct {
	r   io.Reader // fasthttp's body stream
	eof bool
}

func (b *chunkedBody) Read(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	n, err := b.r.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

// watchChunkedBody installs a chunkedBody for c's body if it is chunked
// and returns it; nil for any other request.
func watchChunkedBody(c fiber.Ctx) *chunkedBody {
	req := c.Request()
	stream := req.BodyStream()
	if stream == nil || req.Header.ContentLength() != -1 {
		return nil
	}
	b := &chunkedBody{r: stream}
	utils.ContextKeyBodyReader.Set(c, b)
	return b
}

// finish runs once the handlers are done with c: it reads what they left
// of the body, or, when that cannot be done safely within the bounds,
// has fasthttp close the connection after the answer.
func (b *chunkedBody) finish(c fiber.Ctx) {
	if b.eof || c.Request().BodyStream() != b.r {
		// Read to its end through b, or by fasthttp itself (Body()
		// reads the whole stream and drops it).
		return
	}
	if string(c.Method()) == fiber.MethodPost && strings.HasPrefix(string(c.Request().Header.ContentType()), "multipart/form-data") {
		// A browser-form upload: s3api reads that body from the stream
		// directly, not through b, so b cannot know where it stands.
		c.Response().Header.SetConnectionClose()
		return
	}
	if err := b.drain(c); err != nil {
		c.Response().Header.SetConnectionClose()
	}
}

// drain reads b to its end: at most drainLimit bytes, within
// drainTimeout, none of its reads waiting longer than drainIdleTimeout.
func (b *chunkedBody) drain(c fiber.Ctx) error {
	conn := c.RequestCtx().Conn()
	deadline := time.Now().Add(drainTimeout)
	defer conn.SetReadDeadline(time.Time{})
	buf := bufPool.Get().(*[]byte)
	defer bufPool.Put(buf)
	for total := 0; total <= drainLimit; {
		next := time.Now().Add(drainIdleTimeout)
		if next.After(deadline) {
			next = deadline
		}
		if err := conn.SetReadDeadline(next); err != nil {
			return err
		}
		n, err := b.Read((*buf)[:min(len(*buf), drainLimit+1-total)])
		total += n
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return errors.New("request body beyond the drain limit")
}
