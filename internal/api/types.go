// Package api is basalt's control API: HTTPS with mutual TLS on --api.
//
// types.go holds the wire types shared with the client package; the rest is
// the server: routing, authentication, request decoding and the handlers,
// which only translate between HTTP and the volume and user services.
//
// Every error response is {"error":{"code","message"}} with the HTTP status
// of the error's kind (package errs). GET /healthz, GET /v1/openapi.json
// and GET /v1/cluster/ca need no client certificate, nor does POST
// /v1/nodes/join with a join token; everything else does.
package api

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/basalt-storage/basalt/internal/block"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/size"
)

// Size is a byte count that JSON may carry as a number (bytes) or as a
// string in size syntax ("10GiB").
type Size int64

// UnmarshalJSON accepts 1073741824, 1.073741824e9, "1073741824" and "1GiB".
func (s *Size) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var str string
		if err := json.Unmarshal(b, &str); err != nil {
			return err
		}
		n, err := size.Parse(str)
		if err != nil {
			return errs.Invalid(errs.CodeInvalidSize, "%v", err)
		}
		*s = Size(n)
		return nil
	}
	// A number: whole bytes in any JSON notation (1e3, 1073741824.0),
	// judged exactly from the literal, never through float64.
	n, err := size.ParseJSONNumber(string(b))
	if err != nil {
		return errs.Invalid(errs.CodeInvalidSize, "%v", err)
	}
	*s = Size(n)
	return nil
}

// CreateUserRequest is POST /v1/users.
type CreateUserRequest struct {
	Name  string `json:"name"`
	UID   *int   `json:"uid,omitempty"`
	GID   *int   `json:"gid,omitempty"`
	Admin bool   `json:"admin,omitempty"`
}

// User is the public shape of a user (never its secret).
type User struct {
	Name        string    `json:"name"`
	Admin       bool      `json:"admin"`
	UID         *int      `json:"uid,omitempty"`
	GID         *int      `json:"gid,omitempty"`
	AccessKeyID string    `json:"access_key_id"`
	CreatedAt   time.Time `json:"created_at"`
	// Certificates are the user's client certificates currently valid
	// (issued, not revoked, not expired), oldest first.
	Certificates []Certificate `json:"certificates"`
	// LegacyCertificates: the record was written by a version before
	// certificate lists, and any unexpired certificate issued for it is
	// valid, listed or not, until new credentials are issued (or, for
	// admin, a node's identity is issued or revoked).
	LegacyCertificates bool `json:"legacy_certificates,omitempty"`
}

// Certificate is a client certificate valid for a user (never its key).
type Certificate struct {
	Serial   string    `json:"serial"` // hex
	NotAfter time.Time `json:"not_after"`
	// IssuedFor is "user" (user create, user credentials) or "node NAME"
	// (that node's local admin identity, revoked when it is removed).
	IssuedFor string `json:"issued_for"`
}

// Identity is returned once, by user creation or new credentials:
// everything the user's identity directory holds.
type Identity struct {
	CAPEM           string `json:"ca_pem"`
	CertPEM         string `json:"cert_pem"`
	KeyPEM          string `json:"key_pem"`
	AccessKeyID     string `json:"access_key_id"`
	SecretAccessKey string `json:"secret_access_key"`
	S3Endpoint      string `json:"s3_endpoint,omitempty"`
	S3Region        string `json:"s3_region,omitempty"`
	// S3CABundle: the gateway's certificate is from the cluster CA
	// (ca_pem); s3.env then sets AWS_CA_BUNDLE to the identity's ca.pem.
	S3CABundle bool `json:"s3_ca_bundle,omitempty"`
}

// CreateUserResponse is the answer to POST /v1/users.
type CreateUserResponse struct {
	User     User     `json:"user"`
	Identity Identity `json:"identity"`
}

// CredentialsResponse is the answer to POST /v1/users/{name}/credentials:
// the user with its new certificate and S3 key, and the new identity.
type CredentialsResponse struct {
	User     User     `json:"user"`
	Identity Identity `json:"identity"`
}

// CreateVolumeRequest is POST /v1/volumes.
type CreateVolumeRequest struct {
	Name         string `json:"name,omitempty"`
	Size         Size   `json:"size,omitempty"`
	Type         string `json:"type,omitempty"`
	FromSnapshot string `json:"from_snapshot,omitempty"`
	// FromObject is s3://BUCKET/KEY: a raw image the volume is filled
	// from (the caller's bucket); size defaults to the object's.
	FromObject  string `json:"from_object,omitempty"`
	Multiattach bool   `json:"multiattach,omitempty"`
	ClientToken string `json:"client_token,omitempty"`
}

// ExportSnapshotRequest is POST /v1/snapshots/{id}/export.
type ExportSnapshotRequest struct {
	// To is s3://BUCKET/KEY, in a bucket the caller owns.
	To string `json:"to"`
}

// ExtendVolumeRequest is POST /v1/volumes/{id}/extend.
type ExtendVolumeRequest struct {
	Size Size `json:"size"`
}

