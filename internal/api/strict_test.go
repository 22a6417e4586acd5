package api

// Review tests: the API through its real routes and services (a shared
// embedded etcd member, package metatest), checked against the contract
// of docs/api.md and openapi.json.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/cluster"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/meta/metatest"
	"github.com/basalt-storage/basalt/internal/objects"
	"github.com/basalt-storage/basalt/internal/store"
	"github.com/basalt-storage/basalt/internal/user"
	"github.com/basalt-storage/basalt/internal/volume"
)

func TestMain(m *testing.M) { metatest.Main(m) }

var uniqN atomic.Int64

// uniq makes a name unique in the shared metadata store.
func uniq(prefix string) string {
	return prefix + strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + strconv.FormatInt(uniqN.Add(1), 36)
}

// nodeEnv is one node's API over the shared metadata store: a volume
// service of its own, the user and cluster services, and no object store
// unless objs is given.
type nodeEnv struct {
	t    *testing.T
	s    *Server
	us   *user.Service
	meta *meta.Store
	node string
	// lastUser is the name of the user made last.
	lastUser string
}

func newNodeEnv(t *testing.T, objs volume.Objects) *nodeEnv {
	t.Helper()
	return newNodeEnvWith(t, volume.Config{Objects: objs})
}

// newNodeEnvWith is newNodeEnv with the volume service's configuration
// (its Node and ImageGrace are set here).
func newNodeEnvWith(t *testing.T, cfg volume.Config) *nodeEnv {
	t.Helper()
	e := metatest.Shared(t)
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	node := uniq("node")
	cfg.Node, cfg.ImageGrace = node, -1
	vs := volume.New(e.Meta, st, cfg, log)
	t.Cleanup(vs.Stop)
	if err := vs.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	us := user.New(e.Meta, e.CA)
	s := New(Deps{Volumes: vs, Users: us, Log: log, Cluster: cluster.New(e.Meta, e.CA, node, log),
		NBDURI: func(_ context.Context, a *meta.Attachment) string { return "nbd://127.0.0.1:10809/" + a.Export }})
	s.SetReady(true)
	return &nodeEnv{t: t, s: s, us: us, meta: e.Meta, node: node}
}

// user creates a user and returns its name and certificate chain.
func (e *nodeEnv) user(prefix string, admin bool) (string, []*x509.Certificate) {
	e.t.Helper()
	u, id, err := e.us.Create(context.Background(), user.Spec{Name: uniq(prefix), Admin: admin})
	if err != nil {
		e.t.Fatal(err)
	}
	b, _ := pem.Decode(id.CertPEM)
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		e.t.Fatal(err)
	}
	e.lastUser = u.Name
	return u.Name, []*x509.Certificate{c}
}

// do sends a request over "TLS" with the certificate chain who; it returns
// the status, the error code ("" on success) and the body.
func (e *nodeEnv) do(who []*x509.Certificate, method, target, body string) (int, string, string) {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	r.TLS = &tls.ConnectionState{PeerCertificates: who}
	w := httptest.NewRecorder()
	e.s.ServeHTTP(w, r)
	var eb ErrorBody
	if w.Code >= 300 {
		if err := json.Unmarshal(w.Body.Bytes(), &eb); err != nil || eb.Error.Code == "" || eb.Error.Message == "" {
			e.t.Fatalf("%s %s: HTTP %d without an error body: %q", method, target, w.Code, w.Body)
		}
	}
	return w.Code, eb.Error.Code, w.Body.String()
}

// TestJoinTokenZeroTTL: a join token's ttl must be between 1m and
// 720h. An explicit "0s" is not "no ttl given": it used to be read as the
// default and answered with a token valid for 24 hours (and `basalt node
// join-token --ttl 0` printed one and exited 0).
func TestJoinTokenZeroTTL(t *testing.T) {
	e := newNodeEnv(t, nil)
	_, admin := e.user("root", true)
	for _, body := range []string{`{"ttl":"0s"}`, `{"ttl":"0"}`, `{"ttl":"0h0m"}`} {
		if st, code, out := e.do(admin, "POST", "/v1/nodes/join-token", body); st != 400 || code != "InvalidRequest" {
			t.Errorf("join-token %s: HTTP %d %s, want 400 InvalidRequest", body, st, out)
		}
	}
	// Not given: the default, as documented.
	for _, body := range []string{``, `{}`} {
		if st, _, out := e.do(admin, "POST", "/v1/nodes/join-token", body); st != 201 {
			t.Errorf("join-token %q: HTTP %d %s, want 201", body, st, out)
		}
	}
}

