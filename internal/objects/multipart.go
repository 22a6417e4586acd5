package objects

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/versity/versitygw/backend"
	"github.com/versity/versitygw/s3api/utils"
	"github.com/versity/versitygw/s3err"
	"github.com/versity/versitygw/s3response"
	"golang.org/x/sys/unix"
)

// Multipart uploads live in Work/uploads/<bucket>/<uploadId>/:
//
//	info.json        the upload (key, initiator, metadata, checksum)
//	<n>.json         part n's record (data file, ETag, size, checksum);
//	                 renaming it into place publishes the part
//	<n>.<random>     part n's bytes
//
// Complete concatenates the parts into a temp file in Work/tmp and
// publishes it like a PUT; then the upload is removed (removeUpload).

type uploadInfo struct {
	Bucket            string                  `json:"bucket"`
	Key               string                  `json:"key"`
	Initiated         time.Time               `json:"initiated"`
	Initiator         string                  `json:"initiator"` // access key id
	Owner             string                  `json:"owner"`     // user
	Meta              objectMeta              `json:"meta"`      // content type, user metadata
	ChecksumAlgorithm types.ChecksumAlgorithm `json:"checksum_algorithm,omitempty"`
	ChecksumType      types.ChecksumType      `json:"checksum_type,omitempty"`
}

type partRecord struct {
	Number   int32     `json:"number"`
	File     string    `json:"file"`
	ETag     string    `json:"etag"` // quoted
	Size     int64     `json:"size"`
	Checksum *checksum `json:"checksum,omitempty"`
	Modified time.Time `json:"modified"`
}

// newUploadID returns a UUID (s3api's lister expects upload ids to parse
// as UUIDs) of version 7 (RFC 9562): the first 60 bits are the creation
// time t (Unix milliseconds, then the fraction of the millisecond in 12
// bits), the rest random. So ids sort as the uploads were initiated, and
// ListMultipartUploads can list a key's uploads in that order and resume
// after an upload-id marker by comparing ids, whether or not the
// marker's upload still exists.
func newUploadID(t time.Time) string {
	var u [16]byte
	rand.Read(u[8:])
	frac := uint64(t.Nanosecond()%1e6) << 12 / 1e6
	binary.BigEndian.PutUint64(u[:8], uint64(t.UnixMilli())<<16|0x7000|frac)
	u[8] = u[8]&0x3f | 0x80
	h := hex.EncodeToString(u[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// validUploadID: 36 characters of lowercase hex and dashes in UUID form
// (an upload id becomes a directory name).
func validUploadID(id string) bool {
	if len(id) != 36 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
	}
	return true
}

func (b *Backend) uploadDir(bucket, id string) string { return filepath.Join(b.uploads, bucket, id) }

// removedSuffix ends the name an upload directory is renamed to when the
// upload is removed (removeUpload): not an upload id, so no request
// resolves it.
const removedSuffix = ".removed"

// errUploadGone: removeUpload found no upload directory (another Abort or
// Complete removed the upload first).
var errUploadGone = errors.New("upload gone")

// removeUpload removes the upload whose directory is dir. The directory
// is first renamed to dir+removedSuffix, which no request resolves: from
// that one atomic step on the upload is gone for every request. An
// UploadPart that renames its part or record in afterwards finds no
// directory and answers NoSuchUpload, and nothing creates the directory
// again (UploadPart writes records with writeFileIn, which makes no
// directory), so the upload is never half removed. Then the renamed
// directory is removed; a file that an UploadPart in flight during the
// rename still put into it (its rename had looked up the directory
// before) makes a pass fail with ENOTEMPTY, and the next pass removes it.
// It answers errUploadGone if there is no directory to rename, an error
// if the rename failed (nothing changed); once the rename is done the
// upload is removed, and a failure to clean up is logged, not returned.
func (b *Backend) removeUpload(dir string) error {
	tomb := dir + removedSuffix
	if err := os.Rename(dir, tomb); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return errUploadGone
		}
		return fmt.Errorf("remove upload: %w", err)
	}
	durableDirs.Delete(dir) // writeFileSync made it durable; its path is its key
	if err := syncDir(filepath.Dir(dir)); err != nil {
		b.log.Warn("sync uploads directory", "dir", filepath.Dir(dir), "err", err)
	}
	for pass := 1; ; pass++ {
		err := os.RemoveAll(tomb)
		if err == nil {
			return nil
		}
		if pass == 5 {
			b.log.Warn("removed upload left files", "dir", tomb, "err", err)
			return nil
		}
		time.Sleep(time.Duration(pass) * time.Millisecond)
	}
}

