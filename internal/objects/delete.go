package objects

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/versity/versitygw/backend"
	"github.com/versity/versitygw/s3err"
	"github.com/versity/versitygw/s3response"
)

// deleteObject removes bucket/key inside r. Deleting a key that is not an
// object (no file, a file without basalt metadata, or an invalid key)
// succeeds and changes nothing, as in S3. An object changed behind S3 is
// deleted. removed reports whether the file is gone from the key (unlinked,
// or found gone when unlinking it), also when a later step failed.
func (b *Backend) deleteObject(r *os.Root, bucket, key string, pre *backend.ObjectDeletePreconditions) (removed bool, err error) {
	if checkKey(key) != nil {
		return false, nil // not an object: nothing to delete
	}
	o, why, err := b.inspect(r, bucket, key)
	if isNoSuchKey(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	o.f.Close()
	if err := deletePreconditions(bucket, key, o.m, why, pre); err != nil {
		return false, err
	}
	dir, _ := splitKey(key)
	err = b.meta.remove(bucket, key, func() error {
		err := r.Remove(key)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("delete %s/%s: %w", bucket, key, err)
		}
		removed = true
		return nil
	})
	if err != nil {
		return removed, err
	}
	if err := faultFS("delete sync dir", dir); err != nil {
		return true, err
	}
	if err := syncIn(r, dir); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
		return true, err
	}
	pruneDirs(r, dir)
	return true, nil
}

// deletePreconditions evaluates a DELETE's conditions (nil: none) against
// the current object of bucket/key, whose record is m and whose file
// differs from it as why says ("" if it does not): an object changed
// behind S3 meets no condition.
func deletePreconditions(bucket, key string, m *objectMeta, why string, pre *backend.ObjectDeletePreconditions) error {
	if pre == nil || pre.IfMatch == nil && pre.IfMatchLastModTime == nil && pre.IfMatchSize == nil {
		return nil
	}
	if why != "" {
		return errModified(bucket, key, why)
	}
	return deleteConditions(m, *pre)
}

// DeleteObject deletes one object.
func (b *Backend) DeleteObject(ctx context.Context, in *s3.DeleteObjectInput) (_ *s3.DeleteObjectOutput, err error) {
	defer func() { err = b.answer(err, "DeleteObject", in.Bucket, in.Key) }()
	bucket, key := str(in.Bucket), str(in.Key)
	status, err := b.versioning(ctx, bucket)
	if err != nil {
		return nil, err
	}
	r, err := b.openBucket(bucket)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var mt *time.Time
	if in.IfMatchLastModifiedTime != nil {
		mt = in.IfMatchLastModifiedTime
	}
	var ifMatch *string
	if in.IfMatch != nil && *in.IfMatch != "" {
		ifMatch = in.IfMatch
	}
	vid, marker, err := b.deleteVersioned(r, bucket, key, str(in.VersionId), status, &backend.ObjectDeletePreconditions{
		IfMatch: ifMatch, IfMatchLastModTime: mt, IfMatchSize: in.IfMatchSize})
	if err != nil {
		return nil, err
	}
	out := &s3.DeleteObjectOutput{}
	if vid != "" {
		out.VersionId = &vid
	}
	if marker {
		out.DeleteMarker = &marker
	}
	return out, nil
}

// DeleteObjects deletes several objects, reporting each.
func (b *Backend) DeleteObjects(ctx context.Context, in *s3.DeleteObjectsInput) (s3response.DeleteResult, error) {
	bucket := str(in.Bucket)
	status, err := b.versioning(ctx, bucket)
	if err != nil {
		return s3response.DeleteResult{}, err
	}
	r, err := b.openBucket(bucket)
	if err != nil {
		return s3response.DeleteResult{}, err
	}
	defer r.Close()
	var res s3response.DeleteResult
	if in.Delete == nil {
		return res, nil
	}
	quiet := quietDelete(ctx, in.Delete)
	for _, obj := range in.Delete.Objects {
		key := str(obj.Key)
		// Each object's ETag (and, as for DeleteObject, time and size)
		// makes its deletion conditional, like DeleteObject's If-Match.
		var ifMatch *string
		if etag := trimQuotes(str(obj.ETag)); etag != "" {
			ifMatch = &etag
		}
		vid, marker, err := b.deleteVersioned(r, bucket, key, str(obj.VersionId), status, &backend.ObjectDeletePreconditions{
			IfMatch: ifMatch, IfMatchLastModTime: obj.LastModifiedTime, IfMatchSize: obj.Size})
		if err == nil {
			d := types.DeletedObject{Key: &key}
			switch {
			case marker && obj.VersionId == nil:
				d.DeleteMarker, d.DeleteMarkerVersionId = &marker, &vid
			case marker:
				d.DeleteMarker, d.VersionId = &marker, &vid
			case vid != "":
				d.VersionId = &vid
			}
			if !quiet {
				res.Deleted = append(res.Deleted, d)
			}
			continue
		}
		code, msg := "InternalError", "We encountered an internal error, please try again."
		var se s3err.S3Error
		if errors.As(b.answer(err, "DeleteObjects", in.Bucket, &key), &se) {
			code, msg = se.BaseError().Code, se.BaseError().Description
		}
		// s3api matches answers to the request's objects by key and
		// version id: an error without the version id it was asked with
		// would be dropped, and the object reported neither deleted nor
		// failed.
		res.Error = append(res.Error, types.Error{Key: &key, VersionId: obj.VersionId, Code: &code, Message: &msg})
	}
	return res, nil
}

// quietDelete reports whether a DeleteObjects asked for quiet mode
// (<Quiet>true</Quiet>): its answer then lists only the keys that
// failed (AWS DeleteObjects). s3api does not pass Quiet on — the Delete
// it hands the backend has the objects only — so it is read from the
// request body, which s3api passes as ctx (fasthttp's RequestCtx). d's
// own Quiet (direct calls) counts too.
func quietDelete(ctx context.Context, d *types.Delete) bool {
	if d.Quiet != nil {
		return *d.Quiet
	}
	rc, ok := ctx.(interface{ PostBody() []byte })
	if !ok {
		return false
	}
	var body struct {
		Quiet bool `xml:"Quiet"`
	}
	if err := xml.Unmarshal(rc.PostBody(), &body); err != nil {
		return false // s3api parsed it; an answer with every key is no harm
	}
	return body.Quiet
}

// trimQuotes strips the quotes of an ETag.
func trimQuotes(s string) string { return strings.Trim(s, `"`) }
