//go:build !amd64 || purego

package md5lanes

// Without a kernel New returns crypto/md5's hash; blocks8 is never called.
func blocks8(s *[4][8]uint32, p *[8]*byte, stride *[8]uint64, n int) {
	panic("md5lanes: no kernel on this platform")
}

const haveKernel = false

func kernels() map[string]func(s *[4][8]uint32, p *[8]*byte, stride *[8]uint64, n int) {
	return nil
}
