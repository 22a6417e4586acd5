// Package user manages basalt users: it creates them (a record, a client
// certificate signed by the cluster CA, an S3 key pair), issues them new
// credentials, deletes them, and authenticates client certificates against
// the live records.
//
// Revocation is by record, with no CRL to distribute. A certificate is
// accepted only while a user record with the certificate's CN exists,
// carries the record id the certificate was issued for, and lists the
// certificate's serial (meta.User.Certs). Deleting the record therefore
// revokes every certificate of that user on every node at once; a user
// created again under the same name gets a new id and none of the old
// certificates. New credentials (RotateCredentials) replace the list and
// the S3 keys, keeping the id and so everything the user owns; a node's
// removal drops its local admin identity from the list (RevokeIssuedFor).
//
// Records written before the lists (meta.User.CertsListed false) accept
// any certificate carrying their id, as before, until the first
// certificate issued or revoked under the lists.
//
// Callers: the api package (requests), the server package (admin
// bootstrap, node removal).
package user

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/base32"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"regexp"
	"slices"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/pki"
	"github.com/basalt-storage/basalt/internal/volume"
)

// Admin is the name of the built-in administrator.
const Admin = "admin"

// Service is the user service of one node.
type Service struct {
	meta                 *meta.Store
	ca                   *pki.CA
	byName               *meta.Mirror[*meta.User] // nil: every lookup asks the store
	s3Endpoint, s3Region string
	s3CABundle           bool
	verified             verified // chains found signed by ca (verified.go)
}

// New makes a user service that issues certificates from ca.
func New(m *meta.Store, ca *pki.CA) *Service { return &Service{meta: m, ca: ca} }

// SetMirror lets Authenticate find users in a node-local mirror (by name)
// instead of asking the store on every request; a user the mirror does not
// have is still looked up in the store. Call it before the service answers
// requests.
func (s *Service) SetMirror(byName *meta.Mirror[*meta.User]) { s.byName = byName }

// SetS3 sets the S3 endpoint and region written into new identities.
func (s *Service) SetS3(endpoint, region string) { s.s3Endpoint, s.s3Region = endpoint, region }

// SetS3CABundle says whether new identities point AWS_CA_BUNDLE at their
// ca.pem: the gateway serves HTTPS with a certificate of the cluster CA.
// Call it before the service answers requests.
func (s *Service) SetS3CABundle(on bool) { s.s3CABundle = on }

// NameRE is the user name grammar: POSIX-portable, usable as a CN and in keys.
var NameRE = regexp.MustCompile(`^[a-z_][a-z0-9_.-]{0,31}$`)

// Spec is a validated user creation request.
type Spec struct {
	Name     string
	UID, GID *int
	Admin    bool
	// IssuedFor is what the first certificate is recorded as issued for:
	// meta.CertForUser when empty, meta.CertForNode(name) for the local
	// admin identity of the node that creates the admin user.
	IssuedFor string
}

