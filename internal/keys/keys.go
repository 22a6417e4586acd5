// Package keys wraps volume data keys with the cluster's key-encryption
// key, so that a data key is only ever stored encrypted (block.Keys).
//
// The cluster key is 32 random bytes kept in the metadata store (etcd,
// next to the CA: whoever can read etcd can read volumes, as with the CA
// key). Wrapping is AES-256-GCM with a random nonce:
//
//	wrapped = version 0x01 | nonce (12) | GCM(ciphertext+tag)
//
// the additional data binds the purpose ("basalt data key"), so a wrapped
// key cannot be passed off as another kind of secret.
package keys

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
)

const (
	version = 0x01
	// Size is the length of a cluster key.
	Size = 32
)

var aad = []byte("basalt data key")

// ErrWrongKey means a wrapped key was not made with this cluster's key
// (or was altered).
var ErrWrongKey = errors.New("keys: the data key was not wrapped by this cluster's key, or it was altered")

// Wrapper implements block.Keys with one cluster key.
type Wrapper struct{ aead cipher.AEAD }

// New returns a wrapper for a 32-byte cluster key.
func New(clusterKey []byte) (*Wrapper, error) {
	if len(clusterKey) != Size {
		return nil, fmt.Errorf("keys: cluster key is %d bytes, want %d", len(clusterKey), Size)
	}
	b, err := aes.NewCipher(clusterKey)
	if err != nil {
		return nil, err
	}
	a, err := cipher.NewGCM(b)
	if err != nil {
		return nil, err
	}
	return &Wrapper{aead: a}, nil
}

// Generate returns a new random cluster key.
func Generate() []byte {
	k := make([]byte, Size)
	rand.Read(k)
	return k
}

// Wrap encrypts a data key.
func (w *Wrapper) Wrap(key []byte) ([]byte, error) {
	out := make([]byte, 1+w.aead.NonceSize(), 1+w.aead.NonceSize()+len(key)+w.aead.Overhead())
	out[0] = version
	rand.Read(out[1:])
	return w.aead.Seal(out, out[1:], key, aad), nil
}

// Unwrap decrypts a wrapped data key.
func (w *Wrapper) Unwrap(wrapped []byte) ([]byte, error) {
	n := w.aead.NonceSize()
	if len(wrapped) < 1+n+w.aead.Overhead() || wrapped[0] != version {
		return nil, ErrWrongKey
	}
	key, err := w.aead.Open(nil, wrapped[1:1+n], wrapped[1+n:], aad)
	if err != nil {
		return nil, ErrWrongKey
	}
	return key, nil
}
