package meta

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
)

// SchemaVersion is the record schema this binary writes. Readers accept any
// version up to it; a later issue that changes a record bumps it and adds a
// migration in decode.
const SchemaVersion = 1

// Status values shared by volumes and snapshots.
const (
	StatusCreating  = "creating"
	StatusAvailable = "available"
	StatusInUse     = "in-use"
	StatusExtending = "extending"
	StatusDeleting  = "deleting"
	StatusError     = "error"
)

// User is a basalt user: the subject of client certificates and S3 keys.
type User struct {
	Schema int    `json:"schema"`
	Name   string `json:"name"`
	// ID is random per record: certificates carry it, so a user deleted and
	// created again does not inherit the old certificates.
	ID          string    `json:"id"`
	Admin       bool      `json:"admin"`
	UID         *int      `json:"uid,omitempty"`
	GID         *int      `json:"gid,omitempty"`
	AccessKeyID string    `json:"access_key_id"`
	SecretKey   string    `json:"secret_access_key"`
	CreatedAt   time.Time `json:"created_at"`
	// Certs lists the client certificates issued for the user and not
	// revoked (expired ones are pruned at the next write). While
	// CertsListed, a certificate is valid only if its serial is listed
	// here; new credentials replace the list, a node's removal drops the
	// node's entry.
	//
	// Records written before the lists (CertsListed false) accept any
	// certificate carrying ID, as they did; Certs may already hold the
	// certificates nodes recorded (user.Service.RecordCertificate). The
	// first certificate issued or revoked under the lists sets
	// CertsListed, and from then on every unlisted certificate is
	// refused.
	Certs       []UserCert `json:"certs,omitempty"`
	CertsListed bool       `json:"certs_listed,omitempty"`
}

// UserCert is a client certificate issued for a user.
type UserCert struct {
	Serial    string    `json:"serial"` // hex, pki.SerialHex
	NotAfter  time.Time `json:"not_after"`
	IssuedFor string    `json:"issued_for"` // CertForUser, or CertForNode(name)
}

// CertForUser marks a certificate issued to the user (user create, new
// credentials).
const CertForUser = "user"

// CertForNode marks the certificate of node name's local admin identity
// (DATA/identities/admin): revoked when the node is removed.
func CertForNode(name string) string { return "node " + name }

// HasCert reports whether the certificate of serial is listed. Linear:
// a user has a handful (one, plus one per node for admin).
func (u *User) HasCert(serial string) bool {
	for i := range u.Certs {
		if u.Certs[i].Serial == serial {
			return true
		}
	}
	return false
}

// PruneCerts drops the listed certificates expired at now.
func (u *User) PruneCerts(now time.Time) {
	u.Certs = slices.DeleteFunc(u.Certs, func(c UserCert) bool { return now.After(c.NotAfter) })
}

// Job is a long-running piece of a workflow (a copy), persisted so that a
// restarted node resumes it and a reader can show progress.
type Job struct {
	Kind      string    `json:"kind"`  // JobFlatten, JobRepair, JobScrub, JobExport, JobImport, JobCollapse
	Node      string    `json:"node"`  // the node running it
	Done      int64     `json:"done"`  // progress, in units of the job's total
	Total     int64     `json:"total"` // 0 while unknown
	StartedAt time.Time `json:"started_at"`
	// Phase names the step a job of several is in (export: "copy",
	// then "checksum").
	Phase string `json:"phase,omitempty"`
	// Object is the s3://bucket/key an export writes or an import reads.
	Object string `json:"object,omitempty"`
	// BucketCreated is when Object's bucket was created, as the call that
	// asked for the job found it: the job uses that bucket only, not one
	// deleted and created again under its name (by another user) before
	// the job ran or resumed. Zero in jobs of older versions: unchecked.
	BucketCreated time.Time `json:"bucket_created,omitzero"`
	// RequestedBy is the node that accepted the call when another node
	// (Node, the volume's writer) runs the job.
	RequestedBy string `json:"requested_by,omitempty"`
}

// Job kinds: long operations on a volume's layer stack.
const (
	JobFlatten = "flatten" // copy every chunk of the chain into the top
	JobRepair  = "repair"  // resynchronise failed legs of mirror/parity layers
	JobScrub   = "scrub"   // verify every block (checksum layers)
	JobExport  = "export"  // write a snapshot into an object (on the snapshot)
	JobImport  = "import"  // fill a new volume from an object (status creating)
	// JobCollapse merges the top's parent, a deleted snapshot's image
	// nothing else needs, with the top (cow.Layer.Collapse). Started by
	// the system, not by users.
	JobCollapse = "collapse"
)

