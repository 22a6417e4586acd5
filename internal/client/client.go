// Package client is the Go client of basalt's control API, used by the CLI
// and the end-to-end tests. It speaks HTTPS with the caller's identity and
// turns error responses back into *errs.Error with the server's code.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/basalt-storage/basalt/internal/api"
	"github.com/basalt-storage/basalt/internal/cluster"
	"github.com/basalt-storage/basalt/internal/errs"
)

// Client-side error codes.
const (
	// CodeUnreachable: no answer came back (or it broke off).
	CodeUnreachable = "Unreachable"
	// CodeBadResponse: an answer came back that is not the API's (a
	// success whose body does not decode, an error without the API's
	// error body), e.g. from a proxy.
	CodeBadResponse = "BadResponse"
	// CodeServerUntrusted: the server's certificate is not one the
	// identity's cluster CA signed for that host — another cluster's
	// node, or not a basalt node at all. Retrying does not help.
	CodeServerUntrusted = "ServerUntrusted"
)

// Client talks to one API endpoint.
type Client struct {
	base string
	http *http.Client
}

// Bounds of a connection's setup, whatever the request's: the calls
// without an overall timeout (long) wait as long as the server works,
// not for ever on a node that takes connections but never answers (one
// stopped or wedged, its listen backlog still accepting). As
// net/http's DefaultTransport.
const (
	dialTimeout         = 30 * time.Second
	tlsHandshakeTimeout = 10 * time.Second
)

// New makes a client for endpoint (https://host:port) with TLS config tc.
func New(endpoint string, tc *tls.Config) *Client {
	return &Client{
		base: strings.TrimRight(endpoint, "/"),
		http: &http.Client{
			Timeout: 60 * time.Second,
			Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true,
				DialContext:         (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
				TLSHandshakeTimeout: tlsHandshakeTimeout},
			// The API never redirects: a redirect is another party's
			// (a proxy, another service on the port). Followed, it
			// turned a DELETE or POST into a GET of its location
			// (net/http does so for 301, 302 and 303), whose 200 was
			// taken for the deletion or creation done. do reports it.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}

// do sends a request and decodes a 2xx JSON answer into out (if non-nil).
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	// Whether the request went out whole: an error after that (a
	// timeout, a connection cut) leaves it possibly carried out.
	var sent atomic.Bool
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(i httptrace.WroteRequestInfo) {
			if i.Err == nil {
				sent.Store(true)
			}
		},
	}))
	resp, err := c.http.Do(req)
	if err != nil {
		var unknownCA x509.UnknownAuthorityError
		var badHost x509.HostnameError
		var invalid x509.CertificateInvalidError
		if errors.As(err, &unknownCA) || errors.As(err, &badHost) || errors.As(err, &invalid) {
			return errs.New(errs.KindUnavailable, CodeServerUntrusted,
				"%s is not a node of the cluster this identity belongs to (its certificate does not verify with the identity's ca.pem): %v; check --endpoint and --identity", c.base, err)
		}
		if sent.Load() {
			// Not "cannot reach": the server has the request, and a
			// create repeated on that word would be done twice.
			msg := "%s %s was sent to %s but no answer came back: %v"
			if method != http.MethodGet && method != http.MethodHead {
				msg += "; it may have been carried out: look before repeating it"
			}
			return errs.New(errs.KindUnavailable, CodeUnreachable, msg, method, path, c.base, err)
		}
		return errs.New(errs.KindUnavailable, CodeUnreachable, "cannot reach %s: %v", c.base, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		// The status came: it says what the server did, even if what
		// it answered is lost. A success repeated on "unreachable"
		// would be done twice.
		msg := "%s %s was answered HTTP %d but the answer broke off: %v"
		if resp.StatusCode < 300 && method != http.MethodGet && method != http.MethodHead {
			msg += "; it was carried out: look before repeating it"
		}
		return errs.New(errs.KindUnavailable, CodeUnreachable, msg, method, path, resp.StatusCode, err)
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return &errs.Error{Kind: errs.KindInternal, Code: CodeBadResponse,
			Message: fmt.Sprintf("%s %s: HTTP %d redirecting to %q, which the API never answers: something else answered at %s; check --endpoint",
				method, path, resp.StatusCode, resp.Header.Get("Location"), c.base)}
	}
	if resp.StatusCode >= 300 {
		var eb api.ErrorBody
		if json.Unmarshal(data, &eb) == nil && eb.Error.Code != "" {
			return &errs.Error{Kind: errs.KindForStatus(resp.StatusCode), Code: eb.Error.Code, Message: eb.Error.Message}
		}
		// Not the API's error body: something else answered (a proxy's
		// page, another service on that port).
		text := strings.TrimSpace(string(data))
		if len(text) > 200 {
			text = text[:200] + "…"
		}
		return &errs.Error{Kind: errs.KindForStatus(resp.StatusCode), Code: CodeBadResponse,
			Message: fmt.Sprintf("%s %s: HTTP %d with an answer that is not the API's: %q", method, path, resp.StatusCode, text)}
	}
	if out != nil && len(data) == 0 && resp.StatusCode != http.StatusNoContent {
		return errs.New(errs.KindInternal, CodeBadResponse, "%s %s: HTTP %d with no answer", method, path, resp.StatusCode)
	}
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			// Typed: untyped errors are the command line's own
			// (cli.printError reports them as UsageError).
			return errs.New(errs.KindInternal, CodeBadResponse, "%s %s: HTTP %d with an answer that is not the API's: %v",
				method, path, resp.StatusCode, err)
		}
	}
	return nil
}