// uploadLock serialises the ends of upload id: an Abort, and a Complete
// from its check that the upload is still there through its publication
// and removal. Without it an Abort landing while a Complete publishes
// would also succeed, and both clients would be told their ending won.
// It is a flock on Work/locks/u<shard>, so gateways sharing the store
// take turns too, and a crashed gateway's hold ends with its process.
func (b *Backend) uploadLock(id string) (func(), error) {
	h := sha256.Sum256([]byte(id))
	return lockFile(filepath.Join(b.work, "locks", "u"+hex.EncodeToString(h[:1])), unix.LOCK_EX)
}

// bucketLock serialises DeleteBucket (how: unix.LOCK_EX) with the steps
// that add to or end a bucket's uploads (unix.LOCK_SH):
// CreateMultipartUpload from its check that the bucket is there through
// making the upload's directory, UploadPart's publication of its part,
// and Abort and Complete from their check that the upload is still there
// through its removal (and Complete's publication of the object), and
// the publication of a PUT, copy or snapshot export (publishInBucket).
// DeleteBucket then removes the bucket with none of those halfway: each
// one landed before it (and is removed with the bucket, or its object
// keeps the bucket) or comes after and finds no bucket or no upload. A
// body being received holds no lock, so a DeleteBucket waits for
// publications only. It is a flock on Work/locks/b<shard>, shared
// between gateways; it is taken before uploadLock and the key's locks.
func (b *Backend) bucketLock(bucket string, how int) (func(), error) {
	h := sha256.Sum256([]byte(bucket))
	return lockFile(filepath.Join(b.work, "locks", "b"+hex.EncodeToString(h[:1])), how)
}