// Create makes a user and returns its record and a fresh identity. The
// private key is not kept.
func (s *Service) Create(ctx context.Context, sp Spec) (*meta.User, *pki.Identity, error) {
	if !NameRE.MatchString(sp.Name) {
		return nil, nil, errs.Invalid(errs.CodeInvalidName, "user name %q is not valid: 1-32 of a-z, 0-9, '_', '.', '-', starting with a letter or '_'", sp.Name)
	}
	for _, v := range []*int{sp.UID, sp.GID} {
		if v != nil && (*v < 0 || *v > 1<<31-2) {
			return nil, nil, errs.Invalid(errs.CodeInvalidRequest, "uid and gid must be between 0 and 2147483646")
		}
	}
	// Mappings that could never take effect are refused rather than
	// shown: the gateway never gives files to root or root's group (an
	// S3 account's gid 0 means none: the file keeps the gateway's
	// group), and gives a group only with a uid.
	if sp.UID != nil && *sp.UID == 0 {
		return nil, nil, errs.Invalid(errs.CodeInvalidRequest, "uid 0 (root) cannot be mapped: the gateway never gives files to root")
	}
	if sp.GID != nil && *sp.GID == 0 {
		return nil, nil, errs.Invalid(errs.CodeInvalidRequest, "gid 0 (root's group) cannot be mapped: the gateway never gives files to it; leave --gid out to keep the gateway's group")
	}
	if sp.GID != nil && sp.UID == nil {
		return nil, nil, errs.Invalid(errs.CodeInvalidRequest, "a gid is mapped only with a uid: give --uid too")
	}
	u := &meta.User{
		Name: sp.Name, ID: randHex(16), Admin: sp.Admin, UID: sp.UID, GID: sp.GID,
		AccessKeyID: accessKeyID(), SecretKey: secretKey(), CreatedAt: time.Now().UTC(),
	}
	is, err := s.ca.IssueClient(u.Name, u.ID, pki.ClientValidity)
	if err != nil {
		return nil, nil, err
	}
	u.Certs, u.CertsListed = []meta.UserCert{certOf(is, sp.IssuedFor)}, true
	err = s.meta.Update(ctx, func(tx *meta.Tx) error {
		cur, err := tx.User(u.Name)
		if err != nil {
			return err
		}
		if cur != nil {
			return errs.Conflict(errs.CodeUserExists, "user %q already exists", u.Name)
		}
		tx.PutUser(u)
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return u, s.identity(u, is), nil
}

// identity is what a user's identity directory holds: is, and u's S3 keys.
func (s *Service) identity(u *meta.User, is *pki.Issued) *pki.Identity {
	return &pki.Identity{CAPEM: s.ca.CertPEM, CertPEM: is.CertPEM, KeyPEM: is.KeyPEM,
		AccessKeyID: u.AccessKeyID, SecretAccessKey: u.SecretKey, S3Endpoint: s.s3Endpoint, S3Region: s.s3Region,
		S3CABundle: s.s3CABundle}
}

func certOf(is *pki.Issued, issuedFor string) meta.UserCert {
	if issuedFor == "" {
		issuedFor = meta.CertForUser
	}
	return meta.UserCert{Serial: is.Serial, NotAfter: is.NotAfter.UTC(), IssuedFor: issuedFor}
}

// IssueIdentity issues a new certificate for an existing user, with the
// user's S3 keys, and records it as issued for issuedFor (the server gives
// each node a local admin identity this way: meta.CertForNode). It
// replaces, and so revokes, the certificates earlier issued for the same
// issuedFor other than meta.CertForUser: a node holds one local identity —
// except those due for renewal (within pki.RenewBefore of expiry, and
// not expiring with the CA: pki.CA.RenewalDue), which
// stay valid until they expire: a client that loaded the node's identity
// (its connections are checked again while they last) keeps working
// until then. The user's other certificates stay valid. On a record written before
// certificate lists, it starts the list: of the earlier certificates, only
// those recorded (RecordCertificate) stay valid.
func (s *Service) IssueIdentity(ctx context.Context, name, issuedFor string) (*pki.Identity, error) {
	return s.issueIdentity(ctx, name, issuedFor, nil)
}

// RenewNodeIdentity issues node's local admin identity anew, as
// IssueIdentity(Admin, CertForNode(node)) does — but only while the node
// is registered: a node being removed (its identity revoked, its record
// about to go) must not list itself a certificate again. NotFound when
// it is not.
func (s *Service) RenewNodeIdentity(ctx context.Context, node string) (*pki.Identity, error) {
	return s.issueIdentity(ctx, Admin, meta.CertForNode(node), func(tx *meta.Tx) error {
		ok, err := tx.Registered(node)
		if err == nil && !ok {
			err = errs.NotFound("node", node)
		}
		return err
	})
}

// issueIdentity is IssueIdentity, committed only if check (when given)
// passes in the same transaction.
func (s *Service) issueIdentity(ctx context.Context, name, issuedFor string, check func(*meta.Tx) error) (*pki.Identity, error) {
	u, err := s.meta.User(ctx, name)
	if err != nil {
		return nil, err
	}
	is, err := s.ca.IssueClient(u.Name, u.ID, pki.ClientValidity)
	if err != nil {
		return nil, err
	}
	c := certOf(is, issuedFor)
	if err := s.meta.Update(ctx, func(tx *meta.Tx) error {
		if check != nil {
			if err := check(tx); err != nil {
				return err
			}
		}
		cur, err := tx.User(name)
		if err != nil {
			return err
		}
		if cur == nil || cur.ID != u.ID {
			// Deleted (and perhaps created again) since: the
			// certificate carries the old id and is no use.
			return errs.NotFound("user", name)
		}
		cur.PruneCerts(time.Now())
		if c.IssuedFor != meta.CertForUser {
			// Due as a node's check sees it: one that expires with the
			// CA (its last 30 days) is not, and goes like any other.
			cur.Certs = slices.DeleteFunc(cur.Certs, func(x meta.UserCert) bool {
				return x.IssuedFor == c.IssuedFor && !s.ca.RenewalDue(x.NotAfter)
			})
		}
		cur.Certs, cur.CertsListed = append(cur.Certs, c), true
		u = cur
		tx.PutUser(cur)
		return nil
	}); err != nil {
		return nil, err
	}
	return s.identity(u, is), nil
}

// RecordCertificate lists leaf, a certificate issued for user name before
// certificate lists, as issued for issuedFor (a node records its local
// admin identity at start), so that it stays valid once the record starts
// its list. The record stays as it is otherwise: it does nothing for a
// record that lists certificates already (an unlisted certificate is not
// valid then, and must not become so), nor when leaf carries another
// record's id or is listed already.
func (s *Service) RecordCertificate(ctx context.Context, name string, leaf *x509.Certificate, issuedFor string) error {
	serial := pki.SerialHex(leaf.SerialNumber)
	fresh := func(u *meta.User) bool {
		return u.CertsListed || u.ID != pki.UserID(leaf) || u.HasCert(serial)
	}
	if u, err := s.meta.User(ctx, name); err != nil || fresh(u) {
		return err
	}
	c := meta.UserCert{Serial: serial, NotAfter: leaf.NotAfter.UTC(), IssuedFor: issuedFor}
	return s.meta.Update(ctx, func(tx *meta.Tx) error {
		u, err := tx.User(name)
		if err != nil || u == nil || fresh(u) {
			return err
		}
		u.PruneCerts(time.Now())
		if issuedFor != meta.CertForUser {
			u.Certs = slices.DeleteFunc(u.Certs, func(x meta.UserCert) bool { return x.IssuedFor == issuedFor })
		}
		u.Certs = append(u.Certs, c)
		tx.PutUser(u)
		return nil
	})
}

// RotateCredentials issues a new identity for an existing user — a
// certificate and a new S3 key pair — and revokes every earlier
// certificate and the earlier S3 keys of that user, nodes' local admin
// identities included (those hold the admin's S3 keys too; a node writes
// itself a new one at its next start). The record keeps its id, so the
// user keeps its volumes, snapshots and buckets. As with Delete, this node
// refuses the revoked credentials before the call returns; the others
// within their mirror's watch latency.
func (s *Service) RotateCredentials(ctx context.Context, name string) (*meta.User, *pki.Identity, error) {
	u, err := s.meta.User(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	is, err := s.ca.IssueClient(u.Name, u.ID, pki.ClientValidity)
	if err != nil {
		return nil, nil, err
	}
	access, secret := accessKeyID(), secretKey()
	var oldAccess string
	var oldCerts []string // serials
	if err := s.meta.Update(ctx, func(tx *meta.Tx) error {
		cur, err := tx.User(name)
		if err != nil {
			return err
		}
		if cur == nil || cur.ID != u.ID {
			return errs.NotFound("user", name)
		}
		oldAccess, oldCerts = cur.AccessKeyID, nil
		for _, c := range cur.Certs {
			oldCerts = append(oldCerts, c.Serial)
		}
		cur.AccessKeyID, cur.SecretKey = access, secret
		cur.Certs, cur.CertsListed = []meta.UserCert{certOf(is, meta.CertForUser)}, true
		u = cur
		tx.PutUser(cur)
		return nil
	}); err != nil {
		return nil, nil, err
	}
	if err := s.awaitMirror(ctx, name, func(m *meta.User) bool {
		return m.ID != u.ID || m.CertsListed && m.AccessKeyID != oldAccess && !listsAny(m, oldCerts)
	}); err != nil {
		return nil, nil, errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable,
			"new credentials for %s were issued and the earlier ones revoked, but this node's copy of the user records has not caught up within 5s: the new identity was not handed out; ask again for new credentials", name)
	}
	return u, s.identity(u, is), nil
}

// RevokeIssuedFor revokes the certificates of user name recorded as
// issued for issuedFor (a removed node's local admin identity:
// meta.CertForNode) and returns how many it dropped. Other certificates
// stay valid. On a record written before certificate lists, it starts the
// list: of the earlier certificates, only those recorded stay valid.
//
// This node refuses the revoked certificates once the call returns: its
// mirror serves no user record again until it has seen this write
// (meta.Mirror's read-your-writes), and Authenticate asks the store
// meanwhile. Unlike Delete and RotateCredentials it does not wait for the
// mirror as well: a node's removal revokes through it, when the removed
// voter's departure may hold the watches up for seconds, and a removal
// failed for that would leave the node half removed.
func (s *Service) RevokeIssuedFor(ctx context.Context, name, issuedFor string) (int, error) {
	var dropped []string // serials
	if err := s.meta.Update(ctx, func(tx *meta.Tx) error {
		u, err := tx.User(name)
		if err != nil {
			return err
		}
		if u == nil {
			return errs.NotFound("user", name)
		}
		before := len(u.Certs)
		dropped = nil
		u.Certs = slices.DeleteFunc(u.Certs, func(x meta.UserCert) bool {
			if x.IssuedFor == issuedFor {
				dropped = append(dropped, x.Serial)
				return true
			}
			return false
		})
		u.PruneCerts(time.Now())
		if len(u.Certs) != before || !u.CertsListed {
			u.CertsListed = true
			tx.PutUser(u)
		}
		return nil
	}); err != nil {
		return 0, err
	}
	return len(dropped), nil
}

// listsAny reports whether u lists one of serials.
func listsAny(u *meta.User, serials []string) bool {
	for _, sn := range serials {
		if u.HasCert(sn) {
			return true
		}
	}
	return false
}

// RevokeNode revokes the local admin identity issued to node (the
// cluster package calls it when the node is removed).
func (s *Service) RevokeNode(ctx context.Context, node string) error {
	_, err := s.RevokeIssuedFor(ctx, Admin, meta.CertForNode(node))
	if errs.IsCode(err, errs.CodeNotFound) {
		return nil // no admin user (yet): nothing was issued
	}
	return err
}

// awaitMirror waits, briefly, until this node's mirror has user name as
// done wants it (gone counts: deleted since), so that the node's next
// request reads the write just made.
func (s *Service) awaitMirror(ctx context.Context, name string, done func(*meta.User) bool) error {
	if s.byName == nil {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return s.byName.Await(wctx, name, func(u *meta.User, ok bool) bool { return !ok || done(u) })
}

// Get returns a user.
func (s *Service) Get(ctx context.Context, name string) (*meta.User, error) {
	return s.meta.User(ctx, name)
}

// List returns every user.
func (s *Service) List(ctx context.Context) ([]*meta.User, error) { return s.meta.Users(ctx) }

// Delete removes a user, revoking its certificates and keys everywhere, and
// returns the deleted record's id. The user's volumes and snapshots stay,
// visible to admin only: ownership is by user record id, so a user created
// again under the name inherits nothing. (Its attachments are the caller's
// to detach: volume.Service.DetachAllOf.)
func (s *Service) Delete(ctx context.Context, name string) (string, error) {
	if name == Admin {
		return "", errs.Conflict(errs.CodeUserProtected, "the %s user cannot be deleted", Admin)
	}
	var id string
	if err := s.meta.Update(ctx, func(tx *meta.Tx) error {
		u, err := tx.User(name)
		if err != nil {
			return err
		}
		if u == nil {
			return errs.NotFound("user", name)
		}
		id = u.ID
		tx.DeleteUser(u)
		return nil
	}); err != nil {
		return "", err
	}
	// Revoked on this node before the answer: its next request with the
	// deleted user's certificate is refused. Other nodes' mirrors follow
	// within their watch's latency.
	if err := s.awaitMirror(ctx, name, func(u *meta.User) bool { return u.ID != id }); err != nil {
		return id, errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable,
			"user %s deleted, but this node has not seen the deletion yet: its certificates may work here a little longer", name)
	}
	return id, nil
}

// Authenticate checks a client certificate chain presented on a TLS
// connection and returns the caller it identifies.
func (s *Service) Authenticate(ctx context.Context, chain []*x509.Certificate) (volume.Caller, error) {
	if len(chain) == 0 {
		return volume.Caller{}, errs.New(errs.KindUnauthenticated, errs.CodeCertificateRequired,
			"a client certificate is required: pass --identity DIR (or BASALT_IDENTITY)")
	}
	leaf := chain[0]
	if err := s.verify(chain); err != nil {
		var inv x509.CertificateInvalidError
		if errors.As(err, &inv) && inv.Reason == x509.Expired && leaf.CheckSignatureFrom(s.ca.Cert) == nil {
			// x509 reports a certificate whose validity has not begun
			// (this node's clock behind the issuer's) as Expired too;
			// saying it expired on a date to come would mislead.
			if now := time.Now(); now.Before(leaf.NotBefore) {
				return volume.Caller{}, errs.New(errs.KindUnauthenticated, errs.CodeCertificateExpired,
					"client certificate for %q is not valid before %s (this node's clock says %s: is a clock wrong?)",
					leaf.Subject.CommonName, leaf.NotBefore.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
			}
			return volume.Caller{}, errs.New(errs.KindUnauthenticated, errs.CodeCertificateExpired,
				"client certificate for %q expired on %s", leaf.Subject.CommonName, leaf.NotAfter.UTC().Format(time.RFC3339))
		}
		if errors.As(err, &inv) && inv.Reason == x509.IncompatibleUsage && leaf.CheckSignatureFrom(s.ca.Cert) == nil {
			// Signed by the CA for a server only (the S3 gateway's
			// certificate): calling it foreign would send the operator
			// after a CA that is not there.
			return volume.Caller{}, errs.New(errs.KindUnauthenticated, errs.CodeCertificateUntrusted,
				"certificate %q is signed by this cluster's CA but not for client authentication (a server's certificate?): use an identity from basalt user create",
				leaf.Subject.CommonName)
		}
		return volume.Caller{}, errs.New(errs.KindUnauthenticated, errs.CodeCertificateUntrusted,
			"client certificate for %q is not signed by this cluster's CA", leaf.Subject.CommonName)
	}
	// Every certificate the CA issues to a user carries the user record's
	// id. One without it is signed by the CA for something else — a
	// node's certificate, which also authenticates clients (a node is a
	// client of its peers) and whose CN is a host name — and identifies
	// no user, whatever its CN: refused as such, before any lookup.
	if pki.UserID(leaf) == "" {
		return volume.Caller{}, errs.New(errs.KindUnauthenticated, errs.CodeCertificateUntrusted,
			"certificate %q is not a user certificate (it carries no user record id; a node's certificate?): use an identity from basalt user create",
			leaf.Subject.CommonName)
	}
	name := leaf.Subject.CommonName
	// The mirror lags the store by its watch's latency: a certificate
	// revoked a moment ago on another node may authenticate here for that
	// long, as with any cached credential; a user created, or a
	// certificate issued, a moment ago is looked up. The check of a valid
	// certificate against a synced mirror is a map lookup and a scan of a
	// few serials: no round trip.
	u, found := s.lookupMirror(name)
	var err error
	if !found || !accepts(u, leaf) {
		// Not there, another user of that name or a certificate the
		// record does not list: the mirror may not have seen the user
		// deleted and created again, or given new credentials (through
		// another node), whom the certificate was issued to. The store
		// says.
		u, err = s.meta.User(ctx, name)
	}
	if err != nil {
		if errs.IsCode(err, errs.CodeNotFound) {
			return volume.Caller{}, errs.New(errs.KindUnauthenticated, errs.CodeCertificateRevoked,
				"client certificate for %q is revoked: the user no longer exists", name)
		}
		return volume.Caller{}, err
	}
	if pki.UserID(leaf) != u.ID {
		return volume.Caller{}, errs.New(errs.KindUnauthenticated, errs.CodeCertificateRevoked,
			"client certificate for %q is revoked: it was issued to an earlier user of that name", name)
	}
	if !accepts(u, leaf) {
		return volume.Caller{}, errs.New(errs.KindUnauthenticated, errs.CodeCertificateRevoked,
			"client certificate for %q (serial %s) is revoked: it is not among the user's current certificates (new credentials were issued for the user, or the node it was issued to was removed)%s",
			name, pki.SerialHex(leaf.SerialNumber), revokedHint(u))
	}
	return volume.Caller{Name: u.Name, ID: u.ID, Admin: u.Admin}, nil
}

// accepts reports whether record u lets leaf in: issued for u's id, and
// listed — or any of the id's, on a record of a version before lists.
func accepts(u *meta.User, leaf *x509.Certificate) bool {
	if pki.UserID(leaf) != u.ID {
		return false
	}
	return !u.CertsListed || u.HasCert(pki.SerialHex(leaf.SerialNumber))
}

// revokedHint says how to get in again with a revoked certificate.
func revokedHint(u *meta.User) string {
	if u.Name == Admin {
		return "; a running node writes itself a new local admin identity within a minute (a stopped one at its next start)"
	}
	return ""
}

// verify checks that chain leads to the cluster CA and its leaf may
// authenticate clients, once per chain while its leaf is valid.
func (s *Service) verify(chain []*x509.Certificate) error {
	if s.verified.ok(chain, time.Now()) {
		return nil
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: s.ca.Pool(), Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err == nil {
		s.verified.add(chain)
	}
	return err
}

func (s *Service) lookupMirror(name string) (*meta.User, bool) {
	if s.byName == nil {
		return nil, false
	}
	return s.byName.Get(name)
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// accessKeyID looks like AWS's: 20 upper-case base32 characters.
func accessKeyID() string {
	b := make([]byte, 12)
	rand.Read(b)
	return "BK" + base32.StdEncoding.EncodeToString(b)[:18]
}

func secretKey() string {
	b := make([]byte, 30)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
