// Package user manages basalt users: it creates them (a record, a client
// certificate signed by the cluster CA, an S3 key pair), deletes them, and
// authenticates client certificates against the live records.
//
// Revocation is by record: a certificate is accepted only while a user record
// with the certificate's CN exists and carries the record id the certificate
// was issued for. Deleting the record therefore revokes every certificate of
// that user on every node at once, with no CRL to distribute; a user created
// again under the same name gets a new id and none of the old certificates.
//
// Callers: the api package (requests), the server package (admin bootstrap).
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
	u := &meta.User{
		Name: sp.Name, ID: randHex(16), Admin: sp.Admin, UID: sp.UID, GID: sp.GID,
		AccessKeyID: accessKeyID(), SecretKey: secretKey(), CreatedAt: time.Now().UTC(),
	}
	is, err := s.ca.IssueClient(u.Name, u.ID, pki.ClientValidity)
	if err != nil {
		return nil, nil, err
	}
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
	return u, &pki.Identity{CAPEM: s.ca.CertPEM, CertPEM: is.CertPEM, KeyPEM: is.KeyPEM,
		AccessKeyID: u.AccessKeyID, SecretAccessKey: u.SecretKey, S3Endpoint: s.s3Endpoint, S3Region: s.s3Region,
		S3CABundle: s.s3CABundle}, nil
}

// IssueIdentity issues a new certificate for an existing user (used to give a
// node a local admin identity when the admin record already exists).
func (s *Service) IssueIdentity(ctx context.Context, name string) (*pki.Identity, error) {
	u, err := s.meta.User(ctx, name)
	if err != nil {
		return nil, err
	}
	is, err := s.ca.IssueClient(u.Name, u.ID, pki.ClientValidity)
	if err != nil {
		return nil, err
	}
	return &pki.Identity{CAPEM: s.ca.CertPEM, CertPEM: is.CertPEM, KeyPEM: is.KeyPEM,
		AccessKeyID: u.AccessKeyID, SecretAccessKey: u.SecretKey, S3Endpoint: s.s3Endpoint, S3Region: s.s3Region,
		S3CABundle: s.s3CABundle}, nil
}

// Get returns a user.
func (s *Service) Get(ctx context.Context, name string) (*meta.User, error) {
	return s.meta.User(ctx, name)
}

// List returns every user.
func (s *Service) List(ctx context.Context) ([]*meta.User, error) { return s.meta.Users(ctx) }

// Delete removes a user, revoking its certificates and keys everywhere. The
// user's volumes and snapshots stay, visible to admin only: ownership is by
// user record id, so a user created again under the name inherits nothing.
func (s *Service) Delete(ctx context.Context, name string) error {
	if name == Admin {
		return errs.Conflict(errs.CodeUserProtected, "the %s user cannot be deleted", Admin)
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
		return err
	}
	if s.byName != nil {
		// Revoked on this node before the answer: its next request with
		// the deleted user's certificate is refused. Other nodes' mirrors
		// follow within their watch's latency.
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := s.byName.Await(wctx, name, func(u *meta.User, ok bool) bool { return !ok || u.ID != id }); err != nil {
			return errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable,
				"user %s deleted, but this node has not seen the deletion yet: its certificates may work here a little longer", name)
		}
	}
	return nil
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
	// The mirror lags the store by its watch's latency: a user deleted a
	// moment ago on another node may authenticate here for that long, as
	// with any cached credential; a user created a moment ago is looked up.
	u, found := s.lookupMirror(name)
	var err error
	if !found || pki.UserID(leaf) != u.ID {
		// Not there, or another user of that name: the mirror may not
		// have seen the user deleted and created again (through
		// another node) whom the certificate was issued to. The store
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
	return volume.Caller{Name: u.Name, ID: u.ID, Admin: u.Admin}, nil
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