// upload reads upload id of bucket/key; NoSuchUpload if there is none
// (or it belongs to another key).
func (b *Backend) upload(bucket, key, id string) (*uploadInfo, string, error) {
	if err := checkBucketName(bucket); err != nil {
		return nil, "", err
	}
	if !validUploadID(id) {
		return nil, "", s3err.GetNoSuchUploadErr(id)
	}
	dir := b.uploadDir(bucket, id)
	data, err := os.ReadFile(filepath.Join(dir, "info.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", s3err.GetNoSuchUploadErr(id)
	}
	if err != nil {
		return nil, "", fmt.Errorf("upload %s: %w", id, err)
	}
	var info uploadInfo
	if err := json.Unmarshal(data, &info); err != nil {
		return nil, "", fmt.Errorf("upload %s: %w", id, err)
	}
	if info.Bucket != bucket || info.Key != key {
		return nil, "", s3err.GetNoSuchUploadErr(id)
	}
	return &info, dir, nil
}

// CreateMultipartUpload starts an upload.
func (b *Backend) CreateMultipartUpload(ctx context.Context, in s3response.CreateMultipartUploadInput) (_ s3response.InitiateMultipartUploadResult, err error) {
	defer func() { err = b.answer(err, "CreateMultipartUpload", in.Bucket, in.Key) }()
	bucket, key := str(in.Bucket), str(in.Key)
	if err := checkKey(key); err != nil {
		return s3response.InitiateMultipartUploadResult{}, err
	}
	if err := checkBucketName(bucket); err != nil {
		return s3response.InitiateMultipartUploadResult{}, err
	}
	// From the bucket's check through the upload's directory: a
	// DeleteBucket in between would leave the upload of no bucket.
	unlock, err := b.bucketLock(bucket, unix.LOCK_SH)
	if err != nil {
		return s3response.InitiateMultipartUploadResult{}, fmt.Errorf("create upload: %w", err)
	}
	defer unlock()
	r, err := b.openBucket(bucket)
	if err != nil {
		return s3response.InitiateMultipartUploadResult{}, err
	}
	r.Close()
	acct, user, _ := caller(ctx)
	now := time.Now().UTC()
	info := uploadInfo{
		Bucket: bucket, Key: key, Initiated: now, Initiator: strings.Clone(acct.Access), Owner: user,
		Meta: objectMeta{
			ContentType: str(in.ContentType), ContentEncoding: str(in.ContentEncoding),
			ContentDisposition: str(in.ContentDisposition), ContentLanguage: str(in.ContentLanguage),
			CacheControl: str(in.CacheControl), Expires: str(in.Expires), UserMeta: cloneMeta(in.Metadata),
		},
		ChecksumAlgorithm: types.ChecksumAlgorithm(strings.Clone(string(in.ChecksumAlgorithm))),
		ChecksumType:      types.ChecksumType(strings.Clone(string(in.ChecksumType))),
	}
	if info.ChecksumAlgorithm != "" && info.ChecksumType == "" {
		info.ChecksumType = types.ChecksumTypeComposite
		if info.ChecksumAlgorithm == types.ChecksumAlgorithmCrc64nvme {
			info.ChecksumType = types.ChecksumTypeFullObject
		}
	}
	if info.ChecksumType == types.ChecksumTypeFullObject && !utils.IsChecksumComposable(info.ChecksumAlgorithm) {
		return s3response.InitiateMultipartUploadResult{}, s3err.GetChecksumSchemaMismatchErr(info.ChecksumAlgorithm, info.ChecksumType)
	}
	id := newUploadID(now)
	dir := b.uploadDir(bucket, id)
	data, err := json.Marshal(&info)
	hookStep("create upload", dir)
	if err == nil {
		// writeFileSync makes the upload directory, durably.
		err = writeFileSync(b.tmp, b.uploads, filepath.Join(dir, "info.json"), data)
	}
	if err != nil {
		_ = b.removeUpload(dir)
		return s3response.InitiateMultipartUploadResult{}, fmt.Errorf("create upload: %w", err)
	}
	return s3response.InitiateMultipartUploadResult{Bucket: bucket, Key: key, UploadId: id}, nil
}

// UploadPart stores part n: bytes to Work/tmp, fsync, rename into the
// upload directory, then the part record. Neither step creates the
// directory: if the upload is removed meanwhile (removeUpload renames its
// directory away first), the part answers NoSuchUpload, and what it had
// put in goes with the upload.
func (b *Backend) UploadPart(ctx context.Context, in *s3.UploadPartInput) (_ *s3.UploadPartOutput, err error) {
	defer func() { err = b.answer(err, "UploadPart", in.Bucket, in.Key) }()
	bucket, key, id := str(in.Bucket), str(in.Key), str(in.UploadId)
	info, dir, err := b.upload(bucket, key, id)
	if err != nil {
		return nil, err
	}
	if in.PartNumber == nil || *in.PartNumber < 1 || *in.PartNumber > 10000 {
		return nil, s3err.GetInvalidArgumentErr(s3err.InvalidArgPartNumber, "")
	}
	n := *in.PartNumber
	algo := in.ChecksumAlgorithm
	if algo == "" {
		// A part sent with no checksum of an upload that has an
		// algorithm is hashed here, as S3 does: the object's checksum
		// is made of its parts'.
		algo = info.ChecksumAlgorithm
	}
	rc, err := b.receive(in.Body, in.ContentLength, algo, checksumFields{
		in.ChecksumCRC32, in.ChecksumCRC32C, in.ChecksumSHA1, in.ChecksumSHA256, in.ChecksumCRC64NVME,
		in.ChecksumSHA512, in.ChecksumMD5, in.ChecksumXXHASH64, in.ChecksumXXHASH3, in.ChecksumXXHASH128})
	if err != nil {
		return nil, err
	}
	defer rc.close()
	if info.ChecksumAlgorithm != "" && rc.sum != nil && rc.sum.Algorithm != info.ChecksumAlgorithm {
		return nil, s3err.GetChecksumTypeMismatchErr(info.ChecksumAlgorithm, rc.sum.Algorithm)
	}
	if err := rc.f.Sync(); err != nil {
		return nil, err
	}
	unlock, err := b.bucketLock(bucket, unix.LOCK_SH)
	if err != nil {
		return nil, fmt.Errorf("upload part %d: %w", n, err)
	}
	defer unlock()
	var rnd [6]byte
	rand.Read(rnd[:])
	file := fmt.Sprintf("%d.%s", n, hex.EncodeToString(rnd[:]))
	if err := os.Rename(rc.f.Name(), filepath.Join(dir, file)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, s3err.GetNoSuchUploadErr(id) // aborted meanwhile
		}
		return nil, err
	}
	rc.published = true
	traceFS("part", file)
	if rc.sum != nil {
		rc.sum.Type = info.ChecksumType
	}
	rec := partRecord{Number: n, File: file, ETag: `"` + rc.md5 + `"`, Size: rc.size, Checksum: rc.sum,
		Modified: time.Now().UTC()}
	old, _ := readPart(dir, n)
	data, err := json.Marshal(&rec)
	if err == nil {
		err = writeFileIn(b.tmp, filepath.Join(dir, fmt.Sprintf("%d.json", n)), data)
	}
	if err != nil {
		os.Remove(filepath.Join(dir, file))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, s3err.GetNoSuchUploadErr(id) // removed meanwhile
		}
		return nil, fmt.Errorf("record part %d: %w", n, err)
	}
	if old != nil && old.File != file {
		os.Remove(filepath.Join(dir, old.File))
	}
	out := &s3.UploadPartOutput{ETag: ptr(rec.ETag)}
	if rc.sum != nil {
		f := rc.sum.fields()
		out.ChecksumCRC32, out.ChecksumCRC32C, out.ChecksumSHA1, out.ChecksumSHA256 = f.CRC32, f.CRC32C, f.SHA1, f.SHA256
		out.ChecksumCRC64NVME, out.ChecksumSHA512, out.ChecksumMD5 = f.CRC64NVME, f.SHA512, f.MD5
		out.ChecksumXXHASH64, out.ChecksumXXHASH3, out.ChecksumXXHASH128 = f.XXHASH64, f.XXHASH3, f.XXHASH128
	}
	return out, nil
}

