package objects

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"strings"
	"syscall"

	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/basalt-storage/basalt/internal/md5lanes"
	"github.com/versity/versitygw/s3api/utils"
	"github.com/versity/versitygw/s3err"
	"github.com/versity/versitygw/s3response"
)

// checksumFields are the x-amz-checksum-* values of a request or
// response, in the order of S3's API types.
type checksumFields struct {
	CRC32, CRC32C, SHA1, SHA256, CRC64NVME, SHA512, MD5, XXHASH64, XXHASH3, XXHASH128 *string
}

// given returns the checksum values given, algorithm and value.
func (c checksumFields) given() []checksum {
	var out []checksum
	for _, f := range []struct {
		v    *string
		algo types.ChecksumAlgorithm
	}{
		{c.CRC32, types.ChecksumAlgorithmCrc32}, {c.CRC32C, types.ChecksumAlgorithmCrc32c},
		{c.SHA1, types.ChecksumAlgorithmSha1}, {c.SHA256, types.ChecksumAlgorithmSha256},
		{c.CRC64NVME, types.ChecksumAlgorithmCrc64nvme}, {c.SHA512, types.ChecksumAlgorithmSha512},
		{c.MD5, types.ChecksumAlgorithmMd5}, {c.XXHASH64, types.ChecksumAlgorithmXxhash64},
		{c.XXHASH3, types.ChecksumAlgorithmXxhash3}, {c.XXHASH128, types.ChecksumAlgorithmXxhash128},
	} {
		if f.v != nil && *f.v != "" {
			out = append(out, checksum{Algorithm: f.algo, Value: strings.Clone(*f.v)})
		}
	}
	return out
}

// pick returns the one checksum value given, if any (s3api refuses
// requests with several).
func (c checksumFields) pick() (types.ChecksumAlgorithm, string) {
	if g := c.given(); len(g) > 0 {
		return g[0].Algorithm, g[0].Value
	}
	return "", ""
}

// fields returns c as response fields (all nil for a nil c).
func (c *checksum) fields() checksumFields {
	var f checksumFields
	if c == nil {
		return f
	}
	v := c.Value
	switch c.Algorithm {
	case types.ChecksumAlgorithmCrc32:
		f.CRC32 = &v
	case types.ChecksumAlgorithmCrc32c:
		f.CRC32C = &v
	case types.ChecksumAlgorithmSha1:
		f.SHA1 = &v
	case types.ChecksumAlgorithmSha256:
		f.SHA256 = &v
	case types.ChecksumAlgorithmCrc64nvme:
		f.CRC64NVME = &v
	case types.ChecksumAlgorithmSha512:
		f.SHA512 = &v
	case types.ChecksumAlgorithmMd5:
		f.MD5 = &v
	case types.ChecksumAlgorithmXxhash64:
		f.XXHASH64 = &v
	case types.ChecksumAlgorithmXxhash3:
		f.XXHASH3 = &v
	case types.ChecksumAlgorithmXxhash128:
		f.XXHASH128 = &v
	}
	return f
}

// trailerReader is s3api's middlewares.ChecksumReader: a body whose
// checksum arrives in a trailer (verified by s3api at EOF).
type trailerReader interface {
	io.Reader
	Algorithm() string
	Checksum() string
}

// received is a request body written to a synced temp file.
type received struct {
	f    *os.File
	md5  string // hex
	size int64
	sum  *checksum
	st   *syscall.Stat_t
	// published: the temp name is gone (renamed into a bucket).
	published bool
}

// close closes the temp file and removes it unless it was published.
func (rc *received) close() {
	if rc.published {
		rc.f.Close()
		return
	}
	discard(rc.f)
}