// TestQueryParameters: a list filter given twice, misspelt or not
// parseable used to be ignored, silently: GET /v1/attachments?volumes=db
// (a typo) answered every attachment of the caller, secrets included, and
// ?volume=a&volume=b only a's. Ambiguous or unknown query parameters are
// refused like unknown body fields.
func TestQueryParameters(t *testing.T) {
	e := newNodeEnv(t, nil)
	_, alice := e.user("alice", false)
	aliceRec, err := e.meta.User(context.Background(), e.lastUser)
	if err != nil {
		t.Fatal(err)
	}
	// An object store with alice's bucket rev-b1 holding k.
	dir := t.TempDir()
	bs := mapBuckets{"rev-b1": {Name: "rev-b1", OwnerID: aliceRec.ID, Owner: aliceRec.Name}}
	be, err := objects.New(objects.Config{Root: filepath.Join(dir, "buckets"), Work: filepath.Join(dir, "work"), Buckets: bs})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Shutdown()
	os.MkdirAll(filepath.Join(be.Root(), "rev-b1"), 0o755)
	os.WriteFile(filepath.Join(be.Root(), "rev-b1", "k"), []byte("hello"), 0o644)
	e.s.d.Objects, e.s.d.Bucket = be, bs.record
	for _, body := range []string{`{"size":"1GiB","name":"a"}`, `{"size":"1GiB","name":"b"}`} {
		if st, _, out := e.do(alice, "POST", "/v1/volumes", body); st != 201 {
			t.Fatalf("create: %d %s", st, out)
		}
	}
	if st, _, out := e.do(alice, "POST", "/v1/attachments", `{"volume":"a","host":"h1"}`); st != 201 {
		t.Fatalf("attach: %d %s", st, out)
	}
	for _, target := range []string{
		"/v1/attachments?volume=b&volume=a",
		"/v1/attachments?volumes=b",
		"/v1/attachments?volume=b&x=1",
		"/v1/attachments?volume=%zz",
		"/v1/snapshots?volume=a&volume=b",
		"/v1/snapshots?vol=a",
		"/v1/objects/verify?bucket=rev-b1&bucket=rev-b2",
		"/v1/objects/verify?bucket=rev-b1&content=true&content=false",
		"/v1/objects/path?bucket=rev-b1&key=k&key=j",
		"/v1/objects/path?bucket=rev-b1&key=k&version=1",
	} {
		if st, code, out := e.do(alice, "GET", target, ""); st != 400 || code != "InvalidRequest" {
			t.Errorf("GET %s: HTTP %d %.200s, want 400 InvalidRequest", target, st, out)
		}
	}
	// Well-formed filters still work.
	var as []Attachment
	st, _, out := e.do(alice, "GET", "/v1/attachments?volume=b", "")
	if err := json.Unmarshal([]byte(out), &as); st != 200 || err != nil || len(as) != 0 {
		t.Errorf("GET /v1/attachments?volume=b: %d %s", st, out)
	}
	for _, target := range []string{"/v1/snapshots?volume=a", "/v1/objects/verify?bucket=rev-b1&content=true",
		"/v1/objects/path?bucket=rev-b1&key=k"} {
		if st, _, out := e.do(alice, "GET", target, ""); st != 200 {
			t.Errorf("GET %s: %d %s", target, st, out)
		}
	}
}

