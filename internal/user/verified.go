package user

import (
	"crypto/x509"
	"strings"
	"sync"
	"time"
)

// verified remembers the client certificate chains Authenticate has found
// signed by the cluster CA, so that the requests of one identity do not
// each pay a signature check: the API's TLS handshake only requests the
// client certificate (Authenticate checks it, to answer with a precise
// error), and HTTP/2 sends every request of a connection with the same
// chain. An ECDSA P-256 check costs 100–200 µs on the hosts measured, as
// much as the rest of a GET of a volume record.
//
// Only successes are kept, and a kept chain is believed only within its
// leaf's validity window: the answer depends on nothing else (the CA does
// not change while the process runs). Revocation is not a property of the
// chain; Authenticate checks the user on every request, as before.
type verified struct {
	mu sync.Mutex
	m  map[string]time.Time // chain (DER, concatenated) → leaf's NotAfter
}

// maxVerified bounds the memory: when full, the cache starts over (a
// cluster has far fewer identities in use at once).
const maxVerified = 4096

func chainKey(chain []*x509.Certificate) string {
	var b strings.Builder
	for _, c := range chain {
		b.Write(c.Raw)
	}
	return b.String()
}

// ok reports whether the chain was verified before and its leaf is valid
// at now.
func (v *verified) ok(chain []*x509.Certificate, now time.Time) bool {
	key := chainKey(chain)
	v.mu.Lock()
	notAfter, found := v.m[key]
	v.mu.Unlock()
	return found && !now.Before(chain[0].NotBefore) && !now.After(notAfter)
}

// add records a chain just verified.
func (v *verified) add(chain []*x509.Certificate) {
	key := chainKey(chain)
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil || len(v.m) >= maxVerified {
		v.m = make(map[string]time.Time)
	}
	v.m[key] = chain[0].NotAfter
}
