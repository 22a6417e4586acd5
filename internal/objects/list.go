package objects

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/versity/versitygw/backend"
	"github.com/versity/versitygw/s3err"
	"github.com/versity/versitygw/s3response"
)

// storageClassModified flags, in listings, an object whose file was
// changed behind S3: the entry shows the file's current size and mtime
// and no ETag (docs/objects.md).
const storageClassModified types.ObjectStorageClass = "MODIFIED_OUTSIDE_S3"

// storageClassDenied flags, in listings, an object that GET refuses with
// AccessDenied (ownerMayRead): the entry shows nothing of the file — no
// ETag, size 0, Last-Modified the Unix epoch (docs/objects.md).
const storageClassDenied types.ObjectStorageClass = "ACCESS_DENIED"

// deniedTime is the Last-Modified of a storageClassDenied entry.
var deniedTime = time.Unix(0, 0).UTC()

// listEntry is backend.Walk's GetObjFunc: regular files with a valid key
// and basalt metadata are objects; everything else is skipped. Files are
// opened through c, which judges the directories they are in once per
// directory, not per object (dirChain).
func (b *Backend) listEntry(c *dirChain, bucket string) backend.GetObjFunc {
	return func(p string, d fs.DirEntry) (s3response.Object, error) {
		if !d.Type().IsRegular() || checkKey(p) != nil {
			return s3response.Object{}, backend.ErrSkipObj
		}
		o, why, err := b.inspect(c, bucket, p)
		if err != nil {
			if !isNoSuchKey(err) {
				b.log.Warn("listing skips a file", "bucket", bucket, "key", p, "err", err)
			}
			return s3response.Object{}, backend.ErrSkipObj
		}
		defer o.f.Close()
		key := p
		denied, ok := b.listDenied(c, bucket, p, o.st)
		switch {
		case !ok:
			return s3response.Object{}, backend.ErrSkipObj
		case denied:
			return s3response.Object{Key: &key, Size: ptr(int64(0)), LastModified: ptr(deniedTime), StorageClass: storageClassDenied}, nil
		case why != "":
			size, mtime := o.st.Size, time.Unix(0, o.st.Mtim.Nano()).UTC()
			return s3response.Object{Key: &key, Size: &size, LastModified: &mtime, StorageClass: storageClassModified}, nil
		}
		size, mtime := o.m.Size, o.m.mtime().UTC()
		etag := o.m.ETag
		obj := s3response.Object{Key: &key, ETag: &etag, Size: &size, LastModified: &mtime,
			StorageClass: types.ObjectStorageClassStandard}
		if o.m.Checksum != nil {
			obj.ChecksumAlgorithm = []types.ChecksumAlgorithm{o.m.Checksum.Algorithm}
			obj.ChecksumType = o.m.Checksum.Type
		}
		return obj, nil
	}
}

// listDenied reports whether a listing must flag the file st, opened at
// p through c, as one GET refuses (ownerMayRead) — before and instead of
// saying whether it changed: a listing must not show what GET would not.
// ok is false if that could not be told: the listing then skips the file.
// The directories judged are those c opened the file in, described as it
// opened them; only the bucket directory's may cost an fstat here, once
// per listing.
func (b *Backend) listDenied(c *dirChain, bucket, p string, st *syscall.Stat_t) (denied, ok bool) {
	d, err := refusal(c.stat, p, st, true)
	if err != nil {
		b.log.Warn("listing skips a file", "bucket", bucket, "key", p, "err", err)
		return false, false
	}
	return d != nil, true
}

// listFS is a bucket's fs.FS for backend.Walk: a directory that cannot be
// read (permissions, a symbolic link leaving the bucket) lists as empty
// instead of failing the whole listing.
type listFS struct {
	fs.FS
	log *slog.Logger
}

func (l listFS) ReadDir(name string) ([]fs.DirEntry, error) {
	ents, err := fs.ReadDir(l.FS, name)
	if errors.Is(err, fs.ErrInvalid) {
		// A name no directory of the bucket can have ("a//", "a/./",
		// "../x"), from a prefix the client chose: nothing lies there,
		// and nothing to tell the operator — a warning per request would
		// let any client flood the log.
		return nil, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
		l.log.Warn("listing skips a directory", "dir", name, "err", err)
		return nil, nil
	}
	return ents, err
}