// receive writes body to a temp file in Work/tmp, reading it to EOF:
// s3api reports signature, Content-MD5 and trailer failures as a read
// error at the end, so nothing is kept unless the read ends cleanly. The
// x-amz-checksum-* header value in want (if any) is verified here. The
// file is not synced yet (the caller attaches metadata first).
func (b *Backend) receive(body io.Reader, length *int64, algo types.ChecksumAlgorithm, want checksumFields) (*received, error) {
	if body == nil {
		body = strings.NewReader("")
	}
	hdrAlgo, hdrValue := want.pick()
	if hdrAlgo != "" {
		algo = hdrAlgo
	}
	tr, isTrailer := body.(trailerReader)
	isTrailer = isTrailer && tr.Algorithm() != ""
	var hr *utils.HashReader
	r := body
	if !isTrailer && algo != "" {
		var err error
		hr, err = utils.NewHashReader(body, hdrValue, utils.HashType(strings.ToLower(string(algo))))
		if err != nil {
			return nil, s3err.GetAPIError(s3err.ErrInvalidChecksumAlgorithm)
		}
		r = hr
	}
	f, err := b.createTemp()
	if err != nil {
		return nil, err
	}
	h := md5lanes.NewStream()
	n, err := copyHashed(newBodyFile(f, length), r, h)
	if err != nil {
		discard(f)
		return nil, err
	}
	// Content-Length 0 with a body: a chunked request without a length
	// (HTTP framing detects its truncation).
	if length != nil && *length > 0 && n != *length {
		discard(f)
		return nil, s3err.GetAPIError(s3err.ErrIncompleteBody)
	}
	rc := &received{f: f, md5: hex.EncodeToString(h.Sum(nil)), size: n}
	switch {
	case isTrailer:
		rc.sum = &checksum{Algorithm: types.ChecksumAlgorithm(strings.ToUpper(tr.Algorithm())), Value: tr.Checksum()}
	case hr != nil:
		rc.sum = &checksum{Algorithm: algo, Value: hr.Sum()}
	}
	if rc.sum != nil {
		rc.sum.Type = types.ChecksumTypeFullObject
	}
	fi, err := f.Stat()
	if err != nil {
		discard(f)
		return nil, err
	}
	rc.st = fi.Sys().(*syscall.Stat_t)
	return rc, nil
}

