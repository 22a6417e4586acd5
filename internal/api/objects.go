package api

// The object endpoints (/v1/objects/...): pWalrus's direct access to the
// files of the S3 object store — where an object's file is, export and
// unexport of files written into a bucket directory, and verification of
// a bucket (docs/api.md "Objects", docs/objects.md). The work is done by
// objects.Backend; these handlers authenticate, check that the caller
// owns the bucket (administrators: any) and translate.

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/objects"
	"github.com/basalt-storage/basalt/internal/volume"
)

// Error codes of the object endpoints beyond objects.Code*.
const (
	// CodeAccessDenied: the bucket belongs to another user (403).
	CodeAccessDenied = "AccessDenied"
	// CodeObjectStoreUnavailable: this node serves no object store (503).
	CodeObjectStoreUnavailable = volume.CodeObjectStoreUnavailable
)

// MaxObjectsPerRequest bounds the objects of one export or unexport.
const MaxObjectsPerRequest = 1000

// ObjectsRoot is GET /v1/objects/root: where the node keeps the buckets.
type ObjectsRoot struct {
	// Root is the absolute path of the buckets directory as the server
	// sees it: bucket B's object K is the file Root/B/K.
	Root string `json:"root"`
	// Metadata is where object records are kept: "xattr" or "sidecar".
	Metadata string `json:"metadata"`
}

// ObjectPath is GET /v1/objects/path.
type ObjectPath struct {
	Bucket string `json:"bucket"`
	Key    string `json:"key"`
	// Path is the backing file, whether or not it exists.
	Path string `json:"path"`
	// Exists: Path is a regular file. Exported: it has a record, i.e. it
	// is an object. Modified says how the file differs from its record
	// (absent if it does not).
	Exists   bool   `json:"exists"`
	Exported bool   `json:"exported"`
	Modified string `json:"modified,omitempty"`
}

// ObjectRef names one object (or would-be object).
type ObjectRef struct {
	Bucket string `json:"bucket"`
	Key    string `json:"key"`
}

// ObjectsRequest is the body of POST /v1/objects/export and /unexport.
type ObjectsRequest struct {
	Objects []ObjectRef `json:"objects"`
}

// ObjectResult is one entry of the answer to export and unexport, in the
// order of the request: the object's record as written (export) or as it
// was (unexport), or the error that object got.
type ObjectResult struct {
	Bucket string `json:"bucket"`
	Key    string `json:"key"`
	Path   string `json:"path,omitempty"`
	// ETag without quotes: the MD5 of the bytes in hex.
	ETag  string       `json:"etag,omitempty"`
	Size  *int64       `json:"size,omitempty"`
	Mtime *time.Time   `json:"mtime,omitempty"`
	Error *ErrorDetail `json:"error,omitempty"`
}

// VerifyProblem is one finding of GET /v1/objects/verify.
type VerifyProblem struct {
	Key string `json:"key"`
	// VersionID is set when the problem is a non-current version of key
	// ("null" for the null version).
	VersionID string `json:"version_id,omitempty"`
	// Problem is modified, content, missing, unreadable or unexported
	// (docs/objects.md).
	Problem string `json:"problem"`
	Detail  string `json:"detail"`
}

// VerifyResult is GET /v1/objects/verify.
type VerifyResult struct {
	Bucket string `json:"bucket"`
	// Objects checked (files with a record), files without one.
	Objects    int `json:"objects"`
	Unexported int `json:"unexported"`
	// Damaged counts the problems other than "unexported".
	Damaged  int             `json:"damaged"`
	Problems []VerifyProblem `json:"problems"`
}

// ParseObjectsRequest decodes POST /v1/objects/export and /unexport.
func ParseObjectsRequest(body []byte) (ObjectsRequest, error) {
	var r ObjectsRequest
	if err := decode(body, &r); err != nil {
		return r, err
	}
	if len(r.Objects) == 0 {
		return r, errs.Invalid(errs.CodeInvalidRequest, "objects is required: a list of {\"bucket\",\"key\"}")
	}
	if len(r.Objects) > MaxObjectsPerRequest {
		return r, errs.Invalid(errs.CodeInvalidRequest, "%d objects in one request; at most %d", len(r.Objects), MaxObjectsPerRequest)
	}
	return r, nil
}

func (s *Server) objectStore() (*objects.Backend, error) {
	if s.d.Objects == nil || s.d.Bucket == nil {
		return nil, errs.New(errs.KindUnavailable, CodeObjectStoreUnavailable, "this node serves no object store")
	}
	return s.d.Objects, nil
}