func readPart(dir string, n int32) (*partRecord, error) {
	data, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("%d.json", n)))
	if err != nil {
		return nil, err
	}
	var rec partRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// parts returns the upload's part records by number.
func parts(dir string) ([]partRecord, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []partRecord
	for _, e := range ents {
		num, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || num == "info" {
			continue
		}
		n, err := strconv.ParseInt(num, 10, 32)
		if err != nil {
			continue
		}
		rec, err := readPart(dir, int32(n))
		if err != nil {
			continue
		}
		out = append(out, *rec)
	}
	slices.SortFunc(out, func(x, y partRecord) int { return int(x.Number - y.Number) })
	return out, nil
}

// AbortMultipartUpload removes an upload and its parts.
func (b *Backend) AbortMultipartUpload(ctx context.Context, in *s3.AbortMultipartUploadInput) error {
	bucket, key, id := str(in.Bucket), str(in.Key), str(in.UploadId)
	info, dir, err := b.upload(bucket, key, id)
	if err != nil {
		return err
	}
	if t := in.IfMatchInitiatedTime; t != nil && t.Unix() != info.Initiated.Unix() {
		return s3err.GetPreconditionFailedErr(s3err.ConditionIfMatchInitiatedTime)
	}
	unlockBucket, err := b.bucketLock(bucket, unix.LOCK_SH)
	if err != nil {
		return fmt.Errorf("abort upload %s: %w", id, err)
	}
	defer unlockBucket()
	unlock, err := b.uploadLock(id)
	if err != nil {
		return fmt.Errorf("abort upload %s: %w", id, err)
	}
	defer unlock()
	err = b.removeUpload(dir)
	if errors.Is(err, errUploadGone) {
		return s3err.GetNoSuchUploadErr(id) // aborted or completed meanwhile
	}
	if err != nil {
		return fmt.Errorf("abort upload %s: %w", id, err)
	}
	return nil
}

// ListParts lists an upload's parts.
func (b *Backend) ListParts(ctx context.Context, in *s3.ListPartsInput) (s3response.ListPartsResult, error) {
	bucket, key, id := str(in.Bucket), str(in.Key), str(in.UploadId)
	info, dir, err := b.upload(bucket, key, id)
	if err != nil {
		return s3response.ListPartsResult{}, err
	}
	marker := 0
	if in.PartNumberMarker != nil && *in.PartNumberMarker != "" {
		if marker, err = strconv.Atoi(*in.PartNumberMarker); err != nil || marker < 0 {
			return s3response.ListPartsResult{}, s3err.APIError{Code: "InvalidArgument",
				Description: "Part number marker must be a non-negative integer", HTTPStatusCode: http.StatusBadRequest}
		}
	}
	maxParts := 1000
	if in.MaxParts != nil && *in.MaxParts >= 0 {
		maxParts = min(int(*in.MaxParts), 1000)
	}
	all, err := parts(dir)
	if err != nil {
		return s3response.ListPartsResult{}, err
	}
	out := s3response.ListPartsResult{
		Bucket: bucket, Key: key, UploadID: id, PartNumberMarker: marker, MaxParts: maxParts,
		ChecksumAlgorithm: info.ChecksumAlgorithm, ChecksumType: info.ChecksumType,
		Initiator:    s3response.Initiator{ID: info.Initiator, DisplayName: info.Owner},
		Owner:        s3response.Owner{ID: info.Initiator, DisplayName: info.Owner},
		StorageClass: types.StorageClassStandard,
	}
	for _, p := range all {
		if int(p.Number) <= marker {
			continue
		}
		if maxParts == 0 {
			// An empty page, not truncated, as the other listings answer
			// max-keys=0: a next marker of 0 would list the same again.
			break
		}
		if len(out.Parts) == maxParts {
			out.IsTruncated = true
			break
		}
		part := s3response.Part{PartNumber: int(p.Number), LastModified: p.Modified, ETag: p.ETag, Size: p.Size}
		f := p.Checksum.fields()
		part.ChecksumCRC32, part.ChecksumCRC32C, part.ChecksumSHA1, part.ChecksumSHA256 = f.CRC32, f.CRC32C, f.SHA1, f.SHA256
		part.ChecksumCRC64NVME, part.ChecksumSHA512, part.ChecksumMD5 = f.CRC64NVME, f.SHA512, f.MD5
		part.ChecksumXXHASH64, part.ChecksumXXHASH3, part.ChecksumXXHASH128 = f.XXHASH64, f.XXHASH3, f.XXHASH128
		out.Parts = append(out.Parts, part)
		out.NextPartNumberMarker = int(p.Number)
	}
	return out, nil
}

