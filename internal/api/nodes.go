package api

// The node endpoints (/v1/nodes, /v1/cluster/ca): membership, served by
// package cluster. Joining is the one call authenticated either by an
// admin certificate or by a join token (the joining node has no
// certificate yet); the cluster CA is public, so that a node holding a
// token can authenticate the cluster first.

import (
	"bytes"
	"net/http"
	"strings"
	"time"

	"github.com/basalt-storage/basalt/internal/cluster"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/volume"
)

// JoinTokenRequest is POST /v1/nodes/join-token.
type JoinTokenRequest struct {
	// TTL is how long the token is valid, e.g. "1h" (default 24h).
	TTL string `json:"ttl,omitempty"`
}

// RevokeJoinTokenRequest is POST /v1/nodes/join-token/revoke. The token
// travels in the body, never in a URL that logs would keep.
type RevokeJoinTokenRequest struct {
	Token string `json:"token"`
}

// JoinToken is the answer to POST /v1/nodes/join-token.
type JoinToken struct {
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

func (s *Server) clusterCA(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/x-pem-file")
	w.Write(s.d.CACert)
}

// join authenticates by admin certificate or join token, then lets the
// node in.
func (s *Server) join(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	var who string
	err := func() error {
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			c, err := s.d.Users.Authenticate(r.Context(), r.TLS.PeerCertificates)
			if err != nil {
				return err
			}
			if !c.Admin {
				return errs.New(errs.KindForbidden, errs.CodeAdminRequired, "only an administrator (or a join token) may add a node")
			}
			who = c.Name
		} else {
			token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok {
				return errs.New(errs.KindUnauthenticated, errs.CodeCertificateRequired, "joining needs an admin certificate or a join token (Authorization: Bearer)")
			}
			if err := s.d.Cluster.CheckJoinToken(r.Context(), token); err != nil {
				return err
			}
			who = "join-token"
		}
		body, err := readBody(r.Body)
		if err != nil {
			return err
		}
		var req cluster.JoinRequest
		if err := decode(body, &req); err != nil {
			return err
		}
		resp, err := s.d.Cluster.Join(r.Context(), req)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, resp)
		return nil
	}()
	if err != nil {
		status := s.writeError(w, err)
		s.d.Log.Info("api", "method", r.Method, "path", r.URL.Path, "user", who, "status", status, "code", codeOf(err), "took", time.Since(start).String())
		return
	}
	s.d.Log.Info("api", "method", r.Method, "path", r.URL.Path, "user", who, "status", http.StatusOK, "took", time.Since(start).String())
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request, _ volume.Caller) error {
	ns, err := s.d.Cluster.Nodes(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ns)
	return nil
}

func (s *Server) removeNode(w http.ResponseWriter, r *http.Request, _ volume.Caller) error {
	if err := s.d.Cluster.Remove(r.Context(), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) joinToken(w http.ResponseWriter, r *http.Request, _ volume.Caller) error {
	body, err := readBody(r.Body)
	if err != nil {
		return err
	}
	var req JoinTokenRequest
	// The body is optional, and white space alone is no body either.
	if len(bytes.TrimSpace(body)) > 0 {
		if err := decode(body, &req); err != nil {
			return err
		}
	}
	var ttl time.Duration
	if req.TTL != "" {
		if ttl, err = time.ParseDuration(req.TTL); err != nil {
			return errs.Invalid(errs.CodeInvalidRequest, "ttl %q: %v", req.TTL, err)
		}
		// An explicit zero is a ttl out of range, not "none given":
		// NewJoinToken reads 0 as its default and would hand out a token
		// valid for 24 h (`basalt node join-token --ttl 0`).
		if ttl == 0 {
			return errs.Invalid(errs.CodeInvalidRequest, "ttl %q: between 1m and 720h", req.TTL)
		}
	}
	tok, exp, err := s.d.Cluster.NewJoinToken(r.Context(), ttl)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, JoinToken{Token: tok, ExpiresAt: exp})
	return nil
}

func (s *Server) revokeJoinToken(w http.ResponseWriter, r *http.Request, _ volume.Caller) error {
	body, err := readBody(r.Body)
	if err != nil {
		return err
	}
	var req RevokeJoinTokenRequest
	if err := decode(body, &req); err != nil {
		return err
	}
	if req.Token == "" {
		return errs.Invalid(errs.CodeInvalidRequest, "token is required")
	}
	if err := s.d.Cluster.RevokeJoinToken(r.Context(), req.Token); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
