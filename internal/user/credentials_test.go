package user

import (
	"context"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/meta/metatest"
	"github.com/basalt-storage/basalt/internal/pki"
)

// mirrored is a user service whose Authenticate reads a mirror of its
// own store connection, as a node's does.
func mirrored(t *testing.T) (*Service, *meta.Store, *meta.Mirror[*meta.User]) {
	t.Helper()
	env := metatest.Shared(t)
	m := env.Connect(t)
	s := New(m, env.CA)
	mctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	byName := m.MirrorUsersByName(mctx)
	s.SetMirror(byName)
	return s, m, byName
}

func serialOf(t *testing.T, id *pki.Identity) string {
	t.Helper()
	return pki.SerialHex(chain(t, id.CertPEM)[0].SerialNumber)
}

// TestRotateCredentials: new credentials for a user revoke every
// earlier certificate and the earlier S3 keys on the node that answered
// before it answered, keep the record (and so everything the user owns),
// and the new identity works.
func TestRotateCredentials(t *testing.T) {
	s, m, _ := mirrored(t)
	ctx := ctxT(t)
	name := uniq("rot")
	u, first, err := s.Create(ctx, Spec{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.IssueIdentity(ctx, name, meta.CertForNode(uniq("n")))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []*pki.Identity{first, second} {
		if _, err := s.Authenticate(ctx, chain(t, id.CertPEM)); err != nil {
			t.Fatalf("before the rotation: %v", err)
		}
	}
	keys := m.MirrorUsersByAccessKey(ctx)
	if err := keys.Await(ctx, u.AccessKeyID, func(_ *meta.User, ok bool) bool { return ok }); err != nil {
		t.Fatal(err)
	}

	u2, fresh, err := s.RotateCredentials(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if u2.ID != u.ID || u2.Name != name || !u2.CreatedAt.Equal(u.CreatedAt) {
		t.Fatalf("rotation changed the record's identity: %+v, was %+v", u2, u)
	}
	if fresh.AccessKeyID == u.AccessKeyID || fresh.SecretAccessKey == u.SecretKey || fresh.AccessKeyID != u2.AccessKeyID {
		t.Fatalf("rotation kept the S3 keys: %s", fresh.AccessKeyID)
	}
	// At once, on this node: the earlier certificates are refused.
	for i, id := range []*pki.Identity{first, second} {
		_, err := s.Authenticate(ctx, chain(t, id.CertPEM))
		wantAuthError(t, err, errs.CodeCertificateRevoked)
		t.Logf("certificate %d: %v", i, err)
	}
	c, err := s.Authenticate(ctx, chain(t, fresh.CertPEM))
	if err != nil || c.ID != u.ID || c.Name != name {
		t.Fatalf("new certificate: %+v, %v", c, err)
	}
	// The old S3 key resolves to nobody, the new one to the user, in the
	// store and in this node's access-key mirror.
	if _, err := m.UserByAccessKey(ctx, u.AccessKeyID); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("old access key: %v, want NotFound", err)
	}
	if got, err := m.UserByAccessKey(ctx, fresh.AccessKeyID); err != nil || got.ID != u.ID || got.SecretKey != fresh.SecretAccessKey {
		t.Fatalf("new access key: %+v, %v", got, err)
	}
	if _, ok := keys.Get(u.AccessKeyID); ok {
		t.Fatal("the access-key mirror still serves the old key")
	}
	// The record lists the one certificate now valid.
	rec, err := s.Get(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if !rec.CertsListed || len(rec.Certs) != 1 || rec.Certs[0].Serial != serialOf(t, fresh) || rec.Certs[0].IssuedFor != meta.CertForUser {
		t.Fatalf("certificates after rotation: listed %v %+v", rec.CertsListed, rec.Certs)
	}
	if _, _, err := s.RotateCredentials(ctx, uniq("nobody")); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("rotate a missing user: %v, want NotFound", err)
	}
}

// TestRevokeIssuedFor: a node's certificate is revoked on
// its own; the user's other certificates stay valid. A node issued a new
// identity replaces its earlier one.
func TestRevokeIssuedFor(t *testing.T) {
	s, _, _ := mirrored(t)
	ctx := ctxT(t)
	name := uniq("adm")
	n1, n2 := uniq("n1-"), uniq("n2-")
	_, id1, err := s.Create(ctx, Spec{Name: name, Admin: true, IssuedFor: meta.CertForNode(n1)})
	if err != nil {
		t.Fatal(err)
	}
	id2, err := s.IssueIdentity(ctx, name, meta.CertForNode(n2))
	if err != nil {
		t.Fatal(err)
	}
	id2b, err := s.IssueIdentity(ctx, name, meta.CertForNode(n2))
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Authenticate(ctx, chain(t, id2.CertPEM))
	wantAuthError(t, err, errs.CodeCertificateRevoked) // replaced by id2b
	for _, id := range []*pki.Identity{id1, id2b} {
		if _, err := s.Authenticate(ctx, chain(t, id.CertPEM)); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.RevokeIssuedFor(ctx, name, meta.CertForNode(n2))
	if err != nil || n != 1 {
		t.Fatalf("revoke %s: %d, %v", n2, n, err)
	}
	_, err = s.Authenticate(ctx, chain(t, id2b.CertPEM))
	wantAuthError(t, err, errs.CodeCertificateRevoked)
	if _, err := s.Authenticate(ctx, chain(t, id1.CertPEM)); err != nil {
		t.Fatalf("another node's certificate after %s's was revoked: %v", n2, err)
	}
	if n, err := s.RevokeIssuedFor(ctx, name, meta.CertForNode(n2)); err != nil || n != 0 {
		t.Fatalf("revoke again: %d, %v", n, err)
	}
	if _, err := s.RevokeIssuedFor(ctx, uniq("nobody"), meta.CertForNode(n2)); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("revoke for a missing user: %v", err)
	}
}

// putLegacy writes a user record as versions before certificate lists
// did: no list; any certificate carrying the record id is valid.
func putLegacy(t *testing.T, m *meta.Store, name string) *meta.User {
	t.Helper()
	u := &meta.User{Name: name, ID: randHex(16), AccessKeyID: accessKeyID(), SecretKey: secretKey(), CreatedAt: time.Now().UTC()}
	if err := m.Update(ctxT(t), func(tx *meta.Tx) error { tx.PutUser(u); return nil }); err != nil {
		t.Fatal(err)
	}
	return u
}

// TestLegacyRecordAcceptsByID: a record written before certificate lists
// keeps accepting every certificate issued for its id, however often a
// certificate is recorded in it, until the first issuance under the new
// scheme (here: new credentials), which revokes the unlisted ones.
func TestLegacyRecordAcceptsByID(t *testing.T) {
	s, m, _ := mirrored(t)
	ctx := ctxT(t)
	_, ca := openTestStore(t)
	name := uniq("old")
	u := putLegacy(t, m, name)
	old1, err := ca.IssueClient(name, u.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	old2, err := ca.IssueClient(name, u.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, is := range []*pki.Issued{old1, old2} {
		if _, err := s.Authenticate(ctx, chain(t, is.CertPEM)); err != nil {
			t.Fatalf("legacy record: %v", err)
		}
	}
	// A node recording the certificate it holds keeps the record legacy.
	if err := s.RecordCertificate(ctx, name, chain(t, old1.CertPEM)[0], meta.CertForNode("n1")); err != nil {
		t.Fatal(err)
	}
	rec, _ := s.Get(ctx, name)
	if rec.CertsListed || len(rec.Certs) != 1 || rec.Certs[0].Serial != pki.SerialHex(chain(t, old1.CertPEM)[0].SerialNumber) {
		t.Fatalf("after recording a certificate: listed %v %+v", rec.CertsListed, rec.Certs)
	}
	for _, is := range []*pki.Issued{old1, old2} {
		if _, err := s.Authenticate(ctx, chain(t, is.CertPEM)); err != nil {
			t.Fatalf("legacy record with a recorded certificate: %v", err)
		}
	}
	_, fresh, err := s.RotateCredentials(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	for _, is := range []*pki.Issued{old1, old2} {
		_, err := s.Authenticate(ctx, chain(t, is.CertPEM))
		wantAuthError(t, err, errs.CodeCertificateRevoked)
	}
	if _, err := s.Authenticate(ctx, chain(t, fresh.CertPEM)); err != nil {
		t.Fatal(err)
	}
}

// TestLegacyRecordListStartsAtNodeIssuance: a node identity issued for a legacy
// record starts its list; the certificates nodes recorded stay valid,
// any other earlier one (a removed node's, say) does not.
func TestLegacyRecordListStartsAtNodeIssuance(t *testing.T) {
	s, m, _ := mirrored(t)
	ctx := ctxT(t)
	_, ca := openTestStore(t)
	name := uniq("oldadm")
	u := putLegacy(t, m, name)
	kept, _ := ca.IssueClient(name, u.ID, time.Hour)
	gone, _ := ca.IssueClient(name, u.ID, time.Hour)
	if err := s.RecordCertificate(ctx, name, chain(t, kept.CertPEM)[0], meta.CertForNode("a")); err != nil {
		t.Fatal(err)
	}
	id, err := s.IssueIdentity(ctx, name, meta.CertForNode("c"))
	if err != nil {
		t.Fatal(err)
	}
	for _, pem := range [][]byte{kept.CertPEM, id.CertPEM} {
		if _, err := s.Authenticate(ctx, chain(t, pem)); err != nil {
			t.Fatal(err)
		}
	}
	_, err = s.Authenticate(ctx, chain(t, gone.CertPEM))
	wantAuthError(t, err, errs.CodeCertificateRevoked)
}

// TestExpiredCertificatesPruned: entries past their NotAfter leave the list at
// the next write.
func TestExpiredCertificatesPruned(t *testing.T) {
	s, m, _ := mirrored(t)
	ctx := ctxT(t)
	name := uniq("prune")
	u := putLegacy(t, m, name)
	u.CertsListed = true
	u.Certs = []meta.UserCert{{Serial: "0abc", NotAfter: time.Now().Add(-time.Hour), IssuedFor: meta.CertForUser}}
	if err := m.Update(ctx, func(tx *meta.Tx) error { tx.PutUser(u); return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.IssueIdentity(ctx, name, meta.CertForNode("x")); err != nil {
		t.Fatal(err)
	}
	rec, _ := s.Get(ctx, name)
	if len(rec.Certs) != 1 || rec.Certs[0].IssuedFor != meta.CertForNode("x") {
		t.Fatalf("certificates: %+v", rec.Certs)
	}
}

// TestRotationThroughLaggingMirror: credentials rotated through
// another node authenticate here at once although this node's mirror
// still has the record without the new certificate (the store says);
// once the mirror has it, a listed certificate costs no store read.
func TestRotationThroughLaggingMirror(t *testing.T) {
	ctx := ctxT(t)
	lag := newLaggingNode(t, "lag")
	a, b, kv, mirror, name, u, release := lag.a, lag.b, lag.kv, lag.mirror, lag.name, lag.user, lag.release
	_, fresh, err := a.RotateCredentials(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := mirror.Get(name); !ok || got.AccessKeyID != u.AccessKeyID {
		t.Fatal("setup: b's mirror is not behind")
	}
	if c, err := b.Authenticate(ctx, chain(t, fresh.CertPEM)); err != nil || c.ID != u.ID {
		t.Fatalf("new certificate on the lagging node: %+v, %v", c, err)
	}
	release()
	if err := mirror.Await(ctx, name, func(got *meta.User, ok bool) bool { return ok && got.AccessKeyID == fresh.AccessKeyID }); err != nil {
		t.Fatal(err)
	}
	// The store stalled: a listed certificate is checked against the
	// mirror alone.
	unstall := kv.Stall()
	defer unstall()
	sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
	defer scancel()
	if _, err := b.Authenticate(sctx, chain(t, fresh.CertPEM)); err != nil {
		t.Fatalf("authenticate with the store stalled: %v", err)
	}
}

// TestRevocationSeenAtOnce: a revocation this node made is seen by
// its Authenticate at once, though its mirror's watch is held up (a
// voter leaving): the mirror serves no user record until it has caught
// up with the node's own write, and the store says revoked.
func TestRevocationSeenAtOnce(t *testing.T) {
	env := metatest.Shared(t)
	ctx := ctxT(t)
	m := env.Connect(t)
	watches := metatest.BreakableWatches(m)
	s := New(m, env.CA)
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	mirror := m.MirrorUsersByName(mctx)
	s.SetMirror(mirror)
	name, node := uniq("held"), uniq("n")
	if _, _, err := s.Create(ctx, Spec{Name: name, Admin: true}); err != nil {
		t.Fatal(err)
	}
	id, err := s.IssueIdentity(ctx, name, meta.CertForNode(node))
	if err != nil {
		t.Fatal(err)
	}
	serial := serialOf(t, id)
	if err := mirror.Await(ctx, name, func(u *meta.User, ok bool) bool { return ok && u.HasCert(serial) }); err != nil {
		t.Fatal(err)
	}
	release, held := watches.BreakAndHold()
	defer release()
	select {
	case <-held: // the mirror has listed again after the break
	case <-ctx.Done():
		t.Fatal("the mirror did not list again after its watch broke")
	}
	start := time.Now()
	if n, err := s.RevokeIssuedFor(ctx, name, meta.CertForNode(node)); err != nil || n != 1 {
		t.Fatalf("revoke: %d, %v", n, err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("revoke waited %v for the held mirror", took)
	}
	_, err = s.Authenticate(ctx, chain(t, id.CertPEM))
	wantAuthError(t, err, errs.CodeCertificateRevoked)
}

// TestNodeIdentityDueForRenewalStays: a node's new identity replaces an
// earlier one far from expiry, but not one due for renewal (within
// pki.RenewBefore of it): that one stays valid until it expires, so a
// client that loaded it — its connections checked again while they last
// — is not cut off the moment the node renews.
func TestNodeIdentityDueForRenewalStays(t *testing.T) {
	s, m, _ := mirrored(t)
	ctx := ctxT(t)
	name := uniq("adm")
	node := meta.CertForNode(uniq("n"))
	_, old, err := s.Create(ctx, Spec{Name: name, Admin: true, IssuedFor: node})
	if err != nil {
		t.Fatal(err)
	}
	serial := pki.SerialHex(chain(t, old.CertPEM)[0].SerialNumber)
	// Its record as it stands 20 days before the certificate expires.
	if err := m.Update(ctx, func(tx *meta.Tx) error {
		u, err := tx.User(name)
		if err != nil {
			return err
		}
		for i := range u.Certs {
			if u.Certs[i].Serial == serial {
				u.Certs[i].NotAfter = time.Now().Add(20 * 24 * time.Hour)
			}
		}
		tx.PutUser(u)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	renewed, err := s.IssueIdentity(ctx, name, node)
	if err != nil {
		t.Fatal(err)
	}
	for what, id := range map[string]*pki.Identity{"the renewed identity": renewed, "the one due for renewal": old} {
		if _, err := s.Authenticate(ctx, chain(t, id.CertPEM)); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	// Another identity for the node replaces the renewed one, not yet due.
	if _, err := s.IssueIdentity(ctx, name, node); err != nil {
		t.Fatal(err)
	}
	_, err = s.Authenticate(ctx, chain(t, renewed.CertPEM))
	wantAuthError(t, err, errs.CodeCertificateRevoked)
}