// Stat: backend.Walk reads the directory of a prefix ("a" for "a/") and
// then stats it, and fails the whole listing (500) if that fails. A
// DELETE of the last object below it prunes the directory, which may
// fall between the two: the directory is then described as an empty one
// (a directory is never an object, listEntry skips it), and the files
// read from it are found missing like any deleted meanwhile.
func (l listFS) Stat(name string) (fs.FileInfo, error) {
	fi, err := fs.Stat(l.FS, name)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return goneDir(path.Base(name)), nil
	}
	return fi, err
}

// goneDir describes a directory removed during a listing.
type goneDir string

func (g goneDir) Name() string     { return string(g) }
func (goneDir) Size() int64        { return 0 }
func (goneDir) Mode() fs.FileMode  { return fs.ModeDir | 0o755 }
func (goneDir) ModTime() time.Time { return time.Time{} }
func (goneDir) IsDir() bool        { return true }
func (goneDir) Sys() any           { return nil }

// walk lists bucket with backend.Walk over the bucket directory (inside
// an os.Root), then drops the common prefixes that hold no object (made
// only of directories or files that are not exported). A page that
// dropping made short, with more to list, is filled from where it ended:
// a dropped prefix takes no slot of max.
func (b *Backend) walk(ctx context.Context, bucket, prefix, delim, marker string, max int32) (backend.WalkResults, error) {
	r, err := b.openBucket(bucket)
	if err != nil {
		return backend.WalkResults{}, err
	}
	defer r.Close()
	c, err := openChain(r)
	if err != nil {
		return backend.WalkResults{}, fmt.Errorf("list %s: %w", bucket, err)
	}
	defer c.close()
	fsys := listFS{r.FS(), b.log}
	get := b.listEntry(c, bucket)
	var out backend.WalkResults
	for {
		left := max - int32(len(out.Objects)+len(out.CommonPrefixes))
		res, err := backend.Walk(ctx, fsys, prefix, delim, marker, left, get, []string{versionsDir})
		if err != nil {
			return backend.WalkResults{}, err
		}
		out.Objects = append(out.Objects, res.Objects...)
		for _, cp := range res.CommonPrefixes {
			sub, err := backend.Walk(ctx, fsys, *cp.Prefix, "", "", 1, get, []string{versionsDir})
			if err != nil {
				return backend.WalkResults{}, err
			}
			if len(sub.Objects) > 0 {
				out.CommonPrefixes = append(out.CommonPrefixes, cp)
			}
		}
		out.Truncated, out.NextMarker = res.Truncated, res.NextMarker
		if !res.Truncated || res.NextMarker == "" || res.NextMarker == marker ||
			int32(len(out.Objects)+len(out.CommonPrefixes)) >= max {
			return out, nil
		}
		marker = res.NextMarker
	}
}

// hasObjects reports whether dir (inside r, "." for the bucket) holds at
// least one object.
func (b *Backend) hasObjects(ctx context.Context, r *os.Root, bucket, dir string) (bool, error) {
	prefix := ""
	if dir != "." {
		prefix = dir + "/"
	}
	c, err := openChain(r)
	if err != nil {
		return false, err
	}
	defer c.close()
	res, err := backend.Walk(ctx, listFS{r.FS(), b.log}, prefix, "", "", 1, b.listEntry(c, bucket), []string{versionsDir})
	if err != nil {
		return false, err
	}
	return len(res.Objects) > 0, nil
}

// urlEncoding reports whether a listing was asked for with
// encoding-type=url: in the input (direct calls), or in the request's
// query — s3api does not pass the parameter on, and hands the backend
// fasthttp's RequestCtx as ctx. Clients that ask for it decode every key
// of the answer (rclone unescapes them whatever the answer says), so
// ignoring it turned "a+b" into "a b" and "c%2F" into "c/" for them.
func urlEncoding(ctx context.Context, asked types.EncodingType) bool {
	if asked == types.EncodingTypeUrl {
		return true
	}
	rc, ok := ctx.(interface{ RequestURI() []byte })
	if !ok {
		return false
	}
	_, query, _ := strings.Cut(string(rc.RequestURI()), "?")
	q, _ := url.ParseQuery(query) // what parsed, despite a bad pair
	return q.Get("encoding-type") == string(types.EncodingTypeUrl)
}

