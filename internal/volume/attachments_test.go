package volume

import (
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// TestAttachHosts: an attachment's host is a host name or an IP address,
// IPv6 included (which starts with neither a letter nor a digit when it
// starts with "::"); anything else is refused before the volume is read.
func TestAttachHosts(t *testing.T) {
	e := newEnv(t)
	s := e.started(Config{})
	ctx := ctxT(t)
	alice := caller("alice")
	v, err := s.CreateVolume(ctx, alice, CreateVolume{Name: "hosts", SizeBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"hv07", "hv07.example.org", "10.0.0.7", "::1", "fe80::1", "2001:db8::7", "::ffff:10.0.0.7", "h_1-a"} {
		a, err := s.Attach(ctx, alice, v.ID, h, meta.ModeRO)
		if err != nil {
			t.Errorf("host %q: %v", h, err)
			continue
		}
		if a.Host != h {
			t.Errorf("host %q recorded as %q", h, a.Host)
		}
		if err := s.Detach(ctx, alice, a.ID); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range []string{"", "-hv", ".hv", "hv 07", "hv/07", "fe80::1%eth0", strings.Repeat("h", 254), "héte"} {
		if _, err := s.Attach(ctx, alice, v.ID, h, meta.ModeRO); !errs.IsCode(err, errs.CodeInvalidRequest) {
			t.Errorf("host %q: %v, want InvalidRequest", h, err)
		}
	}
	cleanupAll(t, s, alice)
}