// ListMultipartUploads lists a bucket's uploads (backend.ListMultipartUploads
// pages them).
func (b *Backend) ListMultipartUploads(ctx context.Context, in *s3.ListMultipartUploadsInput) (s3response.ListMultipartUploadsResult, error) {
	out, err := b.listUploads(ctx, in)
	if err == nil && urlEncoding(ctx, in.EncodingType) {
		// As ListObjects: the names, URL-encoded (upload ids need none).
		out.EncodingType = string(types.EncodingTypeUrl)
		for i := range out.Uploads {
			out.Uploads[i].Key = encodeName(out.Uploads[i].Key)
		}
		for i := range out.CommonPrefixes {
			out.CommonPrefixes[i].Prefix = encodeName(out.CommonPrefixes[i].Prefix)
		}
		for _, n := range []*string{&out.Prefix, &out.Delimiter, &out.KeyMarker, &out.NextKeyMarker} {
			*n = encodeName(*n)
		}
	}
	return out, err
}

// listUploads is ListMultipartUploads but for the names' encoding.
func (b *Backend) listUploads(ctx context.Context, in *s3.ListMultipartUploadsInput) (s3response.ListMultipartUploadsResult, error) {
	bucket := str(in.Bucket)
	prefix, delim, keyMarker, idMarker := str(in.Prefix), str(in.Delimiter), str(in.KeyMarker), str(in.UploadIdMarker)
	r, err := b.openBucket(bucket)
	if err != nil {
		return s3response.ListMultipartUploadsResult{}, err
	}
	r.Close()
	maxUploads := 1000
	if in.MaxUploads != nil && *in.MaxUploads >= 0 {
		maxUploads = min(int(*in.MaxUploads), 1000)
	}
	if keyMarker != "" && idMarker != "" && !validUploadID(idMarker) {
		return s3response.ListMultipartUploadsResult{}, s3err.GetInvalidArgumentErr(s3err.InvalidArgUploadIdMarker, idMarker)
	}
	if maxUploads == 0 {
		// An empty page, not truncated, as for max-keys=0 (the lister
		// would take 0 for no limit).
		return s3response.ListMultipartUploadsResult{Bucket: bucket, KeyMarker: keyMarker, UploadIDMarker: idMarker,
			Delimiter: delim, Prefix: prefix}, nil
	}
	ents, err := os.ReadDir(filepath.Join(b.uploads, bucket))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return s3response.ListMultipartUploadsResult{}, err
	}
	var ups []s3response.Upload
	for _, e := range ents {
		if !e.IsDir() || !validUploadID(e.Name()) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(b.uploads, bucket, e.Name(), "info.json"))
		if err != nil {
			continue
		}
		var info uploadInfo
		if json.Unmarshal(data, &info) != nil || info.Bucket != bucket {
			continue
		}
		if !strings.HasPrefix(info.Key, prefix) {
			continue
		}
		// With an upload-id marker the marker key's own uploads are
		// listed after that id (ids sort by creation, newUploadID); without
		// one, listing starts after the key. The id marker is a position:
		// its upload may have been completed or aborted since (clients
		// abort the uploads of a page before asking for the next).
		if keyMarker != "" && (info.Key < keyMarker || info.Key == keyMarker && (idMarker == "" || e.Name() <= idMarker)) {
			continue
		}
		// With a delimiter, a key under a common prefix at or before the
		// key marker went out as that prefix, which may be the marker
		// itself (a page that ended with it): it is not listed again.
		if keyMarker != "" && delim != "" {
			if before, _, ok := strings.Cut(info.Key[len(prefix):], delim); ok && prefix+before+delim <= keyMarker {
				continue
			}
		}
		ups = append(ups, s3response.Upload{
			Key: info.Key, UploadID: e.Name(), StorageClass: types.StorageClassStandard, Initiated: info.Initiated,
			Initiator:         s3response.Initiator{ID: info.Initiator, DisplayName: info.Owner},
			Owner:             s3response.Owner{ID: info.Initiator, DisplayName: info.Owner},
			ChecksumAlgorithm: info.ChecksumAlgorithm, ChecksumType: info.ChecksumType,
		})
	}
	slices.SortFunc(ups, func(x, y s3response.Upload) int {
		if c := strings.Compare(x.Key, y.Key); c != 0 {
			return c
		}
		return strings.Compare(x.UploadID, y.UploadID)
	})
	// The markers were applied above: the lister would look for the id
	// marker's upload, and fail if it is gone.
	page, err := backend.ListMultipartUploads(ups, prefix, delim, keyMarker, "", maxUploads)
	if err != nil {
		return s3response.ListMultipartUploadsResult{}, err
	}
	return s3response.ListMultipartUploadsResult{
		Bucket: bucket, KeyMarker: keyMarker, UploadIDMarker: idMarker, Delimiter: delim, Prefix: prefix,
		MaxUploads: maxUploads, IsTruncated: page.IsTruncated, NextKeyMarker: page.NextKeyMarker,
		NextUploadIDMarker: page.NextUploadIDMarker, Uploads: page.Uploads, CommonPrefixes: page.CommonPrefixes,
	}, nil
}

