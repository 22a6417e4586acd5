package api

import (
	"context"
	"crypto/tls"
	_ "embed"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/basalt-storage/basalt/internal/cluster"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/metrics"
	"github.com/basalt-storage/basalt/internal/objects"
	"github.com/basalt-storage/basalt/internal/user"
	"github.com/basalt-storage/basalt/internal/volume"
)

// Deps are the services the API fronts.
type Deps struct {
	Volumes *volume.Service
	Users   *user.Service
	// Status reports this node's health; Healthy reports readiness quickly.
	Status  func(ctx context.Context) Status
	Healthy func(ctx context.Context) error
	// Defrag runs the metadata defrag path.
	Defrag func(ctx context.Context) error
	// NBDURI renders the URI a client uses for an attachment: on the node
	// that serves it (a rw attachment: its volume's write-lease holder).
	NBDURI func(ctx context.Context, a *meta.Attachment) string
	Log    *slog.Logger
	// Objects is the node's object store and Bucket reads a bucket's
	// record (owner id) from the metadata store, for the /v1/objects
	// endpoints (objects.go); without both they answer 503.
	Objects *objects.Backend
	Bucket  func(ctx context.Context, name string) (*meta.Bucket, error)
	// Cluster is membership (nodes.go); CACert the cluster CA (PEM).
	Cluster *cluster.Service
	CACert  []byte
	// Metrics, if not nil, receives the API's request counts (metrics.go).
	Metrics *metrics.Registry
}

// Server is the control API of one node.
type Server struct {
	d   Deps
	mux *http.ServeMux
	// origins refuses state-changing requests a browser sends from
	// another site (dispatch).
	origins *http.CrossOriginProtection
	ready   atomic.Bool
	metrics *apiMetrics // nil: not counted
}

// New builds the API's handler tree.
func New(d Deps) *Server {
	s := &Server{d: d, mux: http.NewServeMux(), origins: http.NewCrossOriginProtection()}
	if d.Metrics != nil {
		s.metrics = newAPIMetrics(d.Metrics)
	}
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.mux.HandleFunc("GET /v1/openapi.json", s.openapi)
	s.mux.HandleFunc("GET /v1/cluster/ca", s.clusterCA)
	s.mux.HandleFunc("POST /v1/nodes/join", s.join)
	s.mux.HandleFunc("/", s.noRoute)
	s.route("GET /v1/status", s.status)
	s.route("POST /v1/meta/defrag", s.admin(s.defrag))
	s.route("GET /v1/nodes", s.admin(s.listNodes))
	s.route("DELETE /v1/nodes/{name}", s.admin(s.removeNode))
	s.route("POST /v1/nodes/join-token", s.admin(s.joinToken))
	s.route("POST /v1/nodes/join-token/revoke", s.admin(s.revokeJoinToken))
	s.route("POST /v1/users", s.admin(s.createUser))
	s.route("GET /v1/users", s.admin(s.listUsers))
	s.route("GET /v1/users/{name}", s.showUser)
	s.route("DELETE /v1/users/{name}", s.admin(s.deleteUser))
	s.route("POST /v1/users/{name}/credentials", s.admin(s.userCredentials))
	s.route("POST /v1/volumes", s.createVolume)
	s.route("GET /v1/volumes", s.listVolumes, pageParams...)
	s.route("GET /v1/volumes/{id}", s.showVolume)
	s.route("DELETE /v1/volumes/{id}", s.deleteVolume)
	s.route("POST /v1/volumes/{id}/extend", s.extendVolume)
	s.route("POST /v1/volumes/{id}/flatten", s.volumeJob(meta.JobFlatten))
	s.route("POST /v1/volumes/{id}/repair", s.volumeJob(meta.JobRepair))
	s.route("POST /v1/volumes/{id}/scrub", s.volumeJob(meta.JobScrub))
	s.route("GET /v1/types", s.listTypes)
	s.route("GET /v1/types/{name}", s.showType)
	s.route("POST /v1/types", s.admin(s.createType))
	s.route("DELETE /v1/types/{name}", s.admin(s.deleteType))
	s.route("POST /v1/snapshots", s.createSnapshot)
	s.route("GET /v1/snapshots", s.listSnapshots, append([]string{"volume"}, pageParams...)...)
	s.route("GET /v1/snapshots/{id}", s.showSnapshot)
	s.route("DELETE /v1/snapshots/{id}", s.deleteSnapshot)
	s.route("POST /v1/snapshots/{id}/export", s.exportSnapshot)
	s.route("POST /v1/attachments", s.attach)
	s.route("GET /v1/attachments", s.listAttachments, append([]string{"volume"}, pageParams...)...)
	s.route("GET /v1/attachments/{id}", s.showAttachment)
	s.route("DELETE /v1/attachments/{id}", s.detach)
	s.route("GET /v1/objects/root", s.objectsRoot)
	s.route("GET /v1/objects/path", s.objectPath, "bucket", "key")
	s.route("POST /v1/objects/export", s.exportObjects())
	s.route("POST /v1/objects/unexport", s.unexportObjects())
	s.route("GET /v1/objects/verify", s.verifyObjects, "bucket", "content", "all")
	return s
}

