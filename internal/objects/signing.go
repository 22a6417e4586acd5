package objects

import (
	"crypto/hmac"
	"crypto/sha256"
	"sync"

	"github.com/versity/versitygw/auth"
)

// SigV4 signing keys, derived once per secret and day instead of once per
// request.
//
// A SigV4 signature is an HMAC-SHA256 under a signing key that is itself
// four chained HMACs of the secret: over the request's date (a day), its
// region, its service and "aws4_request". The key is the same for every
// request a client signs that day, so IAM keeps it: versitygw asks IAM
// for it (auth.SigningKeyProvider) and then only computes the request's
// own HMAC. The account behind the access key is still resolved on every
// request, so deleting a user or rotating a key revokes at once; a cached
// key is found only by the secret it was derived from.

// maxSigningKeys bounds the cache: a key per (secret, day, region,
// service) in use. When it is full it starts again empty.
const maxSigningKeys = 4096

// signingKeys caches derived keys; its zero value is ready.
type signingKeys struct {
	mu   sync.Mutex
	keys map[signingScope][]byte
}

// signingScope is what a derived key depends on.
type signingScope struct{ secret, date, region, service string }

// get returns the signing key of scope s, deriving it on a miss. The
// returned slice is shared: callers only read it.
func (c *signingKeys) get(s signingScope) []byte {
	c.mu.Lock()
	k, ok := c.keys[s]
	c.mu.Unlock()
	if ok {
		return k
	}
	k = deriveSigningKey(s)
	c.mu.Lock()
	if c.keys == nil || len(c.keys) >= maxSigningKeys {
		c.keys = make(map[signingScope][]byte)
	}
	c.keys[s] = k
	c.mu.Unlock()
	return k
}

// deriveSigningKey is SigV4's key derivation: HMAC-SHA256 chained from
// "AWS4"+secret over the date (YYYYMMDD), the region, the service and the
// terminator "aws4_request".
func deriveSigningKey(s signingScope) []byte {
	k := []byte("AWS4" + s.secret)
	for _, part := range []string{s.date, s.region, s.service, "aws4_request"} {
		m := hmac.New(sha256.New, k)
		m.Write([]byte(part))
		k = m.Sum(nil)
	}
	return k
}

// DeriveSigningKey implements auth.SigningKeyProvider: the account of
// access and the signing key of its secret for the request's scope.
// basalt issues no temporary credentials, so a session token is refused
// as versitygw refuses it.
func (i *IAM) DeriveSigningKey(access, sessionToken, date, region, service string) ([]byte, auth.Account, error) {
	if sessionToken != "" {
		return nil, auth.Account{}, auth.ErrInvalidSessionToken
	}
	acct, err := i.GetUserAccount(access)
	if err != nil {
		return nil, auth.Account{}, err
	}
	return i.keys.get(signingScope{secret: acct.Secret, date: date, region: region, service: service}), acct, nil
}

var _ auth.SigningKeyProvider = (*IAM)(nil)