// CreateSnapshotRequest is POST /v1/snapshots.
type CreateSnapshotRequest struct {
	Volume      string `json:"volume"`
	Name        string `json:"name,omitempty"`
	ClientToken string `json:"client_token,omitempty"`
}

// AttachRequest is POST /v1/attachments.
type AttachRequest struct {
	Volume string `json:"volume"`
	Host   string `json:"host"`
	Mode   string `json:"mode,omitempty"`
}

// Progress of a running job.
type Progress struct {
	Job     string  `json:"job"` // flatten, repair, scrub, export, import
	Done    int64   `json:"done"`
	Total   int64   `json:"total"`
	Percent float64 `json:"percent"`
	// Phase is the step of a job of several (export: copy, checksum).
	Phase string `json:"phase,omitempty"`
	// Object is the s3:// URL an export writes or an import reads.
	Object string `json:"object,omitempty"`
}

// JobResult is how a volume's or snapshot's last job ended.
type JobResult struct {
	Job        string    `json:"job"`
	Error      string    `json:"error,omitempty"`
	Report     any       `json:"report,omitempty"`
	FinishedAt time.Time `json:"finished_at"`
}

// VolumeType is a named layer stack template (GET /v1/types).
type VolumeType struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Stack       json.RawMessage `json:"stack"`
	BuiltIn     bool            `json:"built_in"`
}

// CreateVolumeTypeRequest is POST /v1/types (admin).
type CreateVolumeTypeRequest struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Stack       json.RawMessage `json:"stack"`
}

// Attachment is a volume's attachment to a host, served over NBD.
type Attachment struct {
	ID        string    `json:"id"`
	VolumeID  string    `json:"volume_id"`
	Host      string    `json:"host"`
	Mode      string    `json:"mode"`
	Status    string    `json:"status"`
	NBDURI    string    `json:"nbd_uri"`
	Export    string    `json:"export"`
	CreatedAt time.Time `json:"created_at"`
}

// Volume is the public shape of a volume (brief §3).
type Volume struct {
	ID             string       `json:"id"`
	Name           string       `json:"name"`
	SizeBytes      int64        `json:"size_bytes"`
	Status         string       `json:"status"`
	StatusMessage  string       `json:"status_message,omitempty"`
	Type           string       `json:"type"`
	Owner          string       `json:"owner"`
	Multiattach    bool         `json:"multiattach"`
	SourceSnapshot string       `json:"source_snapshot"`
	SourceObject   string       `json:"source_object,omitempty"`
	CreatedAt      time.Time    `json:"created_at"`
	Attachments    []Attachment `json:"attachments"`
	// Progress is the running job's (flatten, repair, scrub).
	Progress *Progress  `json:"progress,omitempty"`
	LastJob  *JobResult `json:"last_job,omitempty"`
	// Stack is the live layer tree; only in GET /v1/volumes/{id}.
	Stack *block.Node `json:"stack,omitempty"`
}

// Snapshot is the public shape of a snapshot (brief §3).
type Snapshot struct {
	ID            string    `json:"id"`
	Name          string    `json:"name"`
	VolumeID      string    `json:"volume_id"`
	SizeBytes     int64     `json:"size_bytes"`
	Status        string    `json:"status"`
	StatusMessage string    `json:"status_message,omitempty"`
	Owner         string    `json:"owner"`
	CreatedAt     time.Time `json:"created_at"`
	// Progress is a running export's; LastJob how the last one ended.
	Progress *Progress  `json:"progress,omitempty"`
	LastJob  *JobResult `json:"last_job,omitempty"`
}

// Status is GET /v1/status: this node's view of itself and the cluster.
type Status struct {
	Node     NodeStatus     `json:"node"`
	Metadata MetadataStatus `json:"metadata"`
	Store    StoreStatus    `json:"store"`
}

// NodeStatus describes the answering node.
type NodeStatus struct {
	Name      string    `json:"name"`
	Version   string    `json:"version"`
	ClusterID string    `json:"cluster_id"`
	StartedAt time.Time `json:"started_at"`
	API       string    `json:"api"`
	// NBD is the base URI of this node's NBD server (attachment URIs add
	// the export name).
	NBD string `json:"nbd"`
}

// MetadataStatus describes the metadata store.
type MetadataStatus struct {
	Healthy   bool     `json:"healthy"`
	Error     string   `json:"error,omitempty"`
	Embedded  bool     `json:"embedded"`
	Endpoints []string `json:"endpoints"`
	Version   string   `json:"version,omitempty"`
	Members   int      `json:"members"`
	DBSize    int64    `json:"db_size_bytes"`
	Alarms    []string `json:"alarms,omitempty"`
}

// StoreStatus describes the data root.
type StoreStatus struct {
	Healthy          bool    `json:"healthy"`
	Error            string  `json:"error,omitempty"`
	Path             string  `json:"path"`
	TotalBytes       int64   `json:"total_bytes"`
	FreeBytes        int64   `json:"free_bytes"`
	ProvisionedBytes int64   `json:"provisioned_bytes"`
	LimitBytes       int64   `json:"limit_bytes"`
	Overcommit       float64 `json:"overcommit"`
}

// ErrorBody is every error response: {"error":{"code":...,"message":...}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of ErrorBody.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}
