package user

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/meta/metatest"
	"github.com/basalt-storage/basalt/internal/pki"
)

func intp(n int) *int { return &n }

func TestCreate(t *testing.T) {
	s := newService(t)
	ctx := ctxT(t)
	name := uniq("alice")
	u, id, err := s.Create(ctx, Spec{Name: name, UID: intp(1000), GID: intp(100)})
	if err != nil {
		t.Fatal(err)
	}
	if u.Name != name || u.Admin || *u.UID != 1000 || *u.GID != 100 || len(u.ID) != 32 || u.CreatedAt.IsZero() {
		t.Fatalf("record %+v", u)
	}
	if !regexp.MustCompile(`^[A-Z2-7]{20}$`).MatchString(u.AccessKeyID) || len(u.SecretKey) < 30 {
		t.Fatalf("S3 keys %q / %d chars", u.AccessKeyID, len(u.SecretKey))
	}
	// The identity: the cluster CA, a client certificate naming the user
	// and the record id, a matching key, the S3 keys.
	_, ca := openTestStore(t)
	if string(id.CAPEM) != string(ca.CertPEM) {
		t.Fatal("identity carries another CA")
	}
	if _, err := tls.X509KeyPair(id.CertPEM, id.KeyPEM); err != nil {
		t.Fatalf("identity key does not match its certificate: %v", err)
	}
	leaf := chain(t, id.CertPEM)[0]
	if leaf.Subject.CommonName != name || pki.UserID(leaf) != u.ID {
		t.Fatalf("certificate subject %v", leaf.Subject)
	}
	if time.Until(leaf.NotAfter) < 300*24*time.Hour {
		t.Fatalf("user certificate valid only until %v", leaf.NotAfter)
	}
	if id.AccessKeyID != u.AccessKeyID || id.SecretAccessKey != u.SecretKey {
		t.Fatal("identity S3 keys differ from the record")
	}
	// Stored, listed, and found by access key.
	got, err := s.Get(ctx, name)
	if err != nil || got.ID != u.ID {
		t.Fatalf("Get: %+v, %v", got, err)
	}
	all, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, x := range all {
		found = found || x.Name == name
	}
	if !found {
		t.Fatal("List misses the user")
	}
	m, _ := openTestStore(t)
	if byKey, err := m.UserByAccessKey(ctx, u.AccessKeyID); err != nil || byKey.Name != name {
		t.Fatalf("UserByAccessKey: %v", err)
	}
	// The identity authenticates as the user.
	c, err := s.Authenticate(ctx, chain(t, id.CertPEM))
	if err != nil {
		t.Fatal(err)
	}
	if c.Name != name || c.ID != u.ID || c.Admin {
		t.Fatalf("caller %+v", c)
	}
	// A second create of the name: UserExists, and the first record stays.
	_, _, err = s.Create(ctx, Spec{Name: name})
	if e, ok := errs.As(err); !ok || e.Code != errs.CodeUserExists || e.Kind != errs.KindConflict {
		t.Fatalf("duplicate create: %v", err)
	}
	if got, _ := s.Get(ctx, name); got.ID != u.ID {
		t.Fatal("duplicate create replaced the record")
	}
	// Two users get different keys.
	u2, _, err := s.Create(ctx, Spec{Name: uniq("bob")})
	if err != nil {
		t.Fatal(err)
	}
	if u2.AccessKeyID == u.AccessKeyID || u2.SecretKey == u.SecretKey || u2.ID == u.ID {
		t.Fatal("two users share keys or ids")
	}
}