// SetReady flips /healthz to 200 once the node serves.
func (s *Server) SetReady(ok bool) { s.ready.Store(ok) }

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := http.HandlerFunc(s.dispatch)
	if s.metrics != nil {
		s.metrics.serve(w, r, h)
		return
	}
	h(w, r)
}

// maxPath bounds a request's (escaped) path. The longest route with the
// longest name or id is a tenth of it; a longer path names nothing.
const maxPath = 1024

// dispatch routes r, answering 404 at once for a path no route can take:
// one too long, or one with empty, "." or ".." segments. The mux would
// redirect the latter (307, with an HTML body) to the cleaned path, which
// is another route: GET /v1/volumes/. led to the volume list, and POST
// /v1/volumes/./extend to a volume named "extend". And a 200 KB id went
// into the service's lookups, its error message and the request's log
// line.
func (s *Server) dispatch(w http.ResponseWriter, r *http.Request) {
	p := r.URL.EscapedPath()
	if len(p) > maxPath {
		s.writeError(w, errs.New(errs.KindNotFound, errs.CodeNotFound, "no route has a path of %d bytes (at most %d)", len(p), maxPath))
		return
	}
	// A browser holding a user's client certificate would attach it to a
	// form another site makes it POST here (the body is read as JSON
	// whatever its Content-Type): refuse what a browser marks cross-site.
	// Clients that are not browsers send neither Sec-Fetch-Site nor Origin.
	if err := s.origins.Check(r); err != nil {
		s.writeError(w, errs.New(errs.KindForbidden, errs.CodeCrossOrigin,
			"%s %s came from a page of another site (%v); the control API takes no state-changing request across origins", r.Method, p, err))
		return
	}
	// CONNECT's target is no path; the mux does not clean it either.
	if r.Method != http.MethodConnect && (p == "" || p[0] != '/' || p != cleanPath(p)) {
		s.writeError(w, errs.New(errs.KindNotFound, errs.CodeNotFound, "no route for %s %q: paths have no empty, \".\" or \"..\" segments (a name . or .. goes escaped, %%2E)", r.Method, p))
		return
	}
	s.mux.ServeHTTP(w, r)
}

// cleanPath is p as the mux routes it (net/http's cleanPath): path.Clean,
// keeping a trailing slash.
func cleanPath(p string) string {
	np := path.Clean(p)
	if strings.HasSuffix(p, "/") && np != "/" {
		np += "/"
	}
	return np
}

// TLSConfig is the API listener's TLS: client certificates are requested but
// verified by the handler (authed), not by the handshake, so that a missing,
// expired, foreign or revoked certificate gets a precise JSON error instead
// of a failed handshake, and /healthz works without one.
func TLSConfig(cert tls.Certificate) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequestClientCert,
		MinVersion:   tls.VersionTLS12,
	}
}

type handler func(w http.ResponseWriter, r *http.Request, c volume.Caller) error

// route serves pattern with h behind authentication. query names the query
// parameters the route takes, if any (see checkQuery).
func (s *Server) route(pattern string, h handler, query ...string) {
	if len(query) > 0 {
		h = checkQuery(h, query)
	}
	s.mux.HandleFunc(pattern, s.authed(h))
}

// checkQuery refuses, with InvalidRequest, a query string that does not
// parse, a parameter the route does not take and one given twice, as
// decode refuses such bodies. url.Values.Get would drop the malformed
// pair, ignore the unknown name and take the first value: a misspelt or
// doubled filter (?volumes=db) answered the unfiltered list, every
// attachment's secret included.
func checkQuery(h handler, names []string) handler {
	return func(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
		q, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			return errs.Invalid(errs.CodeInvalidRequest, "malformed query string: %v", err)
		}
		for name, vs := range q {
			if !slices.Contains(names, name) {
				return errs.Invalid(errs.CodeInvalidRequest, "unknown query parameter %q: %s takes %s", name, r.URL.Path, strings.Join(names, ", "))
			}
			if len(vs) > 1 {
				return errs.Invalid(errs.CodeInvalidRequest, "query parameter %s is given %d times; give it once", name, len(vs))
			}
		}
		return h(w, r, c)
	}
}