// copyHashed copies src to dst and adds it to h. MD5 is the largest CPU
// cost of a PUT and cannot be sped up within one stream, so the stream is
// hashed in the background, in vector lanes beside other uploads
// (md5lanes), while the next piece is received into a second buffer.
// What arrives is hashed as it arrives, but written only once its buffer
// is full or src ends: fewer, larger writes.
func copyHashed(dst io.Writer, src io.Reader, h *md5lanes.Stream) (int64, error) {
	bufs := [2]*[]byte{bufPool.Get().(*[]byte), bufPool.Get().(*[]byte)}
	var marks [2]md5lanes.Mark // what was added from each buffer
	defer func() {
		h.Wait(h.Mark())
		bufPool.Put(bufs[0])
		bufPool.Put(bufs[1])
	}()
	var n int64
	for i := 0; ; i ^= 1 {
		h.Wait(marks[i])
		buf := *bufs[i]
		filled := 0
		var err error
		for filled < len(buf) && err == nil {
			var k int
			k, err = src.Read(buf[filled:])
			if k > 0 {
				h.Add(buf[filled : filled+k])
				filled += k
			}
		}
		marks[i] = h.Mark()
		if filled > 0 {
			if _, werr := dst.Write(buf[:filled]); werr != nil {
				return n, werr
			}
			n += int64(filled)
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// finish attaches m (with the temp file's stat) to the received file and
// syncs it.
func (b *Backend) finish(rc *received, m *objectMeta) error {
	m.setStat(rc.st)
	if err := b.meta.attach(rc.f, m); err != nil {
		return err
	}
	if err := rc.f.Sync(); err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	traceFS("sync file", rc.f.Name())
	return nil
}

// PutObject stores an object: body to Work/tmp, metadata, fsync, rename
// into Root/<bucket>/<key>, fsync of the directory; then it answers.
func (b *Backend) PutObject(ctx context.Context, in s3response.PutObjectInput) (_ s3response.PutObjectOutput, err error) {
	defer func() { err = b.answer(err, "PutObject", in.Bucket, in.Key) }()
	bucket, key := str(in.Bucket), str(in.Key)
	if err := checkKey(key); err != nil {
		return s3response.PutObjectOutput{}, err
	}
	r, err := b.openBucket(bucket)
	if err != nil {
		return s3response.PutObjectOutput{}, err
	}
	defer r.Close()
	status, err := b.versioning(ctx, bucket)
	if err != nil {
		return s3response.PutObjectOutput{}, err
	}
	check := b.putPreconditions(r, bucket, key, in.IfMatch, in.IfNoneMatch)
	if check != nil {
		// Before the body, to fail fast; again under the key's lock.
		if err := check(); err != nil {
			return s3response.PutObjectOutput{}, err
		}
	}
	rc, err := b.receive(in.Body, in.ContentLength, in.ChecksumAlgorithm, checksumFields{
		in.ChecksumCRC32, in.ChecksumCRC32C, in.ChecksumSHA1, in.ChecksumSHA256, in.ChecksumCRC64NVME,
		in.ChecksumSHA512, in.ChecksumMD5, in.ChecksumXXHASH64, in.ChecksumXXHASH3, in.ChecksumXXHASH128})
	if err != nil {
		return s3response.PutObjectOutput{}, err
	}
	defer rc.close()
	m := &objectMeta{
		ETag:               `"` + rc.md5 + `"`,
		ContentType:        str(in.ContentType),
		ContentEncoding:    str(in.ContentEncoding),
		ContentDisposition: str(in.ContentDisposition),
		ContentLanguage:    str(in.ContentLanguage),
		CacheControl:       str(in.CacheControl),
		Expires:            str(in.Expires),
		UserMeta:           cloneMeta(in.Metadata),
		Checksum:           rc.sum,
		VersionID:          writeVersion(status),
	}
	// Ownership first: the sync in finish makes it durable too.
	if err := b.giveToWriter(ctx, rc.f); err != nil {
		return s3response.PutObjectOutput{}, err
	}
	if err := b.finish(rc, m); err != nil {
		return s3response.PutObjectOutput{}, err
	}
	if err := b.publishInBucket(r, bucket, key, rc.f, m, status, check); err != nil {
		return s3response.PutObjectOutput{}, err
	}
	rc.published = true
	size := m.Size
	out := s3response.PutObjectOutput{ETag: m.ETag, Size: &size}
	if status != "" {
		out.VersionID = showVersion(m.VersionID)
	}
	if m.Checksum != nil {
		f := m.Checksum.fields()
		out.ChecksumCRC32, out.ChecksumCRC32C, out.ChecksumSHA1, out.ChecksumSHA256 = f.CRC32, f.CRC32C, f.SHA1, f.SHA256
		out.ChecksumCRC64NVME, out.ChecksumSHA512, out.ChecksumMD5 = f.CRC64NVME, f.SHA512, f.MD5
		out.ChecksumXXHASH64, out.ChecksumXXHASH3, out.ChecksumXXHASH128 = f.XXHASH64, f.XXHASH3, f.XXHASH128
		out.ChecksumType = m.Checksum.Type
	}
	return out, nil
}

// putPreconditions returns the check of a write's If-Match /
// If-None-Match against the current object, nil if it has neither.
// publishWrite runs it under the key's lock, atomically with the write.
func (b *Backend) putPreconditions(r *os.Root, bucket, key string, ifMatch, ifNoneMatch *string) func() error {
	if ifMatch == nil && ifNoneMatch == nil {
		return nil
	}
	return func() error {
		o, why, err := b.inspect(r, bucket, key)
		if err != nil {
			if !isNoSuchKey(err) {
				return err
			}
			return putConditions("", false, ifMatch, ifNoneMatch)
		}
		o.f.Close()
		if why == "" {
			return putConditions(o.m.ETag, true, ifMatch, ifNoneMatch)
		}
		// Changed behind S3: an object is there all the same, so
		// If-None-Match: * fails (412), as S3's does for any object;
		// If-Match has no ETag to compare with and answers the object's
		// state, as GET does.
		if ifNoneMatch == nil {
			return errModified(bucket, key, why)
		}
		return existsModified(putConditions("", true, ifMatch, ifNoneMatch), bucket, key, why)
	}
}

// existsModified gives the 412 of an If-None-Match that failed on an
// object changed behind S3 (err, from putConditions) a message saying so;
// other errors (NotImplemented) are returned as they are.
func existsModified(err error, bucket, key, why string) error {
	var pf s3err.PreconditionFailedError
	if !errors.As(err, &pf) {
		return err
	}
	pf.Description = fmt.Sprintf("At least one of the pre-conditions you specified did not hold: "+
		"an object exists at %s/%s (If-None-Match: *), though it was modified outside S3 and is not served: %s.",
		bucket, key, why)
	return pf
}

// cloneMeta copies user metadata out of the request's buffers.
func cloneMeta(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range maps.All(m) {
		out[strings.Clone(k)] = strings.Clone(v)
	}
	return out
}