func TestCreateAdmin(t *testing.T) {
	s := newService(t)
	ctx := ctxT(t)
	name := uniq("root")
	_, id, err := s.Create(ctx, Spec{Name: name, Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Authenticate(ctx, chain(t, id.CertPEM))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Admin || c.Name != name {
		t.Fatalf("admin caller %+v", c)
	}
}

func TestCreateValidation(t *testing.T) {
	s := newService(t)
	ctx := ctxT(t)
	for _, name := range []string{
		"", "Alice", "1abc", "-x", ".x", "a/b", "a b", "a\x00", "ä", "a:b", "a@b",
		"a" + strings.Repeat("b", 32), // 33 characters
	} {
		_, _, err := s.Create(ctx, Spec{Name: name})
		if e, ok := errs.As(err); !ok || e.Code != errs.CodeInvalidName || e.Kind != errs.KindInvalid {
			t.Errorf("name %q: %v, want InvalidName", name, err)
		}
		if name != "" {
			if _, err := s.Get(ctx, name); !errs.IsCode(err, errs.CodeNotFound) {
				t.Errorf("invalid name %q was stored (%v)", name, err)
			}
		}
	}
	for _, name := range []string{"_" + uniq("svc"), uniq("a.b-c_d"), "z" + strings.Repeat("9", 31)} {
		if _, _, err := s.Create(ctx, Spec{Name: name}); err != nil && !errs.IsCode(err, errs.CodeUserExists) {
			t.Errorf("valid name %q: %v", name, err)
		}
	}
	for _, c := range []struct{ uid, gid *int }{
		{intp(-1), nil}, {intp(1), intp(-1)}, {intp(1 << 31), nil}, {intp(1), intp(1<<31 - 1)},
		{intp(0), nil}, {intp(0), intp(0)}, {intp(1), intp(0)}, // root (and its group) is never given files: no mapping to it
		{nil, intp(1000)}, // a group is given only with a uid
	} {
		_, _, err := s.Create(ctx, Spec{Name: uniq("ids"), UID: c.uid, GID: c.gid})
		if !errs.IsCode(err, errs.CodeInvalidRequest) {
			t.Errorf("uid %v gid %v: %v, want InvalidRequest", c.uid, c.gid, err)
		}
	}
	if _, _, err := s.Create(ctx, Spec{Name: uniq("ids"), UID: intp(1), GID: intp(1<<31 - 2)}); err != nil {
		t.Errorf("uid 1, gid 2147483646: %v", err)
	}
	if _, _, err := s.Create(ctx, Spec{Name: uniq("ids"), UID: intp(1<<31 - 2), GID: intp(1)}); err != nil {
		t.Errorf("uid 2147483646, gid 1: %v", err)
	}
}

// TestCreateRace: concurrent creates of one name; exactly one wins.
func TestCreateRace(t *testing.T) {
	s := newService(t)
	ctx := ctxT(t)
	name := uniq("race")
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins, exists := 0, 0
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, err := s.Create(ctx, Spec{Name: name})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
			case errs.IsCode(err, errs.CodeUserExists):
				exists++
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if wins != 1 || exists != 5 {
		t.Fatalf("%d creates won, %d saw UserExists; want 1 and 5", wins, exists)
	}
}

func TestDelete(t *testing.T) {
	s := newService(t)
	ctx := ctxT(t)
	name := uniq("carol")
	u, _, err := s.Create(ctx, Spec{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Delete(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, name); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("deleted user: %v", err)
	}
	m, _ := openTestStore(t)
	if _, err := m.UserByAccessKey(ctx, u.AccessKeyID); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("deleted user's S3 key still resolves: %v", err)
	}
	if _, err := s.Delete(ctx, name); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("second delete: %v, want NotFound", err)
	}
	// The built-in admin cannot be deleted (whether or not it exists here).
	_, err = s.Delete(ctx, Admin)
	if e, ok := errs.As(err); !ok || e.Kind == errs.KindInternal || e.Kind == errs.KindNotFound {
		t.Fatalf("delete admin: %v, want a refusal", err)
	}
}

func TestIssueIdentity(t *testing.T) {
	s := newService(t)
	ctx := ctxT(t)
	name := uniq("dave")
	u, first, err := s.Create(ctx, Spec{Name: name, Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.IssueIdentity(ctx, name, meta.CertForNode(uniq("node")))
	if err != nil {
		t.Fatal(err)
	}
	if string(again.CertPEM) == string(first.CertPEM) || string(again.KeyPEM) == string(first.KeyPEM) {
		t.Fatal("IssueIdentity returned the old certificate")
	}
	if again.AccessKeyID != u.AccessKeyID || again.SecretAccessKey != u.SecretKey {
		t.Fatal("IssueIdentity changed the S3 keys")
	}
	// Both certificates are valid: issuing does not revoke.
	for _, id := range []*pki.Identity{first, again} {
		c, err := s.Authenticate(ctx, chain(t, id.CertPEM))
		if err != nil || c.ID != u.ID || !c.Admin {
			t.Fatalf("Authenticate: %+v, %v", c, err)
		}
	}
	if _, err := s.IssueIdentity(ctx, uniq("nobody"), meta.CertForUser); !errs.IsCode(err, errs.CodeNotFound) {
		t.Fatalf("IssueIdentity for a missing user: %v", err)
	}
}

func TestAuthenticate(t *testing.T) {
	s := newService(t)
	ctx := ctxT(t)
	_, ca := openTestStore(t)
	name := uniq("erin")
	u, id, err := s.Create(ctx, Spec{Name: name})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("valid", func(t *testing.T) {
		c, err := s.Authenticate(ctx, chain(t, id.CertPEM))
		if err != nil || c.Name != name || c.ID != u.ID || c.Admin {
			t.Fatalf("%+v, %v", c, err)
		}
	})
	t.Run("no certificate", func(t *testing.T) {
		_, err := s.Authenticate(ctx, nil)
		wantAuthError(t, err, errs.CodeCertificateRequired)
		_, err = s.Authenticate(ctx, []*x509.Certificate{})
		wantAuthError(t, err, errs.CodeCertificateRequired)
	})
	t.Run("expired", func(t *testing.T) {
		is, err := ca.IssueClientWindow(name, u.ID, time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Authenticate(ctx, chain(t, is.CertPEM))
		wantAuthError(t, err, errs.CodeCertificateExpired)
		if !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "expired") {
			t.Errorf("message %q", err)
		}
	})
	t.Run("foreign CA", func(t *testing.T) {
		other, err := pki.NewCA()
		if err != nil {
			t.Fatal(err)
		}
		// Same name and even the same record id: still untrusted.
		is, err := other.IssueClient(name, u.ID, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Authenticate(ctx, chain(t, is.CertPEM))
		wantAuthError(t, err, errs.CodeCertificateUntrusted)
		// Presenting our CA as an "intermediate" changes nothing.
		_, err = s.Authenticate(ctx, append(chain(t, is.CertPEM), other.Cert))
		wantAuthError(t, err, errs.CodeCertificateUntrusted)
	})
	t.Run("server certificate", func(t *testing.T) {
		// A node certificate from the same CA whose CN is a user name does
		// not carry the user's record id: refused.
		dir := t.TempDir()
		cert, err := ca.ServerCertificate(dir, []string{name})
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(cert.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Authenticate(ctx, []*x509.Certificate{leaf}); err == nil {
			t.Fatal("a node certificate authenticated as a user")
		}
	})
	t.Run("wrong record id", func(t *testing.T) {
		is, err := ca.IssueClient(name, "0000", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Authenticate(ctx, chain(t, is.CertPEM))
		wantAuthError(t, err, errs.CodeCertificateRevoked)
	})
	t.Run("unknown user", func(t *testing.T) {
		is, err := ca.IssueClient(uniq("ghost"), "1234", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Authenticate(ctx, chain(t, is.CertPEM))
		wantAuthError(t, err, errs.CodeCertificateRevoked)
	})
}

// TestRevocation: deleting a user revokes its certificates at once; the
// name created again does not inherit them; the new user's own
// certificates work.
func TestRevocation(t *testing.T) {
	s := newService(t)
	ctx := ctxT(t)
	name := uniq("frank")
	_, oldID, err := s.Create(ctx, Spec{Name: name, Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, chain(t, oldID.CertPEM)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Delete(ctx, name); err != nil {
		t.Fatal(err)
	}
	_, err = s.Authenticate(ctx, chain(t, oldID.CertPEM))
	wantAuthError(t, err, errs.CodeCertificateRevoked)

	u2, newID, err := s.Create(ctx, Spec{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Authenticate(ctx, chain(t, oldID.CertPEM))
	wantAuthError(t, err, errs.CodeCertificateRevoked)
	c, err := s.Authenticate(ctx, chain(t, newID.CertPEM))
	if err != nil {
		t.Fatal(err)
	}
	if c.ID != u2.ID || c.Admin {
		t.Fatalf("re-created user authenticates as %+v (the old user was admin, the new one is not)", c)
	}
}

func TestAuthenticateMetadataDown(t *testing.T) {
	s := newService(t)
	name := uniq("gina")
	_, id, err := s.Create(ctxT(t), Spec{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// With the metadata unreachable (here: a canceled request), the answer
	// is a retryable MetadataUnavailable, never "revoked".
	_, err = s.Authenticate(ctx, chain(t, id.CertPEM))
	if errs.IsCode(err, errs.CodeCertificateRevoked) || err == nil {
		t.Fatalf("Authenticate with metadata down: %v", err)
	}
	if !errs.IsCode(err, errs.CodeMetadataUnavailable) {
		t.Fatalf("Authenticate with metadata down: %v, want MetadataUnavailable", err)
	}
}

// TestAuthenticateThroughLaggingMirror: a node's mirror of the users
// lags behind writes made through other nodes. A user deleted and created
// again under the same name through node a authenticates with the new
// certificate on node b at once: a mirrored record of another id is
// checked against the store, not taken for a revocation.
func TestAuthenticateThroughLaggingMirror(t *testing.T) {
	ctx := ctxT(t)
	lag := newLaggingNode(t, "hana")
	defer lag.release()
	a, b, mirror, name, old := lag.a, lag.b, lag.mirror, lag.name, lag.user
	if _, err := a.Delete(ctx, name); err != nil {
		t.Fatal(err)
	}
	u2, id2, err := a.Create(ctx, Spec{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	if u, ok := mirror.Get(name); !ok || u.ID != old.ID {
		t.Fatal("setup: b's mirror is not behind")
	}
	c, err := b.Authenticate(ctx, chain(t, id2.CertPEM))
	if err != nil {
		t.Fatalf("new user's certificate on the lagging node: %v", err)
	}
	if c.ID != u2.ID {
		t.Fatalf("authenticated as %s, want %s", c.ID, u2.ID)
	}
}

// laggingNode is a user created through node a, and node b whose mirror
// of the users had the user and then stopped following: its watch broken
// and held, after the relist that follows a break (a second later) is
// done. Its store connection (kv) can be stalled.
type laggingNode struct {
	a, b    *Service
	kv      *metatest.KV
	mirror  *meta.Mirror[*meta.User]
	name    string
	user    *meta.User
	release func() // lets the mirror follow again
}

func newLaggingNode(t *testing.T, prefix string) *laggingNode {
	t.Helper()
	env := metatest.Shared(t)
	ctx := ctxT(t)
	l := &laggingNode{a: New(env.Meta, env.CA), name: uniq(prefix)}
	mb := env.Connect(t)
	watches := metatest.BreakableWatches(mb)
	l.kv = metatest.StallableKV(mb)
	l.b = New(mb, env.CA)
	mctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	l.mirror = mb.MirrorUsersByName(mctx)
	l.b.SetMirror(l.mirror)
	var err error
	if l.user, _, err = l.a.Create(ctx, Spec{Name: l.name}); err != nil {
		t.Fatal(err)
	}
	// Await returns at once while the mirror has not listed yet; Get
	// answers only once it has, and has seen the user (else a first
	// list made before the create, its watch then held, would never).
	for {
		if _, ok := l.mirror.Get(l.name); ok {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the mirror never had the user")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var held <-chan struct{}
	l.release, held = watches.BreakAndHold()
	select {
	case <-held: // the mirror has listed again after the break
	case <-ctx.Done():
		t.Fatal("the mirror did not list again after its watch broke")
	}
	return l
}
