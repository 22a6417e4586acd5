package objects

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/versity/versitygw/backend"
	"github.com/versity/versitygw/s3api/utils"
	"github.com/versity/versitygw/s3err"
	"github.com/versity/versitygw/s3response"
	"golang.org/x/sys/unix"
)

// copyFile copies n bytes of src (from offset 0) into the empty file
// dst: a reflink (FICLONE) where the file system shares extents,
// otherwise copy_file_range (os.File.ReadFrom), otherwise read/write.
func copyFile(dst, src *os.File, n int64) error {
	var cerr, serr error
	err := rawFd(dst, func(d int) {
		serr = rawFd(src, func(s int) { cerr = unix.IoctlFileClone(d, s) })
	})
	if err == nil && serr == nil && cerr == nil {
		return nil
	}
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if _, err := dst.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if err := dst.Truncate(0); err != nil {
		return err
	}
	written, err := io.CopyN(dst, src, n)
	if err != nil {
		return fmt.Errorf("copy: %w (%d of %d bytes)", err, written, n)
	}
	return nil
}

// checksumOf computes the full-object checksum in algo of the first n
// bytes of f.
func checksumOf(f *os.File, n int64, algo types.ChecksumAlgorithm) (*checksum, error) {
	hr, err := utils.NewHashReader(io.NewSectionReader(f, 0, n), "", utils.HashType(strings.ToLower(string(algo))))
	if err != nil {
		return nil, s3err.GetAPIError(s3err.ErrInvalidChecksumAlgorithm)
	}
	if _, err := io.Copy(io.Discard, hr); err != nil {
		return nil, err
	}
	return &checksum{Algorithm: algo, Type: types.ChecksumTypeFullObject, Value: hr.Sum()}, nil
}