// CompleteMultipartUpload checks the part list (ascending, known parts
// with matching ETags, all but the last at least 5 MiB), concatenates the
// parts into a temp file (copy_file_range where possible), syncs it and
// publishes it like a PUT; the ETag follows S3's multipart rule. A part
// uploaded again meanwhile is joined whole or answered InvalidPart
// (appendPart).
func (b *Backend) CompleteMultipartUpload(ctx context.Context, in *s3.CompleteMultipartUploadInput) (_ s3response.CompleteMultipartUploadResult, _ string, err error) {
	defer func() { err = b.answer(err, "CompleteMultipartUpload", in.Bucket, in.Key) }()
	var none s3response.CompleteMultipartUploadResult
	bucket, key, id := str(in.Bucket), str(in.Key), str(in.UploadId)
	if err := checkKey(key); err != nil {
		return none, "", err
	}
	info, dir, err := b.upload(bucket, key, id)
	if err != nil {
		return none, "", err
	}
	r, err := b.openBucket(bucket)
	if err != nil {
		return none, "", err
	}
	defer r.Close()
	if in.MultipartUpload == nil || len(in.MultipartUpload.Parts) == 0 {
		return none, "", s3err.GetAPIError(s3err.ErrMalformedXML)
	}
	status, err := b.versioning(ctx, bucket)
	if err != nil {
		return none, "", err
	}
	check := b.putPreconditions(r, bucket, key, in.IfMatch, in.IfNoneMatch)
	if check != nil {
		// Before the parts are joined, to fail fast; again under the
		// key's lock.
		if err := check(); err != nil {
			return none, "", err
		}
	}
	want := in.MultipartUpload.Parts
	last := int32(0)
	for _, p := range want {
		if p.PartNumber == nil || p.ETag == nil {
			return none, "", s3err.GetAPIError(s3err.ErrMalformedXML)
		}
		if *p.PartNumber <= last {
			return none, "", s3err.GetAPIError(s3err.ErrInvalidPartOrder)
		}
		last = *p.PartNumber
	}
	recs := make([]*partRecord, len(want))
	var total int64
	ends := make([]int64, len(want))
	for i, p := range want {
		n := *p.PartNumber
		rec, err := readPart(dir, n)
		if err != nil || trimQuotes(rec.ETag) != trimQuotes(*p.ETag) {
			return none, "", s3err.GetInvalidPartErr(id, n, *p.ETag)
		}
		if err := checkPartChecksum(info, rec, p, id); err != nil {
			return none, "", err
		}
		if i < len(want)-1 && rec.Size < backend.MinPartSize {
			return none, "", s3err.GetEntityTooSmallErr(rec.Size, backend.MinPartSize)
		}
		recs[i] = rec
		total += rec.Size
		ends[i] = total
	}
	if in.MpuObjectSize != nil && *in.MpuObjectSize != total {
		return none, "", s3err.GetIncorrectMpObjectSizeErr(total, *in.MpuObjectSize)
	}
	etag, err := backend.ComputeMultipartETagFromPartETags(want)
	if err != nil {
		return none, "", err
	}
	sum, err := multipartChecksum(info, recs, checksumFields{
		in.ChecksumCRC32, in.ChecksumCRC32C, in.ChecksumSHA1, in.ChecksumSHA256, in.ChecksumCRC64NVME,
		in.ChecksumSHA512, in.ChecksumMD5, in.ChecksumXXHASH64, in.ChecksumXXHASH3, in.ChecksumXXHASH128})
	if err != nil {
		return none, "", err
	}
	tmp, err := b.createTemp()
	if err != nil {
		return none, "", err
	}
	rc := &received{f: tmp}
	defer rc.close()
	for i, rec := range recs {
		if err := appendPart(tmp, dir, id, rec, want[i]); err != nil {
			return none, "", err
		}
	}
	fi, err := tmp.Stat()
	if err != nil {
		return none, "", err
	}
	rc.st = fi.Sys().(*syscall.Stat_t)
	m := info.Meta
	m.ETag = etag
	m.Checksum = sum
	m.Parts = ends
	m.VersionID = writeVersion(status)
	// Ownership first: the sync in finish makes it durable too.
	if err := b.giveToWriter(ctx, tmp); err != nil {
		return none, "", err
	}
	if err := b.finish(rc, &m); err != nil {
		return none, "", err
	}
	unlockBucket, err := b.bucketLock(bucket, unix.LOCK_SH)
	if err != nil {
		return none, "", fmt.Errorf("complete upload %s: %w", id, err)
	}
	defer unlockBucket()
	unlock, err := b.uploadLock(id)
	if err != nil {
		return none, "", fmt.Errorf("complete upload %s: %w", id, err)
	}
	defer unlock()
	if _, err := os.Stat(filepath.Join(dir, "info.json")); errors.Is(err, fs.ErrNotExist) {
		return none, "", s3err.GetNoSuchUploadErr(id) // aborted or completed meanwhile
	} else if err != nil {
		return none, "", fmt.Errorf("complete upload %s: %w", id, err)
	}
	if err := b.publishWrite(r, bucket, key, tmp, &m, status, check); err != nil {
		return none, "", err
	}
	rc.published = true
	if err := b.removeUpload(dir); err != nil {
		b.log.Warn("remove completed upload", "upload", id, "err", err)
	}
	res := s3response.CompleteMultipartUploadResult{Bucket: &bucket, Key: &key, ETag: &etag}
	if sum != nil {
		f := sum.fields()
		res.ChecksumCRC32, res.ChecksumCRC32C, res.ChecksumSHA1, res.ChecksumSHA256 = f.CRC32, f.CRC32C, f.SHA1, f.SHA256
		res.ChecksumCRC64NVME, res.ChecksumSHA512, res.ChecksumMD5 = f.CRC64NVME, f.SHA512, f.MD5
		res.ChecksumXXHASH64, res.ChecksumXXHASH3, res.ChecksumXXHASH128 = f.XXHASH64, f.XXHASH3, f.XXHASH128
		res.ChecksumType = &sum.Type
	}
	if status != "" {
		return res, showVersion(m.VersionID), nil
	}
	return res, "", nil
}