// ownBucket checks that bucket exists and that c owns it (by user id, so
// a user created again under a deleted user's name inherits nothing) or
// is an administrator.
func (s *Server) ownBucket(ctx context.Context, c volume.Caller, bucket string) error {
	if err := objects.CheckBucketName(bucket); err != nil {
		return err
	}
	rec, err := s.d.Bucket(ctx, bucket)
	if errs.IsCode(err, errs.CodeNotFound) {
		return errs.New(errs.KindNotFound, objects.CodeNoSuchBucket, "bucket %q does not exist", bucket)
	}
	if err != nil {
		return err
	}
	if !c.Admin && rec.OwnerID != c.ID {
		return errs.New(errs.KindForbidden, CodeAccessDenied, "bucket %q belongs to another user", bucket)
	}
	return nil
}

func (s *Server) objectsRoot(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	be, err := s.objectStore()
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ObjectsRoot{Root: be.Root(), Metadata: be.MetadataKind()})
	return nil
}

func (s *Server) objectPath(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	be, err := s.objectStore()
	if err != nil {
		return err
	}
	q := r.URL.Query()
	bucket, key := q.Get("bucket"), q.Get("key")
	if bucket == "" {
		return errs.Invalid(errs.CodeInvalidRequest, "the query parameter bucket is required")
	}
	if err := s.ownBucket(r.Context(), c, bucket); err != nil {
		return err
	}
	pi, err := be.ObjectPath(r.Context(), bucket, key)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ObjectPath{Bucket: pi.Bucket, Key: pi.Key, Path: pi.Path, Exists: pi.Exists,
		Exported: pi.Exported, Modified: pi.Modified})
	return nil
}

// objectsOp serves export and unexport: op runs on every object the
// caller may touch; each object gets its result or its error.
func (s *Server) objectsOp(op func(be *objects.Backend) func(ctx context.Context, bucket, key string) (objects.ObjectInfo, error)) handler {
	return func(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
		be, err := s.objectStore()
		if err != nil {
			return err
		}
		body, err := readBody(r.Body)
		if err != nil {
			return err
		}
		req, err := ParseObjectsRequest(body)
		if err != nil {
			return err
		}
		run := op(be)
		owned := map[string]error{}
		out := make([]ObjectResult, 0, len(req.Objects))
		for _, o := range req.Objects {
			res := ObjectResult{Bucket: o.Bucket, Key: o.Key}
			err, seen := owned[o.Bucket]
			if !seen {
				err = s.ownBucket(r.Context(), c, o.Bucket)
				owned[o.Bucket] = err
			}
			var oi objects.ObjectInfo
			if err == nil {
				oi, err = run(r.Context(), o.Bucket, o.Key)
			}
			if err != nil {
				if ctxErr := r.Context().Err(); ctxErr != nil {
					return ctxErr
				}
				e, ok := errs.Public(err)
				if !ok {
					s.d.Log.Error("internal error", "path", r.URL.Path, "bucket", o.Bucket, "key", o.Key, "err", err)
					e = errs.New(errs.KindInternal, errs.CodeInternal, "internal error: %v", err)
				}
				res.Error = &ErrorDetail{Code: e.Code, Message: e.Message}
			} else {
				size, mtime := oi.Size, oi.Mtime
				res.Path, res.ETag, res.Size, res.Mtime = oi.Path, oi.ETag, &size, &mtime
				s.d.Log.Debug("api object", "path", r.URL.Path, "user", c.Name, "bucket", o.Bucket, "key", o.Key, "etag", oi.ETag)
			}
			out = append(out, res)
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	}
}

func (s *Server) exportObjects() handler {
	return s.objectsOp(func(be *objects.Backend) func(context.Context, string, string) (objects.ObjectInfo, error) {
		return be.Export
	})
}

func (s *Server) unexportObjects() handler {
	return s.objectsOp(func(be *objects.Backend) func(context.Context, string, string) (objects.ObjectInfo, error) {
		return be.Unexport
	})
}

// queryBool reads an optional boolean query parameter.
func queryBool(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errs.Invalid(errs.CodeInvalidRequest, "query parameter %s=%q is not true or false", name, v)
	}
	return b, nil
}

func (s *Server) verifyObjects(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	be, err := s.objectStore()
	if err != nil {
		return err
	}
	bucket := r.URL.Query().Get("bucket")
	if bucket == "" {
		return errs.Invalid(errs.CodeInvalidRequest, "the query parameter bucket is required")
	}
	var opts objects.VerifyOptions
	if opts.Content, err = queryBool(r, "content"); err != nil {
		return err
	}
	if opts.All, err = queryBool(r, "all"); err != nil {
		return err
	}
	if err := s.ownBucket(r.Context(), c, bucket); err != nil {
		return err
	}
	rep, err := be.Verify(r.Context(), bucket, opts)
	if err != nil {
		return err
	}
	out := VerifyResult{Bucket: rep.Bucket, Objects: rep.Objects, Unexported: rep.Unexported, Damaged: rep.Damaged(),
		Problems: make([]VerifyProblem, 0, len(rep.Problems))}
	for _, p := range rep.Problems {
		out.Problems = append(out.Problems, VerifyProblem{Key: p.Key, VersionID: p.VersionID, Problem: p.Problem,
			Detail: p.Detail})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