// authed authenticates the caller by client certificate, runs h and renders
// its error, if any.
func (s *Server) authed(h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		var c volume.Caller
		ctx, ri := meta.WithReadInfo(r.Context())
		w = &readMarker{ResponseWriter: w, ri: ri}
		err := func() error {
			if r.TLS == nil {
				return errs.New(errs.KindUnauthenticated, errs.CodeCertificateRequired, "the control API requires TLS with a client certificate")
			}
			// The caller's wish for a stale read is for what it asks,
			// not for who it is: a user record is looked up in the store
			// only when this node's mirror cannot answer (a moment after
			// a change), and then as fresh as the quorum allows.
			var err error
			if c, err = s.d.Users.Authenticate(ctx, r.TLS.PeerCertificates); err != nil {
				return err
			}
			if r.Method == http.MethodGet && strings.EqualFold(r.Header.Get(HeaderConsistency), "stale") {
				ctx = meta.Stale(ctx)
			}
			r = r.WithContext(ctx)
			return h(w, r, c)
		}()
		if err != nil {
			status := s.writeError(w, err)
			s.d.Log.Info("api", "method", r.Method, "path", r.URL.Path, "user", c.Name, "status", status,
				"code", codeOf(err), "took", time.Since(start).String())
			return
		}
		s.d.Log.Debug("api", "method", r.Method, "path", r.URL.Path, "user", c.Name, "took", time.Since(start).String())
	}
}

// Read consistency headers. A GET with "Basalt-Consistency: stale" is
// answered from the receiving node's copy of the metadata, with no round
// trip to the leader; any answer that used that copy (asked for, or
// because the metadata cluster has no quorum) carries "Basalt-Read: local"
// — it may miss the latest writes. Without it, an answer reflects every
// write acknowledged before the request, through any node.
const (
	HeaderConsistency = "Basalt-Consistency"
	HeaderRead        = "Basalt-Read"
)

// readMarker adds Basalt-Read: local to a response whose reads used the
// local copy.
type readMarker struct {
	http.ResponseWriter
	ri      *meta.ReadInfo
	written bool
}

func (m *readMarker) WriteHeader(code int) {
	if !m.written && m.ri.Local {
		m.Header().Set(HeaderRead, "local")
	}
	m.written = true
	m.ResponseWriter.WriteHeader(code)
}

func (m *readMarker) Write(p []byte) (int, error) {
	if !m.written {
		m.WriteHeader(http.StatusOK)
	}
	return m.ResponseWriter.Write(p)
}

func (s *Server) admin(h handler) handler {
	return func(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
		if !c.Admin {
			return errs.New(errs.KindForbidden, errs.CodeAdminRequired, "only an administrator may %s %s", r.Method, r.URL.Path)
		}
		return h(w, r, c)
	}
}

func codeOf(err error) string {
	if e, ok := errs.Public(err); ok {
		return e.Code
	}
	return errs.CodeInternal
}

// writeError renders err; non-typed errors become 500 and are logged in full.
func (s *Server) writeError(w http.ResponseWriter, err error) int {
	e, ok := errs.Public(err)
	if !ok {
		s.d.Log.Error("internal error", "err", err)
		e = errs.New(errs.KindInternal, errs.CodeInternal, "internal error: %v", err)
	}
	status := e.Kind.Status()
	writeJSON(w, status, ErrorBody{Error: ErrorDetail{Code: e.Code, Message: e.Message}})
	return status
}

// writeJSON answers status with v, encoded before anything is sent: a
// value that does not encode (a NaN) is a 500, not a 200 with no body.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		status = http.StatusInternalServerError
		body, _ = json.MarshalIndent(ErrorBody{Error: ErrorDetail{Code: errs.CodeInternal,
			Message: fmt.Sprintf("the answer does not encode as JSON: %v", err)}}, "", "  ")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	if !s.ready.Load() {
		s.writeError(w, errs.New(errs.KindUnavailable, errs.CodeNotReady, "node is starting or stopping"))
		return
	}
	if err := s.d.Healthy(r.Context()); err != nil {
		s.writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// noRoute answers requests no route matches: 405 when the path exists
// with other methods, else 404. Routes are public (openapi.json), so this
// needs no authentication.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request) {
	var allow []string
	// HEAD is served wherever GET is (net/http routes it to GET's handler).
	for _, m := range []string{"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.mux.Handler(probe); pattern != "" && pattern != "/" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		s.writeError(w, errs.New(errs.KindMethodNotAllowed, errs.CodeMethodNotAllowed, "%s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(allow, ", ")))
		return
	}
	s.writeError(w, errs.NotFound("route", r.Method+" "+r.URL.Path))
}

//go:embed openapi.json
var openapiDoc []byte

func (s *Server) openapi(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Write(openapiDoc)
}

func (s *Server) status(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	writeJSON(w, http.StatusOK, s.d.Status(r.Context()))
	return nil
}

func (s *Server) defrag(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	if err := s.d.Defrag(r.Context()); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "defragmented"})
	return nil
}