// openapiOp returns the operation of openapi.json for method and path
// pattern.
func openapiOp(t *testing.T, method, pattern string) map[string]any {
	t.Helper()
	var doc struct {
		Paths map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(openapiDoc, &doc); err != nil {
		t.Fatal(err)
	}
	op, ok := doc.Paths[pattern][strings.ToLower(method)].(map[string]any)
	if !ok {
		t.Fatalf("openapi.json has no %s %s", method, pattern)
	}
	return op
}

// stubObjects is an object store that holds no object: enough for the
// volume service to get as far as checking the bucket's owner.
type stubObjects struct{}

func (stubObjects) PutImage(context.Context, objects.ImageInput) (objects.ObjectInfo, error) {
	return objects.ObjectInfo{}, os.ErrNotExist
}
func (stubObjects) OpenImage(context.Context, string, string) (*os.File, objects.ObjectInfo, error) {
	return nil, objects.ObjectInfo{}, os.ErrNotExist
}

// TestOpenAPIStatuses: every status the handlers demonstrably answer
// is declared for the operation in openapi.json, so that a client
// generated from it knows the error. The node endpoints declared no 400,
// 403 or 409 although they are admin-only and validate their input, and
// POST /v1/volumes no 403 (from_object in another user's bucket) and
// none of from_object's error codes.
func TestOpenAPIStatuses(t *testing.T) {
	e := newNodeEnv(t, stubObjects{})
	alice, _ := e.user("alice", false)
	_, bob := e.user("bob", false)
	_, admin := e.user("root", true)
	bucket := uniq("rb")
	if err := (objects.MetaBuckets{Meta: e.meta}).CreateBucket(context.Background(), objects.Bucket{Name: bucket, Owner: alice}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		who             []*x509.Certificate
		method, pattern string
		target, body    string
		status          int
	}{
		{bob, "GET", "/v1/nodes", "/v1/nodes", "", 403},
		{bob, "DELETE", "/v1/nodes/{name}", "/v1/nodes/x", "", 403},
		{admin, "DELETE", "/v1/nodes/{name}", "/v1/nodes/" + e.node, "", 409},
		{bob, "POST", "/v1/nodes/join-token", "/v1/nodes/join-token", "", 403},
		{admin, "POST", "/v1/nodes/join-token", "/v1/nodes/join-token", `{"ttl":"forever"}`, 400},
		{bob, "POST", "/v1/nodes/join", "/v1/nodes/join", `{}`, 403},
		{admin, "POST", "/v1/nodes/join", "/v1/nodes/join", `{"name":`, 400},
		{bob, "POST", "/v1/volumes", "/v1/volumes", `{"from_object":"s3://` + bucket + `/img.raw"}`, 403},
		{bob, "POST", "/v1/volumes", "/v1/volumes", `{"from_object":"s3://` + uniq("nob") + `/img.raw"}`, 404},
		{bob, "POST", "/v1/volumes", "/v1/volumes", `{"from_object":"s3://` + bucket + `/"}`, 400},
		{bob, "GET", "/v1/snapshots", "/v1/snapshots?volume=a&volume=b", "", 400},
		{bob, "GET", "/v1/attachments", "/v1/attachments?volume=a&volume=b", "", 400},
	}
	for _, c := range cases {
		st, code, out := e.do(c.who, c.method, c.target, c.body)
		if st != c.status {
			t.Errorf("%s %s %s: HTTP %d %s, want %d", c.method, c.target, c.body, st, out, c.status)
			continue
		}
		op := openapiOp(t, c.method, c.pattern)
		responses, _ := op["responses"].(map[string]any)
		if _, ok := responses[strconv.Itoa(st)]; !ok {
			t.Errorf("%s %s answers %d %s, which openapi.json does not declare for it", c.method, c.pattern, st, code)
		}
		codes, _ := op["x-error-codes"].([]any)
		if !slices.Contains(codes, any(code)) {
			t.Errorf("%s %s answers %s, which is not among its x-error-codes %v", c.method, c.pattern, code, codes)
		}
	}
}

// jsonFields lists the JSON names of a struct's fields (embedded structs
// flattened) and those that are always present (no omitempty).
func jsonFields(t reflect.Type) (all, always []string) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if f.Anonymous && tag == "" {
			a, b := jsonFields(f.Type)
			all, always = append(all, a...), append(always, b...)
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		all = append(all, name)
		if !strings.Contains(opts, "omitempty") {
			always = append(always, name)
		}
	}
	return all, always
}

type openapiSchema struct {
	Properties           map[string]json.RawMessage `json:"properties"`
	Required             []string                   `json:"required"`
	AdditionalProperties *bool                      `json:"additionalProperties"`
}

