package api

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/objects"
	"github.com/basalt-storage/basalt/internal/volume"
)

func TestParseObjectsRequest(t *testing.T) {
	r, err := ParseObjectsRequest([]byte(`{"objects":[{"bucket":"b1","key":"a/b"},{"bucket":"b2","key":"c"}]}`))
	if err != nil || len(r.Objects) != 2 || r.Objects[0] != (ObjectRef{"b1", "a/b"}) || r.Objects[1] != (ObjectRef{"b2", "c"}) {
		t.Fatalf("%+v %v", r, err)
	}
	many := `{"objects":[` + strings.Repeat(`{"bucket":"b","key":"k"},`, MaxObjectsPerRequest) + `{"bucket":"b","key":"k"}]}`
	for body, code := range map[string]string{
		``:                               errs.CodeMalformedJSON,
		`{}`:                             errs.CodeInvalidRequest,
		`{"objects":[]}`:                 errs.CodeInvalidRequest,
		`{"objects":[{"bucket":1}]}`:     errs.CodeMalformedJSON,
		`{"objects":[{"path":"/x"}]}`:    errs.CodeMalformedJSON,
		`{"objects":[],"extra":true}`:    errs.CodeMalformedJSON,
		`{"objects":[{"bucket":"b"}]}{}`: errs.CodeMalformedJSON,
		many:                             errs.CodeInvalidRequest,
	} {
		_, err := ParseObjectsRequest([]byte(body))
		wantCode(t, body, err, code)
	}
}

// mapBuckets is an objects.BucketStore over a map, and Deps.Bucket.
type mapBuckets map[string]*meta.Bucket

func (m mapBuckets) CreateBucket(_ context.Context, b objects.Bucket) error { return nil }
func (m mapBuckets) Bucket(_ context.Context, name string) (*objects.Bucket, error) {
	r, ok := m[name]
	if !ok {
		return nil, objects.ErrNoSuchBucket
	}
	return &objects.Bucket{Name: r.Name, Owner: r.Owner}, nil
}
func (m mapBuckets) Buckets(context.Context) ([]objects.Bucket, error)   { return nil, nil }
func (m mapBuckets) DeleteBucket(context.Context, string) error          { return nil }
func (m mapBuckets) SetVersioning(context.Context, string, string) error { return nil }
func (m mapBuckets) record(_ context.Context, name string) (*meta.Bucket, error) {
	r, ok := m[name]
	if !ok {
		return nil, errs.NotFound("bucket", name)
	}
	return r, nil
}

var (
	alice = volume.Caller{Name: "alice", ID: "u-alice"}
	bob   = volume.Caller{Name: "bob", ID: "u-bob"}
	root  = volume.Caller{Name: "admin", ID: "u-admin", Admin: true}
)

// call runs handler h as caller c and decodes the answer into out;
// it returns the status and the error code ("" on success).
func call(t *testing.T, s *Server, h handler, c volume.Caller, method, target, body string, out any) (int, string) {
	t.Helper()
	w := httptest.NewRecorder()
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	if err := h(w, r, c); err != nil {
		status := s.writeError(w, err)
		e, _ := errs.As(err)
		if e == nil {
			t.Fatalf("untyped error %v", err)
		}
		return status, e.Code
	}
	data, _ := io.ReadAll(w.Result().Body)
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, target, err, data)
		}
	}
	return w.Code, ""
}