// encodeName URL-encodes a key, prefix or delimiter for a listing with
// encoding-type=url, as S3 does: query escaping (a space is "+", a "+"
// "%2B"), "/" left as it is. url.QueryUnescape, and the clients' decoders,
// give back the name.
func encodeName(s string) string {
	return strings.ReplaceAll(url.QueryEscape(s), "%2F", "/")
}

// encodeNames URL-encodes, in place, the given names and the keys and
// common prefixes of a listing.
func encodeNames(objs []s3response.Object, cps []types.CommonPrefix, names ...*string) {
	for i := range objs {
		objs[i].Key = ptr(encodeName(*objs[i].Key))
	}
	for i := range cps {
		cps[i].Prefix = ptr(encodeName(*cps[i].Prefix))
	}
	for _, n := range names {
		if n != nil {
			*n = encodeName(*n)
		}
	}
}

func maxKeys(p *int32) int32 {
	if p == nil || *p < 0 {
		return 1000
	}
	return min(*p, 1000)
}

// ListObjects lists a bucket (version 1: marker).
func (b *Backend) ListObjects(ctx context.Context, in *s3.ListObjectsInput) (s3response.ListObjectsResult, error) {
	bucket, prefix, delim, marker := str(in.Bucket), str(in.Prefix), str(in.Delimiter), str(in.Marker)
	max := maxKeys(in.MaxKeys)
	res, err := b.walk(ctx, bucket, prefix, delim, marker, max)
	if err != nil {
		return s3response.ListObjectsResult{}, err
	}
	out := s3response.ListObjectsResult{
		Name: &bucket, Prefix: &prefix, Marker: &marker, Delimiter: &delim, MaxKeys: &max,
		IsTruncated: &res.Truncated, Contents: res.Objects, CommonPrefixes: res.CommonPrefixes,
	}
	if res.Truncated {
		out.NextMarker = &res.NextMarker
	}
	if urlEncoding(ctx, in.EncodingType) {
		out.EncodingType = types.EncodingTypeUrl
		encodeNames(out.Contents, out.CommonPrefixes, out.Prefix, out.Marker, out.Delimiter, out.NextMarker)
	}
	return out, nil
}

// ListObjectsV2 lists a bucket (version 2: an opaque continuation token,
// the base64 of the last key or common prefix returned).
func (b *Backend) ListObjectsV2(ctx context.Context, in *s3.ListObjectsV2Input) (s3response.ListObjectsV2Result, error) {
	bucket, prefix, delim := str(in.Bucket), str(in.Prefix), str(in.Delimiter)
	token, startAfter := str(in.ContinuationToken), str(in.StartAfter)
	marker := startAfter
	if token != "" {
		m, err := base64.RawURLEncoding.DecodeString(token)
		if err != nil {
			return s3response.ListObjectsV2Result{}, s3err.APIError{Code: "InvalidArgument",
				Description: "The continuation token provided is incorrect", HTTPStatusCode: http.StatusBadRequest}
		}
		marker = max(string(m), startAfter)
	}
	maxk := maxKeys(in.MaxKeys)
	res, err := b.walk(ctx, bucket, prefix, delim, marker, maxk)
	if err != nil {
		return s3response.ListObjectsV2Result{}, err
	}
	count := int32(len(res.Objects) + len(res.CommonPrefixes))
	out := s3response.ListObjectsV2Result{
		Name: &bucket, Prefix: &prefix, Delimiter: &delim, MaxKeys: &maxk, KeyCount: &count,
		IsTruncated: &res.Truncated, Contents: res.Objects, CommonPrefixes: res.CommonPrefixes,
	}
	if startAfter != "" {
		out.StartAfter = &startAfter
	}
	if token != "" {
		out.ContinuationToken = &token
	}
	if res.Truncated {
		next := base64.RawURLEncoding.EncodeToString([]byte(res.NextMarker))
		out.NextContinuationToken = &next
	}
	if urlEncoding(ctx, in.EncodingType) {
		// The continuation tokens are ours, opaque, and stay as they are.
		out.EncodingType = types.EncodingTypeUrl
		encodeNames(out.Contents, out.CommonPrefixes, out.Prefix, out.Delimiter, out.StartAfter)
	}
	return out, nil
}
