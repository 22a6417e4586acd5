//go:build !amd64

package crypt

// newKernel: no assembly kernel on this architecture; xtsCipher uses the
// standard library's AES a block at a time.
func newKernel([]byte) *kernel { return nil }

func (k *kernel) encrypt(dst, src []byte, tweak *[16]byte) { panic("crypt: no XTS kernel") }
func (k *kernel) decrypt(dst, src []byte, tweak *[16]byte) { panic("crypt: no XTS kernel") }