// Failure is the API error a failed workflow met, recorded with its
// failure when the caller can act on it (errs.Public: a full or read-only
// store, a size the file system cannot hold): a call that waited for the
// workflow on another node answers with it, as the node that ran it would
// have — not with an internal error around the bare message.
type Failure struct {
	Code    string `json:"code"`
	Status  int    `json:"status"` // the HTTP status (errs.Kind.Status)
	Message string `json:"message"`
}

// FailureOf is the Failure to record for a workflow's cause, or nil when
// the cause is an internal error.
func FailureOf(cause error) *Failure {
	e, ok := errs.Public(cause)
	if !ok {
		return nil
	}
	return &Failure{Code: e.Code, Status: e.Kind.Status(), Message: e.Message}
}

// Err is the error a call answers for f, about what (e.g. "volume
// vol-…"); nil f: an internal error with the recorded message.
func (f *Failure) Err(what, message string) error {
	if f == nil {
		return errs.New(errs.KindInternal, errs.CodeInternal, "%s: %s", what, message)
	}
	return errs.New(errs.KindForStatus(f.Status), f.Code, "%s: %s", what, f.Message)
}

// Volume is a block volume record.
type Volume struct {
	Schema        int    `json:"schema"`
	ID            string `json:"id"`
	Name          string `json:"name,omitempty"`
	Owner         string `json:"owner"`
	OwnerID       string `json:"owner_id"`
	SizeBytes     int64  `json:"size_bytes"`
	Status        string `json:"status"`
	StatusMessage string `json:"status_message,omitempty"`
	// Failure is the error a caller is told of the failure StatusMessage
	// describes, when it was one the caller can act on (Failure).
	Failure *Failure `json:"failure,omitempty"`
	Type    string   `json:"type"`
	// Stack is the layer stack the volume was created with: its type's
	// template, fixed at creation (a type changed later does not change
	// existing volumes).
	Stack          json.RawMessage `json:"stack_spec,omitempty"`
	Multiattach    bool            `json:"multiattach"`
	SourceSnapshot string          `json:"source_snapshot,omitempty"`
	// SourceObject is the s3://bucket/key the volume was made from.
	SourceObject string `json:"source_object,omitempty"`
	ClientToken  string `json:"client_token,omitempty"`
	// TokenParams fingerprints the create request made with ClientToken, so
	// that a replay with other parameters is refused.
	TokenParams string    `json:"token_params,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	UpdatedAt   time.Time `json:"updated_at"`
	// TargetSize is the size an extend is moving to (status extending).
	TargetSize int64 `json:"target_size,omitempty"`
	// Node is the node driving the current transition (extending, deleting).
	Node string `json:"node,omitempty"`
	// RequestedBy is the node that accepted an extend that Node, the
	// volume's writer, runs for it.
	RequestedBy string `json:"requested_by,omitempty"`
	Job         *Job   `json:"job,omitempty"`
	// Snapshotting lists snapshots being taken of this volume; while
	// non-empty the volume may not be extended or deleted.
	Snapshotting []string `json:"snapshotting,omitempty"`
	// LastJob is the outcome of the last finished job (a scrub's report).
	LastJob *JobResult `json:"last_job,omitempty"`
	// Attachments lists the ids of the volume's attachments; the volume is
	// in-use exactly while it is non-empty.
	Attachments []string `json:"attachments,omitempty"`
}

// Attachment modes.
const (
	ModeRW = "rw"
	ModeRO = "ro"
)

// Attachment grants one host access to a volume over NBD.
type Attachment struct {
	Schema   int    `json:"schema"`
	ID       string `json:"id"`
	VolumeID string `json:"volume_id"`
	Owner    string `json:"owner"`
	OwnerID  string `json:"owner_id"`
	Host     string `json:"host"`
	Mode     string `json:"mode"`
	// Export is the NBD export name: an unguessable secret; whoever knows
	// it can use the attachment.
	Export    string    `json:"export"`
	CreatedAt time.Time `json:"created_at"`
}

// Snapshot is a point-in-time copy of a volume.
type Snapshot struct {
	Schema        int    `json:"schema"`
	ID            string `json:"id"`
	Name          string `json:"name,omitempty"`
	Owner         string `json:"owner"`
	OwnerID       string `json:"owner_id"`
	VolumeID      string `json:"volume_id"`
	SizeBytes     int64  `json:"size_bytes"`
	Status        string `json:"status"`
	StatusMessage string `json:"status_message,omitempty"`
	// Failure is the error a caller is told of the failure StatusMessage
	// describes, when it was one the caller can act on (Failure).
	Failure     *Failure `json:"failure,omitempty"`
	ClientToken string   `json:"client_token,omitempty"`
	TokenParams string   `json:"token_params,omitempty"`
	// TokenHolder is the user whose ClientToken it is: the caller of the
	// create, who may be an admin snapshotting another user's volume. Empty
	// in records made before it was kept: the owner's.
	TokenHolder string    `json:"token_holder,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	UpdatedAt   time.Time `json:"updated_at"`
	Node        string    `json:"node,omitempty"`
	// Image is the frozen copy-on-write image holding the snapshot's data.
	Image string `json:"image,omitempty"`
	// Stack is the source volume's stack: clones are made with it.
	Stack json.RawMessage `json:"stack_spec,omitempty"`
	Type  string          `json:"type,omitempty"`
	// RequestedBy is the node that accepted the create call when another
	// node (Node, the volume's writer) takes the snapshot.
	RequestedBy string `json:"requested_by,omitempty"`
	// Job is a running export; while set the snapshot may not be
	// deleted. LastJob is how the last one ended.
	Job     *Job       `json:"job,omitempty"`
	LastJob *JobResult `json:"last_job,omitempty"`
}