// Health calls GET /healthz.
func (c *Client) Health(ctx context.Context) error { return c.do(ctx, "GET", "/healthz", nil, nil) }

// Status calls GET /v1/status.
func (c *Client) Status(ctx context.Context) (*api.Status, error) {
	var st api.Status
	return &st, c.do(ctx, "GET", "/v1/status", nil, &st)
}

// Defrag calls POST /v1/meta/defrag.
func (c *Client) Defrag(ctx context.Context) error {
	return c.do(ctx, "POST", "/v1/meta/defrag", struct{}{}, nil)
}

// CreateUser creates a user and returns its identity.
func (c *Client) CreateUser(ctx context.Context, r api.CreateUserRequest) (*api.CreateUserResponse, error) {
	var out api.CreateUserResponse
	return &out, c.do(ctx, "POST", "/v1/users", r, &out)
}

// Users lists users.
func (c *Client) Users(ctx context.Context) ([]api.User, error) {
	var out []api.User
	return out, c.do(ctx, "GET", "/v1/users", nil, &out)
}

// User shows a user.
func (c *Client) User(ctx context.Context, name string) (*api.User, error) {
	var out api.User
	return &out, c.do(ctx, "GET", "/v1/users/"+segment(name), nil, &out)
}

// UserCredentials issues new credentials for a user (revoking the earlier
// ones) and returns the new identity.
func (c *Client) UserCredentials(ctx context.Context, name string) (*api.CredentialsResponse, error) {
	var out api.CredentialsResponse
	return &out, c.do(ctx, "POST", "/v1/users/"+segment(name)+"/credentials", nil, &out)
}

// DeleteUser deletes a user.
func (c *Client) DeleteUser(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/users/"+segment(name), nil, nil)
}

// CreateVolume creates a volume.
func (c *Client) CreateVolume(ctx context.Context, r api.CreateVolumeRequest) (*api.Volume, error) {
	var out api.Volume
	return &out, c.do(ctx, "POST", "/v1/volumes", r, &out)
}

// Volumes lists volumes.
func (c *Client) Volumes(ctx context.Context) ([]api.Volume, error) {
	var out []api.Volume
	return out, c.do(ctx, "GET", "/v1/volumes", nil, &out)
}

// Volume shows a volume by id or name.
func (c *Client) Volume(ctx context.Context, ref string) (*api.Volume, error) {
	var out api.Volume
	return &out, c.do(ctx, "GET", "/v1/volumes/"+segment(ref), nil, &out)
}

// DeleteVolume deletes a volume.
func (c *Client) DeleteVolume(ctx context.Context, ref string) error {
	return c.do(ctx, "DELETE", "/v1/volumes/"+segment(ref), nil, nil)
}

// ExtendVolume grows a volume to sizeBytes.
func (c *Client) ExtendVolume(ctx context.Context, ref string, sizeBytes int64) (*api.Volume, error) {
	var out api.Volume
	return &out, c.do(ctx, "POST", "/v1/volumes/"+segment(ref)+"/extend", api.ExtendVolumeRequest{Size: api.Size(sizeBytes)}, &out)
}

// VolumeJob starts a job on a volume: flatten, repair or scrub.
func (c *Client) VolumeJob(ctx context.Context, ref, job string) (*api.Volume, error) {
	var out api.Volume
	return &out, c.do(ctx, "POST", "/v1/volumes/"+segment(ref)+"/"+segment(job), nil, &out)
}

// VolumeTypes lists the volume types.
func (c *Client) VolumeTypes(ctx context.Context) ([]api.VolumeType, error) {
	var out []api.VolumeType
	return out, c.do(ctx, "GET", "/v1/types", nil, &out)
}