// appendPart appends part rec, listed in the Complete request as p, to
// dst. An UploadPart of the same number may have replaced the part since
// its record was read: it publishes its record and then removes the file
// the record replaced, so rec's file may be gone. Part files are never
// changed once renamed in, so a part file opened is whole; one found gone
// is looked up again in the part's current record, which is used if its
// ETag is still the one the client listed (the same bytes uploaded
// again), and otherwise the part is InvalidPart — the part the client
// means is no longer there, as S3 answers for an ETag that does not
// match. An upload removed meanwhile (Abort, another Complete) is
// NoSuchUpload.
func appendPart(dst *os.File, dir, id string, rec *partRecord, p types.CompletedPart) error {
	invalid := s3err.GetInvalidPartErr(id, rec.Number, *p.ETag)
	for range 8 {
		name := filepath.Join(dir, rec.File)
		hookStep("complete part", name)
		src, err := os.Open(name)
		if err == nil {
			err = appendFile(dst, src, rec.Size)
			src.Close()
			if err != nil {
				return fmt.Errorf("complete upload %s: part %d: %w", id, rec.Number, err)
			}
			return nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("complete upload %s: part %d: %w", id, rec.Number, err)
		}
		if _, serr := os.Stat(dir); errors.Is(serr, fs.ErrNotExist) {
			return s3err.GetNoSuchUploadErr(id) // aborted or completed meanwhile
		}
		cur, rerr := readPart(dir, rec.Number)
		switch {
		case errors.Is(rerr, fs.ErrNotExist):
			if _, serr := os.Stat(dir); errors.Is(serr, fs.ErrNotExist) {
				return s3err.GetNoSuchUploadErr(id)
			}
			return invalid
		case rerr != nil:
			return fmt.Errorf("complete upload %s: part %d: %w", id, rec.Number, rerr)
		case cur.File == rec.File:
			// Not replaced, yet its file is gone: removed behind S3.
			return fmt.Errorf("complete upload %s: part %d: %w", id, rec.Number, err)
		case trimQuotes(cur.ETag) != trimQuotes(*p.ETag) || cur.Size != rec.Size:
			return invalid
		}
		rec = cur
	}
	// Replaced by the same bytes again and again while being joined.
	return invalid
}