// CopyObject copies an object within the store (same file system):
// source checked like a GET, data cloned or copied into Work/tmp, then
// published like a PUT. The copy keeps the source's ETag, and its
// checksum unless x-amz-checksum-algorithm asks for another.
func (b *Backend) CopyObject(ctx context.Context, in s3response.CopyObjectInput) (_ s3response.CopyObjectOutput, err error) {
	defer func() { err = b.answer(err, "CopyObject", in.Bucket, in.Key) }()
	dstBucket, dstKey := str(in.Bucket), str(in.Key)
	srcBucket, srcKey, srcVersion, err := backend.ParseCopySource(str(in.CopySource))
	if err != nil {
		return s3response.CopyObjectOutput{}, err
	}
	if err := readKey(srcKey); err != nil {
		return s3response.CopyObjectOutput{}, err
	}
	if err := checkKey(dstKey); err != nil {
		return s3response.CopyObjectOutput{}, err
	}
	// A copy onto its own source changes nothing unless it replaces the
	// metadata or asks for a checksum the object has not got (S3's way of
	// adding one to an object in place: checked once the source is open).
	algo := types.ChecksumAlgorithm(strings.ToUpper(string(in.ChecksumAlgorithm)))
	replace := in.MetadataDirective == types.MetadataDirectiveReplace
	inPlace := srcBucket == dstBucket && srcKey == dstKey && !replace && srcVersion == ""
	if inPlace && algo == "" {
		return s3response.CopyObjectOutput{}, s3err.GetAPIError(s3err.ErrInvalidCopyDest)
	}
	sr, err := b.openBucket(srcBucket)
	if err != nil {
		return s3response.CopyObjectOutput{}, err
	}
	defer sr.Close()
	dr := sr
	if dstBucket != srcBucket {
		if dr, err = b.openBucket(dstBucket); err != nil {
			return s3response.CopyObjectOutput{}, err
		}
		defer dr.Close()
	}
	status, err := b.versioning(ctx, dstBucket)
	if err != nil {
		return s3response.CopyObjectOutput{}, err
	}
	src, err := b.openVersion(sr, srcBucket, srcKey, srcVersion)
	if srcVersion != "" && s3code(err) == "MethodNotAllowed" {
		// GET answers 405 for a delete marker's version id; a copy's
		// source names no method to allow.
		return s3response.CopyObjectOutput{}, s3err.APIError{Code: "InvalidRequest",
			Description: fmt.Sprintf("The source of a copy request may not refer to a delete marker by version id (%s/%s?versionId=%s).",
				srcBucket, srcKey, srcVersion),
			HTTPStatusCode: http.StatusBadRequest}
	}
	if err != nil {
		return s3response.CopyObjectOutput{}, err
	}
	defer src.f.Close()
	has := func(algo types.ChecksumAlgorithm) bool {
		sum := src.m.Checksum
		return sum != nil && sum.Algorithm == algo && sum.Type == types.ChecksumTypeFullObject
	}
	if inPlace && has(algo) {
		return s3response.CopyObjectOutput{}, s3err.GetAPIError(s3err.ErrInvalidCopyDest)
	}
	if err := preconditions(src.m.ETag, src.m.mtime().Truncate(time.Second), backend.PreConditions{
		IfMatch: in.CopySourceIfMatch, IfNoneMatch: in.CopySourceIfNoneMatch,
		IfModSince: in.CopySourceIfModifiedSince, IfUnmodeSince: in.CopySourceIfUnmodifiedSince,
	}); err != nil {
		// A copy is no GET: S3 answers a failed x-amz-copy-source-if-none-match
		// or -if-modified-since with 412 PreconditionFailed, not with GET's
		// 304 Not Modified.
		if s3code(err) == "NotModified" {
			cond := s3err.Condition("x-amz-copy-source-if-modified-since")
			if in.CopySourceIfNoneMatch != nil {
				cond = "x-amz-copy-source-if-none-match"
			}
			err = s3err.GetPreconditionFailedErr(cond)
		}
		return s3response.CopyObjectOutput{}, err
	}
	tmp, err := b.createTemp()
	if err != nil {
		return s3response.CopyObjectOutput{}, err
	}
	rc := &received{f: tmp}
	defer rc.close()
	if err := copyFile(tmp, src.f, src.m.Size); err != nil {
		return s3response.CopyObjectOutput{}, fmt.Errorf("copy %s/%s: %w", srcBucket, srcKey, err)
	}
	// x-amz-checksum-algorithm asks for the copy's checksum in that
	// algorithm (AWS CopyObject): computed from the copied bytes unless
	// the source already has it as a full-object checksum, which is
	// copied like any other.
	sum := src.m.Checksum
	if algo != "" && !has(algo) {
		if sum, err = checksumOf(tmp, src.m.Size, algo); err != nil {
			return s3response.CopyObjectOutput{}, fmt.Errorf("checksum of the copy of %s/%s: %w", srcBucket, srcKey, err)
		}
	}
	// The source must not have changed while it was copied.
	if fi, err := src.f.Stat(); err != nil {
		return s3response.CopyObjectOutput{}, err
	} else if why := src.m.differs(fi.Sys().(*syscall.Stat_t)); why != "" {
		return s3response.CopyObjectOutput{}, errModified(srcBucket, srcKey, why)
	}
	fi, err := tmp.Stat()
	if err != nil {
		return s3response.CopyObjectOutput{}, err
	}
	rc.st = fi.Sys().(*syscall.Stat_t)
	m := *src.m
	m.Key = ""
	m.VersionID = writeVersion(status)
	m.Checksum = sum
	if replace {
		m.ContentType = str(in.ContentType)
		m.ContentEncoding = str(in.ContentEncoding)
		m.ContentDisposition = str(in.ContentDisposition)
		m.ContentLanguage = str(in.ContentLanguage)
		m.CacheControl = str(in.CacheControl)
		m.Expires = str(in.Expires)
		m.UserMeta = cloneMeta(in.Metadata)
	}
	// Ownership first: the sync in finish makes it durable too.
	if err := b.giveToWriter(ctx, tmp); err != nil {
		return s3response.CopyObjectOutput{}, err
	}
	if err := b.finish(rc, &m); err != nil {
		return s3response.CopyObjectOutput{}, err
	}
	if err := b.publishInBucket(dr, dstBucket, dstKey, tmp, &m, status, nil); err != nil {
		return s3response.CopyObjectOutput{}, err
	}
	rc.published = true
	mtime := m.mtime().UTC().Truncate(time.Second)
	res := &s3response.CopyObjectResult{ETag: ptr(m.ETag), LastModified: &mtime}
	if m.Checksum != nil {
		f := m.Checksum.fields()
		res.ChecksumCRC32, res.ChecksumCRC32C, res.ChecksumSHA1, res.ChecksumSHA256 = f.CRC32, f.CRC32C, f.SHA1, f.SHA256
		res.ChecksumCRC64NVME, res.ChecksumSHA512, res.ChecksumMD5 = f.CRC64NVME, f.SHA512, f.MD5
		res.ChecksumXXHASH64, res.ChecksumXXHASH3, res.ChecksumXXHASH128 = f.XXHASH64, f.XXHASH3, f.XXHASH128
		res.ChecksumType = m.Checksum.Type
	}
	out := s3response.CopyObjectOutput{CopyObjectResult: res}
	if srcVersion != "" {
		out.CopySourceVersionId = ptr(srcVersion)
	}
	if status != "" {
		out.VersionId = ptr(showVersion(m.VersionID))
	}
	return out, nil
}