func TestObjectHandlers(t *testing.T) {
	dir := t.TempDir()
	bs := mapBuckets{
		"alice-b": {Name: "alice-b", OwnerID: "u-alice", Owner: "alice"},
		// A user deleted and created again under the name alice gets a
		// new id: the old bucket is not hers.
		"old-alice": {Name: "old-alice", OwnerID: "u-alice-before", Owner: "alice"},
	}
	be, err := objects.New(objects.Config{Root: filepath.Join(dir, "buckets"), Work: filepath.Join(dir, "work"), Buckets: bs})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Shutdown()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, b := range []string{"alice-b", "old-alice"} {
		os.MkdirAll(filepath.Join(be.Root(), b), 0o755)
	}
	file := filepath.Join(be.Root(), "alice-b", "d", "f.txt")
	os.MkdirAll(filepath.Dir(file), 0o755)
	os.WriteFile(file, []byte("hello"), 0o644)

	none := New(Deps{Log: log})
	if st, code := call(t, none, none.objectsRoot, alice, "GET", "/v1/objects/root", "", nil); st != 503 || code != CodeObjectStoreUnavailable {
		t.Fatalf("without an object store: %d %s", st, code)
	}

	s := New(Deps{Log: log, Objects: be, Bucket: bs.record})
	var rt ObjectsRoot
	if st, _ := call(t, s, s.objectsRoot, alice, "GET", "/v1/objects/root", "", &rt); st != 200 || rt.Root != be.Root() || rt.Metadata == "" {
		t.Fatalf("root: %d %+v", st, rt)
	}

	// Path: owner and admin; others refused; errors.
	var op ObjectPath
	for _, c := range []volume.Caller{alice, root} {
		if st, _ := call(t, s, s.objectPath, c, "GET", "/v1/objects/path?bucket=alice-b&key=d/f.txt", "", &op); st != 200 ||
			op.Path != file || !op.Exists || op.Exported {
			t.Fatalf("path as %s: %d %+v", c.Name, st, op)
		}
	}
	for _, c := range []struct {
		caller volume.Caller
		query  string
		status int
		code   string
	}{
		{bob, "bucket=alice-b&key=d/f.txt", 403, CodeAccessDenied},
		{alice, "bucket=old-alice&key=x", 403, CodeAccessDenied},
		{alice, "bucket=nope&key=x", 404, objects.CodeNoSuchBucket},
		{alice, "bucket=Bad_Name&key=x", 400, objects.CodeInvalidBucketName},
		{alice, "key=x", 400, errs.CodeInvalidRequest},
		{alice, "bucket=alice-b&key=a//b", 400, objects.CodeInvalidKey},
		{alice, "bucket=alice-b", 400, objects.CodeInvalidKey},
	} {
		if st, code := call(t, s, s.objectPath, c.caller, "GET", "/v1/objects/path?"+c.query, "", nil); st != c.status || code != c.code {
			t.Errorf("path %s as %s: %d %s, want %d %s", c.query, c.caller.Name, st, code, c.status, c.code)
		}
	}

	// Export: one result per object, errors per object.
	var res []ObjectResult
	body := `{"objects":[{"bucket":"alice-b","key":"d/f.txt"},{"bucket":"old-alice","key":"x"},` +
		`{"bucket":"alice-b","key":"missing"},{"bucket":"alice-b","key":"../x"}]}`
	if st, _ := call(t, s, s.exportObjects(), alice, "POST", "/v1/objects/export", body, &res); st != 200 || len(res) != 4 {
		t.Fatalf("export: %d %+v", st, res)
	}
	sum := md5.Sum([]byte("hello"))
	if r := res[0]; r.Error != nil || r.ETag != hex.EncodeToString(sum[:]) || r.Size == nil || *r.Size != 5 || r.Path != file || r.Mtime == nil {
		t.Fatalf("export result: %+v", r)
	}
	for i, code := range []string{"", CodeAccessDenied, objects.CodeNoSuchFile, objects.CodeInvalidKey} {
		if i == 0 {
			continue
		}
		if res[i].Error == nil || res[i].Error.Code != code || res[i].Error.Message == "" || res[i].Size != nil {
			t.Errorf("result %d: %+v, want error %s", i, res[i], code)
		}
	}
	if st, code := call(t, s, s.exportObjects(), alice, "POST", "/v1/objects/export", `{"objects":[]}`, nil); st != 400 || code != errs.CodeInvalidRequest {
		t.Fatalf("empty export: %d %s", st, code)
	}
	if st, _ := call(t, s, s.objectPath, alice, "GET", "/v1/objects/path?bucket=alice-b&key=d/f.txt", "", &op); st != 200 || !op.Exported {
		t.Fatalf("path after export: %+v", op)
	}

	// Verify: clean, then modified.
	var vr VerifyResult
	if st, _ := call(t, s, s.verifyObjects, alice, "GET", "/v1/objects/verify?bucket=alice-b&content=true", "", &vr); st != 200 ||
		vr.Objects != 1 || vr.Damaged != 0 || vr.Problems == nil || len(vr.Problems) != 0 {
		t.Fatalf("verify: %d %+v", st, vr)
	}
	os.WriteFile(file, []byte("hello!"), 0o644)
	if st, _ := call(t, s, s.verifyObjects, root, "GET", "/v1/objects/verify?bucket=alice-b", "", &vr); st != 200 ||
		vr.Damaged != 1 || len(vr.Problems) != 1 || vr.Problems[0] != (VerifyProblem{Key: "d/f.txt", Problem: objects.ProblemModified, Detail: vr.Problems[0].Detail}) {
		t.Fatalf("verify after a change: %d %+v", st, vr)
	}
	for q, want := range map[string]string{
		"bucket=alice-b&content=maybe": errs.CodeInvalidRequest,
		"content=true":                 errs.CodeInvalidRequest,
		"bucket=nope":                  objects.CodeNoSuchBucket,
	} {
		if _, code := call(t, s, s.verifyObjects, alice, "GET", "/v1/objects/verify?"+q, "", nil); code != want {
			t.Errorf("verify %s: %s, want %s", q, code, want)
		}
	}
	if st, code := call(t, s, s.verifyObjects, bob, "GET", "/v1/objects/verify?bucket=alice-b", "", nil); st != 403 || code != CodeAccessDenied {
		t.Fatalf("bob verifies alice's bucket: %d %s", st, code)
	}

	// Unexport.
	res = nil
	if st, _ := call(t, s, s.unexportObjects(), bob, "POST", "/v1/objects/unexport", `{"objects":[{"bucket":"alice-b","key":"d/f.txt"}]}`, &res); st != 200 ||
		len(res) != 1 || res[0].Error == nil || res[0].Error.Code != CodeAccessDenied {
		t.Fatalf("bob unexports: %d %+v", st, res)
	}
	res = nil
	if st, _ := call(t, s, s.unexportObjects(), alice, "POST", "/v1/objects/unexport", `{"objects":[{"bucket":"alice-b","key":"d/f.txt"}]}`, &res); st != 200 ||
		len(res) != 1 || res[0].Error != nil || res[0].ETag != hex.EncodeToString(sum[:]) {
		t.Fatalf("unexport: %d %+v", st, res)
	}
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("unexport removed the file: %v", err)
	}
}

// The routes are registered: unauthenticated requests reach the auth
// check, not 404.
func TestObjectRoutes(t *testing.T) {
	s := New(Deps{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	for _, rt := range []string{"GET /v1/objects/root", "GET /v1/objects/path", "POST /v1/objects/export",
		"POST /v1/objects/unexport", "GET /v1/objects/verify"} {
		method, p, _ := strings.Cut(rt, " ")
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest(method, p, nil))
		if w.Code != http.StatusUnauthorized {
			t.Errorf("%s: %d %s", rt, w.Code, w.Body)
		}
	}
}

// A method a path does not take is 405 with Allow listing the ones it
// does — HEAD wherever GET is (net/http serves HEAD through GET's route).
func TestMethodNotAllowedAllow(t *testing.T) {
	s := New(Deps{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	for target, want := range map[string]string{
		"PUT /v1/objects/verify":   "GET, HEAD",
		"GET /v1/objects/export":   "POST",
		"PATCH /v1/objects/export": "POST",
	} {
		method, p, _ := strings.Cut(target, " ")
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest(method, p, nil))
		if w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != want {
			t.Errorf("%s: %d, Allow %q, want 405 and %q", target, w.Code, w.Header().Get("Allow"), want)
		}
	}
}