func openapiSchemas(t *testing.T) map[string]json.RawMessage {
	t.Helper()
	var doc struct {
		Components struct {
			Schemas map[string]json.RawMessage `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openapiDoc, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Components.Schemas
}

// TestOpenAPISchemas: each schema of openapi.json has exactly the
// fields of the Go type the server reads or writes. Identity lacked
// s3_endpoint, s3_region and s3_ca_bundle (which `basalt user create`
// writes into s3.env), LayerNode the image of a cow child, and JoinRequest,
// decoded strictly like every body, did not say so.
func TestOpenAPISchemas(t *testing.T) {
	schemas := openapiSchemas(t)
	types := map[string]any{
		"ErrorDetail": ErrorDetail{}, "ErrorBody": ErrorBody{},
		"CreateUserRequest": CreateUserRequest{}, "User": User{}, "Identity": Identity{},
		"CreateUserResponse": CreateUserResponse{}, "CreateVolumeRequest": CreateVolumeRequest{},
		"CredentialsResponse": CredentialsResponse{}, "Certificate": Certificate{},
		"ExtendVolumeRequest": ExtendVolumeRequest{}, "CreateSnapshotRequest": CreateSnapshotRequest{},
		"Progress": Progress{}, "JobResult": JobResult{}, "ScrubReport": block.ScrubReport{},
		"LayerSpec": block.Spec{}, "LayerNode": block.Node{}, "VolumeType": VolumeType{},
		"CreateVolumeTypeRequest": CreateVolumeTypeRequest{}, "AttachRequest": AttachRequest{},
		"Attachment": Attachment{}, "Volume": Volume{}, "Snapshot": Snapshot{}, "NodeStatus": NodeStatus{},
		"MetadataStatus": MetadataStatus{}, "StoreStatus": StoreStatus{}, "Status": Status{},
		"ObjectsRoot": ObjectsRoot{}, "ObjectPath": ObjectPath{}, "ObjectRef": ObjectRef{},
		"ObjectsRequest": ObjectsRequest{}, "ObjectResult": ObjectResult{}, "VerifyProblem": VerifyProblem{},
		"VerifyResult": VerifyResult{}, "CopyReport": volume.ExportReport{},
		"ExportSnapshotRequest": ExportSnapshotRequest{}, "Node": cluster.NodeInfo{},
		"JoinTokenRequest": JoinTokenRequest{}, "JoinToken": JoinToken{},
		"JoinRequest": cluster.JoinRequest{}, "JoinResponse": cluster.JoinResponse{},
	}
	// Request bodies: decode refuses unknown fields.
	strict := []string{"CreateUserRequest", "CreateVolumeRequest", "ExtendVolumeRequest", "CreateSnapshotRequest",
		"CreateVolumeTypeRequest", "AttachRequest", "ObjectsRequest", "ObjectRef", "ExportSnapshotRequest",
		"JoinTokenRequest", "JoinRequest", "LayerSpec"}
	for name, v := range types {
		raw, ok := schemas[name]
		if !ok {
			t.Errorf("openapi.json has no schema %s", name)
			continue
		}
		var s openapiSchema
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatal(err)
		}
		all, _ := jsonFields(reflect.TypeOf(v))
		for _, f := range all {
			if _, ok := s.Properties[f]; !ok {
				t.Errorf("schema %s lacks field %q of %T", name, f, v)
			}
		}
		for p := range s.Properties {
			if !slices.Contains(all, p) {
				t.Errorf("schema %s has field %q that %T does not", name, p, v)
			}
		}
		if slices.Contains(strict, name) && (s.AdditionalProperties == nil || *s.AdditionalProperties) {
			t.Errorf("schema %s: the server refuses unknown fields, but additionalProperties is not false", name)
		}
	}
}

// TestOpenAPIJobs: the job kinds a Volume's progress and last_job
// carry are those the volume service runs (a collapse runs after a
// snapshot is deleted, docs/api.md), and a repair's report
// ({"resynced_bytes"}, docs/api.md) is a report openapi.json knows.
func TestOpenAPIJobs(t *testing.T) {
	schemas := openapiSchemas(t)
	var progress, result struct {
		Properties struct {
			Job struct {
				Enum []string `json:"enum"`
			} `json:"job"`
			Report struct {
				OneOf []struct {
					Ref string `json:"$ref"`
				} `json:"oneOf"`
			} `json:"report"`
		} `json:"properties"`
	}
	json.Unmarshal(schemas["Progress"], &progress)
	json.Unmarshal(schemas["JobResult"], &result)
	volumeJobs := []string{meta.JobFlatten, meta.JobRepair, meta.JobScrub, meta.JobCollapse, meta.JobImport}
	for _, j := range append(volumeJobs, meta.JobExport) {
		if !slices.Contains(progress.Properties.Job.Enum, j) {
			t.Errorf("Progress.job: %q is not in the enum %v", j, progress.Properties.Job.Enum)
		}
		if !slices.Contains(result.Properties.Job.Enum, j) {
			t.Errorf("JobResult.job: %q is not in the enum %v", j, result.Properties.Job.Enum)
		}
	}
	repair, _ := jsonFields(reflect.TypeOf(block.RepairReport{}))
	found := false
	for _, o := range result.Properties.Report.OneOf {
		var s openapiSchema
		json.Unmarshal(schemas[strings.TrimPrefix(o.Ref, "#/components/schemas/")], &s)
		keys := make([]string, 0, len(s.Properties))
		for k := range s.Properties {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if slices.Equal(keys, repair) {
			found = true
		}
	}
	if !found {
		t.Errorf("JobResult.report: no schema with the fields of a repair's report %v", repair)
	}
}

// TestOpenAPISizeUnits: the Size string pattern accepts what the
// server accepts; 1 EiB (the maximum, as basalt itself prints it) was
// refused by the pattern for want of the E unit.
func TestOpenAPISizeUnits(t *testing.T) {
	var s struct {
		OneOf []struct {
			Type    string `json:"type"`
			Pattern string `json:"pattern"`
		} `json:"oneOf"`
	}
	json.Unmarshal(openapiSchemas(t)["Size"], &s)
	var re *regexp.Regexp
	for _, o := range s.OneOf {
		if o.Type == "string" {
			re = regexp.MustCompile(o.Pattern)
		}
	}
	if re == nil {
		t.Fatal("Size has no string form")
	}
	for _, in := range []string{"1EiB", "1E", "1eb", "1024PiB", "10G", "1.5GiB", "512", " 64 GiB "} {
		var sz Size
		if err := json.Unmarshal([]byte(strconv.Quote(in)), &sz); err != nil {
			t.Fatalf("%q: the server refuses it: %v", in, err)
		}
		if !re.MatchString(in) {
			t.Errorf("%q: accepted by the server, refused by the openapi.json pattern %s", in, re)
		}
	}
}

// TestRepeatedFields: a body that gives a field twice is ambiguous;
// encoding/json silently kept the last value, so {"size":"1GiB",
// "size":"1EiB"} created a 1 EiB volume. It is refused like an unknown
// field, at any depth; the same key in different objects is fine.
func TestRepeatedFields(t *testing.T) {
	parsers := map[string]func([]byte) error{
		"volume":   func(b []byte) error { _, err := ParseCreateVolume(b); return err },
		"extend":   func(b []byte) error { _, err := ParseExtendVolume(b); return err },
		"snapshot": func(b []byte) error { _, err := ParseCreateSnapshot(b); return err },
		"user":     func(b []byte) error { _, err := ParseCreateUser(b); return err },
		"attach":   func(b []byte) error { _, err := ParseAttach(b); return err },
		"type":     func(b []byte) error { _, err := ParseCreateVolumeType(b); return err },
		"objects":  func(b []byte) error { _, err := ParseObjectsRequest(b); return err },
	}
	for _, c := range []struct{ parser, body string }{
		{"volume", `{"size":"1GiB","size":"1EiB"}`},
		{"volume", `{"name":"a","size":"1GiB","name":"b"}`},
		{"extend", `{"size":"2GiB", "size" : "3GiB"}`},
		{"snapshot", `{"volume":"mine","volume":"other"}`},
		{"user", `{"name":"bob","admin":false,"admin":true}`},
		{"attach", `{"volume":"v","host":"h","mode":"ro","mode":"rw"}`},
		{"type", `{"name":"t","stack":{"type":"file","params":{"path":"a","path":"b"}}}`},
		{"type", `{"name":"t","stack":{"type":"cow","children":[{"type":"file","type":"cow"}]}}`},
		{"objects", `{"objects":[{"bucket":"bkt","key":"k","key":"j"}]}`},
		{"volume", `{"size":"1GiB","\u0073ize":"2GiB"}`}, // the same key, escaped
		{"volume", `{"size":"1GiB","Size":"2GiB"}`},      // encoding/json matches keys whatever their case
		{"attach", `{"volume":"v","host":"h","mode":"ro","Mode":"rw"}`},
		{"objects", `{"objects":[{"bucket":"bkt","key":"k","KEY":"j"}]}`},
	} {
		wantCode(t, c.body, parsers[c.parser]([]byte(c.body)), errs.CodeMalformedJSON)
	}
	for _, c := range []struct{ parser, body string }{
		{"type", `{"name":"t","stack":{"type":"cow","children":[{"type":"file","params":{"path":"a"}},{"type":"file","params":{"path":"b"}}]}}`},
		{"objects", `{"objects":[{"bucket":"bkt","key":"k"},{"bucket":"bkt","key":"k"}]}`},
		{"type", `{"name":"t","description":"name name","stack":{"name":"x","type":"file","params":{"type":"y"}}}`},
	} {
		if err := parsers[c.parser]([]byte(c.body)); err != nil && errs.IsCode(err, errs.CodeMalformedJSON) {
			t.Errorf("%s: %v", c.body, err)
		}
	}
}
