package client

import (
	"context"
	"net/url"
	"strconv"

	"github.com/basalt-storage/basalt/internal/api"
)

// long is c without the overall request timeout: export and verify read
// whole files on the server and may take long; ctx bounds them.
func (c *Client) long() *Client {
	h := *c.http
	h.Timeout = 0
	return &Client{base: c.base, http: &h}
}

// ObjectsRoot calls GET /v1/objects/root: where the server keeps the buckets.
func (c *Client) ObjectsRoot(ctx context.Context) (*api.ObjectsRoot, error) {
	var out api.ObjectsRoot
	return &out, c.do(ctx, "GET", "/v1/objects/root", nil, &out)
}

// ObjectPath calls GET /v1/objects/path: the backing file of bucket/key.
func (c *Client) ObjectPath(ctx context.Context, bucket, key string) (*api.ObjectPath, error) {
	var out api.ObjectPath
	q := url.Values{"bucket": {bucket}, "key": {key}}
	return &out, c.do(ctx, "GET", "/v1/objects/path?"+q.Encode(), nil, &out)
}

// ExportObjects calls POST /v1/objects/export: one result per object, in
// order, each with its record or its error.
func (c *Client) ExportObjects(ctx context.Context, objs []api.ObjectRef) ([]api.ObjectResult, error) {
	var out []api.ObjectResult
	return out, c.long().do(ctx, "POST", "/v1/objects/export", api.ObjectsRequest{Objects: objs}, &out)
}

// UnexportObjects calls POST /v1/objects/unexport, like ExportObjects.
func (c *Client) UnexportObjects(ctx context.Context, objs []api.ObjectRef) ([]api.ObjectResult, error) {
	var out []api.ObjectResult
	return out, c.long().do(ctx, "POST", "/v1/objects/unexport", api.ObjectsRequest{Objects: objs}, &out)
}

// VerifyObjects calls GET /v1/objects/verify.
func (c *Client) VerifyObjects(ctx context.Context, bucket string, content, all bool) (*api.VerifyResult, error) {
	var out api.VerifyResult
	q := url.Values{"bucket": {bucket}, "content": {strconv.FormatBool(content)}, "all": {strconv.FormatBool(all)}}
	return &out, c.long().do(ctx, "GET", "/v1/objects/verify?"+q.Encode(), nil, &out)
}