// appendFile appends the n bytes of src (at its start) to dst.
func appendFile(dst, src *os.File, n int64) error {
	written, err := dst.ReadFrom(&io.LimitedReader{R: src, N: n})
	if err != nil {
		return err
	}
	if written != n {
		return fmt.Errorf("part file %s has %d bytes, recorded %d", src.Name(), written, n)
	}
	return nil
}

// checkPartChecksum checks the checksum a Complete request gives for part
// p (none is fine) against the one recorded for the part (rec): a part
// whose checksum differs from what the client computed is not the part
// the client means, as one whose ETag differs is not — InvalidPart; one
// of an algorithm the upload does not use that differs is BadDigest.
func checkPartChecksum(info *uploadInfo, rec *partRecord, p types.CompletedPart, id string) error {
	given := checksumFields{p.ChecksumCRC32, p.ChecksumCRC32C, p.ChecksumSHA1, p.ChecksumSHA256, p.ChecksumCRC64NVME,
		p.ChecksumSHA512, p.ChecksumMD5, p.ChecksumXXHASH64, p.ChecksumXXHASH3, p.ChecksumXXHASH128}.given()
	if len(given) > 1 {
		return s3err.GetInvalidArgumentErr(s3err.InvalidArgChecksumPart, given[1].Value)
	}
	if len(given) == 0 {
		return nil
	}
	g := given[0]
	if !utils.IsValidChecksum(g.Value, g.Algorithm) {
		return s3err.GetInvalidArgumentErr(s3err.InvalidArgChecksumPart, g.Value)
	}
	if rec.Checksum != nil && rec.Checksum.Algorithm == g.Algorithm && rec.Checksum.Value == g.Value {
		return nil
	}
	if info.ChecksumAlgorithm == "" || info.ChecksumAlgorithm == g.Algorithm {
		return s3err.GetInvalidPartErr(id, *p.PartNumber, *p.ETag)
	}
	return s3err.APIError{Code: "BadDigest", HTTPStatusCode: http.StatusBadRequest,
		Description: fmt.Sprintf("The %s you specified for part %d did not match what was received.", strings.ToLower(string(g.Algorithm)), *p.PartNumber)}
}

// multipartChecksum computes the whole object's checksum from the parts'
// (COMPOSITE: checksum of the part checksums, "-N"; FULL_OBJECT: CRCs
// combined), and compares it with the one the client sent, if any. No
// checksum without an algorithm given at creation or with a part that
// has none.
func multipartChecksum(info *uploadInfo, recs []*partRecord, sent checksumFields) (*checksum, error) {
	algo := info.ChecksumAlgorithm
	if algo == "" {
		return nil, nil
	}
	for _, rec := range recs {
		if rec.Checksum == nil || rec.Checksum.Algorithm != algo {
			return nil, nil
		}
	}
	var value string
	switch info.ChecksumType {
	case types.ChecksumTypeFullObject:
		value = recs[0].Checksum.Value
		for _, rec := range recs[1:] {
			v, err := utils.AddCRCChecksum(algo, value, rec.Checksum.Value, rec.Size)
			if err != nil {
				return nil, fmt.Errorf("combine part checksums: %w", err)
			}
			value = v
		}
	default:
		cr, err := utils.NewCompositeChecksumReader(utils.HashType(strings.ToLower(string(algo))))
		if err != nil {
			return nil, s3err.GetAPIError(s3err.ErrInvalidChecksumAlgorithm)
		}
		for _, rec := range recs {
			if err := cr.Process(rec.Checksum.Value); err != nil {
				return nil, s3err.GetChecksumBadDigestErr(algo)
			}
		}
		value = fmt.Sprintf("%s-%d", cr.Sum(), len(recs))
	}
	if a, v := sent.pick(); a != "" {
		if a != algo {
			return nil, s3err.GetChecksumTypeMismatchErr(algo, a)
		}
		if v != value {
			return nil, s3err.GetChecksumBadDigestErr(algo)
		}
	}
	return &checksum{Algorithm: algo, Type: info.ChecksumType, Value: value}, nil
}