// VolumeType returns one volume type.
func (c *Client) VolumeType(ctx context.Context, name string) (*api.VolumeType, error) {
	var out api.VolumeType
	return &out, c.do(ctx, "GET", "/v1/types/"+segment(name), nil, &out)
}

// CreateVolumeType creates a volume type (admin).
func (c *Client) CreateVolumeType(ctx context.Context, r api.CreateVolumeTypeRequest) (*api.VolumeType, error) {
	var out api.VolumeType
	return &out, c.do(ctx, "POST", "/v1/types", r, &out)
}

// DeleteVolumeType deletes a volume type (admin).
func (c *Client) DeleteVolumeType(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/types/"+segment(name), nil, nil)
}

// CreateSnapshot snapshots a volume.
func (c *Client) CreateSnapshot(ctx context.Context, r api.CreateSnapshotRequest) (*api.Snapshot, error) {
	var out api.Snapshot
	return &out, c.do(ctx, "POST", "/v1/snapshots", r, &out)
}

// Snapshots lists snapshots, optionally of one volume.
func (c *Client) Snapshots(ctx context.Context, volume string) ([]api.Snapshot, error) {
	var out []api.Snapshot
	p := "/v1/snapshots"
	if volume != "" {
		p += "?volume=" + url.QueryEscape(volume)
	}
	return out, c.do(ctx, "GET", p, nil, &out)
}

// Snapshot shows a snapshot by id or name.
func (c *Client) Snapshot(ctx context.Context, ref string) (*api.Snapshot, error) {
	var out api.Snapshot
	return &out, c.do(ctx, "GET", "/v1/snapshots/"+segment(ref), nil, &out)
}

// Nodes lists the cluster's nodes.
func (c *Client) Nodes(ctx context.Context) ([]cluster.NodeInfo, error) {
	var out []cluster.NodeInfo
	return out, c.do(ctx, "GET", "/v1/nodes", nil, &out)
}

// RemoveNode takes a node out of the cluster.
func (c *Client) RemoveNode(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/nodes/"+segment(name), nil, nil)
}

// JoinToken issues a join token.
func (c *Client) JoinToken(ctx context.Context, r api.JoinTokenRequest) (*api.JoinToken, error) {
	var out api.JoinToken
	return &out, c.do(ctx, "POST", "/v1/nodes/join-token", r, &out)
}

// RevokeJoinToken makes a join token unusable before it expires.
func (c *Client) RevokeJoinToken(ctx context.Context, token string) error {
	return c.do(ctx, "POST", "/v1/nodes/join-token/revoke", api.RevokeJoinTokenRequest{Token: token}, nil)
}

// ExportSnapshot starts writing a snapshot into an object.
func (c *Client) ExportSnapshot(ctx context.Context, ref string, r api.ExportSnapshotRequest) (*api.Snapshot, error) {
	var out api.Snapshot
	return &out, c.do(ctx, "POST", "/v1/snapshots/"+segment(ref)+"/export", r, &out)
}

// DeleteSnapshot deletes a snapshot.
func (c *Client) DeleteSnapshot(ctx context.Context, ref string) error {
	return c.do(ctx, "DELETE", "/v1/snapshots/"+segment(ref), nil, nil)
}

// Attach attaches a volume to a host.
func (c *Client) Attach(ctx context.Context, r api.AttachRequest) (*api.Attachment, error) {
	var out api.Attachment
	return &out, c.do(ctx, "POST", "/v1/attachments", r, &out)
}

// Attachments lists attachments, optionally of one volume.
func (c *Client) Attachments(ctx context.Context, volume string) ([]api.Attachment, error) {
	var out []api.Attachment
	p := "/v1/attachments"
	if volume != "" {
		p += "?volume=" + url.QueryEscape(volume)
	}
	return out, c.do(ctx, "GET", p, nil, &out)
}

// Attachment shows an attachment.
func (c *Client) Attachment(ctx context.Context, id string) (*api.Attachment, error) {
	var out api.Attachment
	return &out, c.do(ctx, "GET", "/v1/attachments/"+segment(id), nil, &out)
}

// Detach removes an attachment.
func (c *Client) Detach(ctx context.Context, id string) error {
	return c.do(ctx, "DELETE", "/v1/attachments/"+segment(id), nil, nil)
}

// segment escapes s as one path segment. "." and ".." are escaped too
// (url.PathEscape leaves dots alone): sent as they are, the path would be
// cleaned — by the server's router, which redirects, or by a proxy — into
// another route, and `volume show ..` would report that "GET /v1" does not
// exist instead of that no volume is named "..".
func segment(s string) string {
	if s == "." || s == ".." {
		return strings.ReplaceAll(s, ".", "%2E")
	}
	return url.PathEscape(s)
}