// TokenUser returns the id of the user whose idempotency token the
// snapshot's ClientToken is.
func (sn *Snapshot) TokenUser() string {
	if sn.TokenHolder != "" {
		return sn.TokenHolder
	}
	return sn.OwnerID
}

// JobResult is how a job ended.
type JobResult struct {
	Kind     string    `json:"kind"`
	Error    string    `json:"error,omitempty"`
	Report   any       `json:"report,omitempty"`
	Finished time.Time `json:"finished_at"`
}

// VolumeType is a named layer stack template created by an admin (the
// built-in types live in code).
type VolumeType struct {
	Schema      int             `json:"schema"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Stack       json.RawMessage `json:"stack"`
	CreatedAt   time.Time       `json:"created_at"`
}

// Bucket is an S3 bucket's record (internal/objects keeps the objects,
// as files under STORE/buckets/<name>/).
type Bucket struct {
	Schema int    `json:"schema"`
	Name   string `json:"name"`
	// OwnerID is the owning user's record ID (a user deleted and created
	// again does not inherit buckets); Owner its name when created.
	OwnerID     string    `json:"owner_id"`
	Owner       string    `json:"owner"`
	OwnerAccess string    `json:"owner_access"`
	Versioning  string    `json:"versioning,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
}

// Cluster identifies the metadata cluster.
type Cluster struct {
	Schema    int       `json:"schema"`
	ID        string    `json:"id"`
	CreatedAt time.Time `json:"created_at"`
	// Voters is how many voting etcd members the cluster grows to as
	// nodes join (odd: 3 tolerates one failure, 5 two); nodes beyond run
	// as etcd clients. 0 in records older than the field: 3.
	Voters int `json:"voters,omitempty"`
	// External: the metadata lives in an etcd cluster basalt does not
	// run (--meta-endpoints); no node joins it or becomes a member.
	External bool `json:"external,omitempty"`
}

// OwnedBy lets callers treat the records users own alike.
func (v *Volume) OwnedBy() string     { return v.OwnerID }
func (s *Snapshot) OwnedBy() string   { return s.OwnerID }
func (a *Attachment) OwnedBy() string { return a.OwnerID }

type versioned interface{ schema() int }

func (u *User) schema() int       { return u.Schema }
func (v *Volume) schema() int     { return v.Schema }
func (s *Snapshot) schema() int   { return s.Schema }
func (c *Cluster) schema() int    { return c.Schema }
func (a *Attachment) schema() int { return a.Schema }
func (t *VolumeType) schema() int { return t.Schema }
func (b *Bucket) schema() int     { return b.Schema }

func encode(r any) string {
	b, err := json.Marshal(r)
	if err != nil {
		panic(fmt.Sprintf("meta: encode %T: %v", r, err)) // records are plain structs
	}
	return string(b)
}

// decode parses a record and checks its schema version.
func decode[T versioned](key string, data []byte, r T) error {
	if err := json.Unmarshal(data, r); err != nil {
		return fmt.Errorf("meta: corrupt record %s: %w", key, err)
	}
	if v := r.schema(); v > SchemaVersion {
		return fmt.Errorf("meta: record %s has schema %d, newer than this binary's %d; upgrade basalt", key, v, SchemaVersion)
	}
	// Version 0 does not exist on disk; 1 is current. Migrations go here.
	return nil
}
